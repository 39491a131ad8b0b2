/**
 * The agents /status pages through: each credential + agentID of every
 * tenant once, with references to its tunnels up and detached, in one total
 * order (tenant, agentID, credential subject, a digest of the credential's key;
 * code units, not locale). Made at most once per `maxAgeMs`, so callers polling /status cost
 * one walk of the tables a second however many they are; rendering a page
 * (server-status.ts) reads only the page's agents. A cursor names the last
 * agent of a page by its place in the order, so the next page starts after
 * it in whatever snapshot is current then: no agent twice, and every agent
 * present throughout is shown.
 */
import { createHash } from 'node:crypto';
import type { Tenant } from './tenants/tenant.js';
import type { AgentBackend } from './routing/agent-backend.js';
import type { AgentCredential } from './identity/agent-credential.js';
import type { Tunnel } from '../tunnel/tunnel.js';

export interface IndexedAgent {
  tenant: string | undefined;
  agentID: string;
  credential: AgentCredential;
  backends: AgentBackend[];
  detached: Tunnel[];
}

/** Where a page starts: after the agent with these sort fields (the key as a digest: it may hold a token's uid). */
interface Cursor {
  tenant: string;
  agentID: string;
  subject: string;
  keyDigest: string;
}

function digest(key: string): string {
  return createHash('sha256').update(key).digest('base64url').slice(0, 22);
}

function compareText(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function compareAgents(a: IndexedAgent, b: IndexedAgent): number {
  return (
    compareText(a.tenant ?? '', b.tenant ?? '') ||
    compareText(a.agentID, b.agentID) ||
    compareText(a.credential.subject, b.credential.subject) ||
    // Two credentials of one subject (rare): ordered by the digest a cursor carries, so startAfter's search holds.
    compareText(digest(a.credential.key), digest(b.credential.key))
  );
}

/** Whether an agent sorts after a cursor (it was not on a page up to it). */
function afterCursor(a: IndexedAgent, c: Cursor): boolean {
  const head = compareText(a.tenant ?? '', c.tenant) || compareText(a.agentID, c.agentID) || compareText(a.credential.subject, c.subject);
  // Equal on every shown field (two credentials of one subject): the digests order them, as the key would not be comparable to a digest.
  return head > 0 || (head === 0 && compareText(digest(a.credential.key), c.keyDigest) > 0);
}

export function encodeCursor(a: IndexedAgent): string {
  return Buffer.from(JSON.stringify([a.tenant ?? '', a.agentID, a.credential.subject, digest(a.credential.key)])).toString('base64url');
}

/** The cursor in `text`, or undefined when it is not one this server made. */
export function decodeCursor(text: string): Cursor | undefined {
  let v: unknown;
  try {
    v = JSON.parse(Buffer.from(text, 'base64url').toString('utf8'));
  } catch {
    return undefined;
  }
  if (!Array.isArray(v) || v.length !== 4 || !v.every((x) => typeof x === 'string')) return undefined;
  const [tenant, agentID, subject, keyDigest] = v;
  return { tenant, agentID, subject, keyDigest };
}

/** Index of the first agent of `sorted` after `c` (binary search on the order). */
export function startAfter(sorted: readonly IndexedAgent[], c: Cursor): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (afterCursor(sorted[mid], c)) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/** Every agent of `tenants`, sorted. */
export function indexAgents(tenants: readonly Tenant[]): IndexedAgent[] {
  const out: IndexedAgent[] = [];
  for (const tenant of tenants) {
    const byAgent = new Map<string, IndexedAgent>();
    const agentOf = (credential: AgentCredential, agentID: string): IndexedAgent => {
      const key = `${credential.key}\n${agentID}`;
      let a = byAgent.get(key);
      if (!a) {
        a = { tenant: tenant.name, agentID, credential, backends: [], detached: [] };
        byAgent.set(key, a);
        out.push(a);
      }
      return a;
    };
    for (const b of tenant.registry.list()) agentOf(b.credential, b.agentID).backends.push(b);
    for (const d of tenant.detachedAgentTunnels()) agentOf(d.credential, d.agentID).detached.push(d.tunnel);
  }
  return out.sort(compareAgents);
}

/** The sorted agents, made again once the last copy is `maxAgeMs` old. */
export class StatusIndex {
  private made = { at: -Infinity, agents: [] as IndexedAgent[] };

  constructor(
    private readonly tenants: () => readonly Tenant[],
    private readonly maxAgeMs = 1000,
    private readonly clock: () => number = Date.now,
  ) {}

  agents(): readonly IndexedAgent[] {
    const now = this.clock();
    if (now - this.made.at >= this.maxAgeMs) this.made = { at: now, agents: indexAgents(this.tenants()) };
    return this.made.agents;
  }
}
