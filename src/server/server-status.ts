/**
 * The server's status document (domain/status-document.ts) from where its
 * state lives: one page of the agents of a StatusIndex (status-index.ts:
 * each tenant's registry and resumable tunnels, at most a second old), and
 * the refusals of the last minutes kept beside kanal_refusals_total. Only the
 * page's agents are read and rendered, and the page stops at
 * MAX_STATUS_PAGE_BYTES, so an answer's size and its time on the event loop
 * do not grow with the number of agents (docs/limits.md).
 */
import type { Tenant } from './tenants/tenant.js';
import type { KanalMetrics } from '../domain/metrics.js';
import type { AgentBackend } from './routing/agent-backend.js';
import type { Tunnel } from '../tunnel/tunnel.js';
import { addCounts, type RecentCounts } from '../domain/recent-events.js';
import { MAX_STATUS_PAGE_BYTES, type StatusQuery } from '../domain/status-query.js';
import { decodeCursor, encodeCursor, startAfter, type IndexedAgent } from './status-index.js';
import {
  statusHeader,
  tunnelStatus,
  type AgentStatus,
  type AgentTunnelStatus,
  type ServerStatusDocument,
} from '../domain/status-document.js';

export interface ServerStatusSources {
  serverID: string;
  serverCount: number;
  state: string;
  /** Every tenant served (the one unnamed tenant without --tenants-config). */
  tenants: readonly Tenant[];
  /** Every tenant's agents, sorted (StatusIndex.agents()). */
  agents: readonly IndexedAgent[];
  /** With --tenants-config: their names are listed. */
  named: boolean;
  /** The process's metrics: listener-level refusals, and a one-cluster tenant's own (the same object). */
  metrics: KanalMetrics;
  build: { version: string; commit: string };
}

/** The document of one page, or what is wrong with the query (a cursor this server did not make). */
export function serverStatus(
  src: ServerStatusSources,
  query: StatusQuery,
  now = Date.now(),
  maxPageBytes = MAX_STATUS_PAGE_BYTES,
): ServerStatusDocument | { error: string } {
  let from = 0;
  if (query.after !== undefined) {
    const cursor = decodeCursor(query.after);
    if (!cursor) return { error: 'after= is not a cursor of this server: pass the "next" of a page as it was given' };
    from = startAfter(src.agents, cursor);
  }
  const matches = (a: IndexedAgent): boolean =>
    (query.tenant === undefined || a.tenant === query.tenant) && (query.agent === undefined || a.agentID === query.agent);
  let matched = 0;
  for (const a of src.agents) if (matches(a)) matched++;

  const recent: RecentCounts = src.metrics.recent.counts();
  for (const t of src.tenants) if (t.metrics !== src.metrics) addCounts(recent, t.metrics.recent.counts());
  const agents: AgentStatus[] = [];
  let bytes = 0;
  let last: IndexedAgent | undefined;
  let more = false;
  for (let i = from; i < src.agents.length; i++) {
    const a = src.agents[i];
    if (!matches(a)) continue;
    if (agents.length >= query.limit || (agents.length > 0 && bytes >= maxPageBytes)) {
      more = true;
      break;
    }
    const shown = agentStatus(a, now);
    // Measured as it is served (indented, docs/operations.md): the page's bound is on what is written.
    bytes += JSON.stringify(shown, null, 2).length;
    agents.push(shown);
    last = a;
  }
  return {
    ...statusHeader(src.build, recent, now),
    component: 'server',
    server: {
      serverID: src.serverID,
      serverCount: src.serverCount,
      state: src.state,
      ...(src.named ? { tenants: src.tenants.map((t) => t.name ?? '') } : {}),
    },
    agents,
    page: {
      filter: {
        ...(query.tenant !== undefined ? { tenant: query.tenant } : {}),
        ...(query.agent !== undefined ? { agent: query.agent } : {}),
      },
      limit: query.limit,
      matched,
      ...(more && last ? { next: encodeCursor(last) } : {}),
    },
  };
}

/** One agent: its credential and agentID, with its tunnels up and detached. */
function agentStatus(a: IndexedAgent, now: number): AgentStatus {
  const out: AgentStatus = {
    agentID: a.agentID,
    credential: a.credential.subject,
    ...(a.tenant !== undefined ? { tenant: a.tenant } : {}),
    identifiers: { hosts: [], ipv4: [], ipv6: [], defaultRoute: false },
    tunnels: [],
  };
  for (const b of a.backends) {
    const { hosts, ipv4, ipv6, defaultRoute } = b.identifiers;
    out.identifiers = { hosts, ipv4, ipv6, defaultRoute };
    out.tunnels.push(backendTunnel(b, now));
  }
  for (const d of a.detached) out.tunnels.push(agentTunnel(d, '', now));
  return out;
}

function backendTunnel(b: AgentBackend, now: number): AgentTunnelStatus {
  const lastAnswer = b.liveness?.lastAnsweredAt;
  return {
    ...agentTunnel(b.tunnel, b.peer, now),
    ...(b.liveness
      ? {
          liveness: {
            quiet: b.liveness.quiet,
            ...(lastAnswer !== undefined ? { lastAnswerSecondsAgo: Math.max(0, Math.floor((now - lastAnswer) / 1000)) } : {}),
          },
        }
      : {}),
  };
}

function agentTunnel(tunnel: Tunnel, peer: string, now: number): AgentTunnelStatus {
  return { ...tunnelStatus(tunnel, 'server', now), peer, recent: tunnel.recent.counts() };
}
