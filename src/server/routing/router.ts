/**
 * Which agent serves a dial (#14): the first of --proxy-strategies that has
 * an agent for the destination, as upstream's getBackend tries its backend
 * managers in order (pkg/server/server.go). Each strategy allows a set:
 *
 * - `default`: every agent.
 * - `defaultRoute`: agents that announce default-route=true.
 * - `destHost`: agents whose host/ipv4/ipv6 identifier equals the dial's host
 *   (names case-insensitive, addresses canonical); failing that, for an IP
 *   address, agents announcing the longest cidr that contains it (upstream
 *   parses cidr and never routes by it). Identifiers are claims of the
 *   credential that announces them: when agents of two or more credentials
 *   claim the same destination, none of them gets it by destHost (the dial
 *   goes to the next strategy), so one node's credential cannot draw another
 *   node's traffic (#11 finding 2; docs/trust-model.md).
 *
 * Within a strategy: live, not draining and read agents first, then live
 * draining or unread ones (upstream's fallback), and among those the least
 * loaded (open connections + pending dials), ties at random. A strategy whose
 * agents are all quiet (PING unanswered) yields to later strategies; quiet
 * agents are used only when no strategy has a live one.
 */
import { isIP } from 'node:net';
import { canonicalHost, prefixContains } from '../../wire/agent-identifiers.js';
import type { AgentBackend } from '../agent-registry.js';
import type { ProxyStrategy } from './proxy-strategies.js';

export interface Route {
  strategies: readonly ProxyStrategy[];
  /** The dial's host (no port, no brackets); absent when the dial has none (destHost allows nobody). */
  host?: string;
}

export type RouteOutcome =
  | { ok: true; backend: AgentBackend; strategy: ProxyStrategy; contested?: Contest }
  | { ok: false; reason: string; contested?: Contest };

/** A destination claimed by agents of several credentials: destHost ignores it. */
export interface Contest {
  host: string;
  subjects: string[];
}

/** Routing avoids these: closed, or a PING unanswered (liveness.ts). */
export function quiet(b: AgentBackend): boolean {
  return b.tunnel.closed || b.liveness?.quiet === true;
}

/** A tunnel not being read (a slow reader with an upstream agent, or an agent that does not read, #11/#12) would hold the dial's answer too. */
function fresh(b: AgentBackend): boolean {
  return !b.tunnel.drainRequested && !b.tunnel.readPaused;
}

function load(b: AgentBackend): number {
  const s = b.tunnel.stats();
  return s.connections + s.pendingDials;
}

/** The least loaded of `pool` (non-empty), ties at random. */
function leastLoaded(pool: AgentBackend[]): AgentBackend {
  let best: AgentBackend[] = [];
  let min = Infinity;
  for (const b of pool) {
    const l = load(b);
    if (l < min) [best, min] = [[b], l];
    else if (l === min) best.push(b);
  }
  return best[Math.floor(Math.random() * best.length)]!;
}

interface Allowed {
  agents: AgentBackend[];
  /** Why the strategy allows nobody, for the dial's error. */
  none?: string;
  contested?: Contest;
}

function destHost(candidates: AgentBackend[], host: string | undefined): Allowed {
  if (!host) return { agents: [], none: 'destHost: the dial names no host' };
  const dest = canonicalHost(host);
  const ip = isIP(dest) !== 0;
  /** Exact matches score Infinity, cidr matches their prefix length. */
  const scored: Array<[AgentBackend, number]> = [];
  for (const b of candidates) {
    const ids = b.identifiers;
    if (ids.hosts.includes(dest) || ids.ipv4.includes(dest) || ids.ipv6.includes(dest)) scored.push([b, Infinity]);
    else if (ip) {
      const longest = Math.max(-1, ...ids.cidrs.filter((c) => prefixContains(c, dest)).map((c) => c.length));
      if (longest >= 0) scored.push([b, longest]);
    }
  }
  if (scored.length === 0) return { agents: [], none: `destHost: no agent announces ${dest}` };
  const credentials = new Map(scored.map(([b]) => [b.credential.key, b.credential.subject]));
  if (credentials.size > 1) {
    const contested = { host: dest, subjects: [...credentials.values()] };
    return { agents: [], none: `destHost: agents of ${credentials.size} credentials announce ${dest}, so none is trusted with it`, contested };
  }
  const best = Math.max(...scored.map(([, s]) => s));
  return { agents: scored.filter(([, s]) => s === best).map(([b]) => b) };
}

function allowed(strategy: ProxyStrategy, candidates: AgentBackend[], host: string | undefined): Allowed {
  switch (strategy) {
    case 'default':
      return { agents: candidates, none: 'default: no agent is connected' };
    case 'defaultRoute': {
      const agents = candidates.filter((b) => b.identifiers.defaultRoute);
      return { agents, none: 'defaultRoute: no agent announces default-route=true' };
    }
    case 'destHost':
      return destHost(candidates, host);
  }
}

/** `candidates`: one tunnel per agent (the registry's choice). */
export function route(candidates: AgentBackend[], r: Route): RouteOutcome {
  const sets = r.strategies.map((strategy) => ({ strategy, ...allowed(strategy, candidates, r.host) }));
  const contested = sets.find((s) => s.contested)?.contested;
  for (const s of sets) {
    const live = s.agents.filter((b) => !quiet(b));
    if (live.length === 0) continue;
    const preferred = live.filter(fresh);
    return { ok: true, backend: leastLoaded(preferred.length > 0 ? preferred : live), strategy: s.strategy, contested };
  }
  for (const s of sets) {
    if (s.agents.length > 0) return { ok: true, backend: leastLoaded(s.agents), strategy: s.strategy, contested };
  }
  return { ok: false, reason: sets.map((s) => s.none).join('; '), contested };
}
