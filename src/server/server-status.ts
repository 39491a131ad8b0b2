/**
 * The server's status document (domain/status-document.ts) from where its
 * state lives: each tenant's registry (tunnels up) and resumable tunnels
 * (tunnels waiting for a resume), and the refusals of the last minutes kept
 * beside kanal_refusals_total. Read on request; nothing is copied meanwhile.
 */
import type { Tenant } from './tenants/tenant.js';
import type { KanalMetrics } from '../domain/metrics.js';
import type { AgentCredential } from './identity/agent-credential.js';
import type { AgentBackend } from './routing/agent-backend.js';
import type { Tunnel } from '../tunnel/tunnel.js';
import { addCounts, type RecentCounts } from '../domain/recent-events.js';
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
  /** With --tenants-config: their names are listed. */
  named: boolean;
  /** The process's metrics: listener-level refusals, and a one-cluster tenant's own (the same object). */
  metrics: KanalMetrics;
  build: { version: string; commit: string };
}

export function serverStatus(src: ServerStatusSources, now = Date.now()): ServerStatusDocument {
  const recent: RecentCounts = src.metrics.recent.counts();
  for (const t of src.tenants) if (t.metrics !== src.metrics) addCounts(recent, t.metrics.recent.counts());
  const agents: AgentStatus[] = [];
  for (const tenant of src.tenants) agents.push(...tenantAgents(tenant, now));
  agents.sort((a, b) => (a.tenant ?? '').localeCompare(b.tenant ?? '') || a.agentID.localeCompare(b.agentID));
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
  };
}

/** One tenant's agents: each credential and agentID once, with its tunnels up and detached. */
function tenantAgents(tenant: Tenant, now: number): AgentStatus[] {
  const byAgent = new Map<string, AgentStatus>();
  const agentOf = (credential: AgentCredential, agentID: string, backend?: AgentBackend): AgentStatus => {
    const key = `${credential.key}\n${agentID}`;
    let a = byAgent.get(key);
    if (!a) {
      a = {
        agentID,
        credential: credential.subject,
        ...(tenant.name !== undefined ? { tenant: tenant.name } : {}),
        identifiers: { hosts: [], ipv4: [], ipv6: [], defaultRoute: false },
        tunnels: [],
      };
      byAgent.set(key, a);
    }
    if (backend) {
      const { hosts, ipv4, ipv6, defaultRoute } = backend.identifiers;
      a.identifiers = { hosts, ipv4, ipv6, defaultRoute };
    }
    return a;
  };
  for (const b of tenant.registry.list()) {
    const lastAnswer = b.liveness?.lastAnsweredAt;
    agentOf(b.credential, b.agentID, b).tunnels.push({
      ...agentTunnel(b.tunnel, b.peer, now),
      ...(b.liveness
        ? {
            liveness: {
              quiet: b.liveness.quiet,
              ...(lastAnswer !== undefined ? { lastAnswerSecondsAgo: Math.max(0, Math.floor((now - lastAnswer) / 1000)) } : {}),
            },
          }
        : {}),
    });
  }
  for (const d of tenant.detachedAgentTunnels()) agentOf(d.credential, d.agentID).tunnels.push(agentTunnel(d.tunnel, '', now));
  return [...byAgent.values()];
}

function agentTunnel(tunnel: Tunnel, peer: string, now: number): AgentTunnelStatus {
  return { ...tunnelStatus(tunnel, 'server', now), peer, recent: tunnel.recent.counts() };
}
