/**
 * Which agent serves a dial: the first of --proxy-strategies that has
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
 *   node's traffic (docs/trust-model.md).
 *
 * Within a strategy: live, not draining and read agents first, then live
 * draining or unread ones (upstream's fallback), and among those the least
 * loaded (open connections + pending dials), ties at random. A strategy whose
 * agents are all quiet (PING unanswered) yields to later strategies; quiet
 * agents are used only when no strategy has a live one.
 *
 * Per dial: no allocation per agent; `destHost` looks up only the
 * agents announcing the host (route-index.ts) and those announcing a cidr,
 * `defaultRoute` only those announcing it, `default` takes one pass over the
 * agents, and a strategy is looked at only if those before it have no live agent.
 */
import { isIP } from 'node:net';
import { canonicalHost, prefixContains } from '../../wire/agent-identifiers.js';
import type { AgentBackend } from './agent-backend.js';
import type { ProxyStrategy } from './proxy-strategies.js';
import { chooseTunnel, quiet, type RouteIndex } from './route-index.js';

export interface Route {
  strategies: readonly ProxyStrategy[];
  /** The dial's host (no port, no brackets); absent when the dial has none (destHost allows nobody). */
  host?: string;
}

export type RouteOutcome =
  { ok: true; backend: AgentBackend; strategy: ProxyStrategy; contested?: Contest } | { ok: false; reason: string; contested?: Contest };

/** A destination claimed by agents of several credentials: destHost ignores it. */
export interface Contest {
  host: string;
  subjects: string[];
}

/** Not draining and being read (else the dial's answer would wait too): Tunnel.preferredForDials. */
function fresh(b: AgentBackend): boolean {
  return b.tunnel.preferredForDials;
}

/** The least loaded of the agents offered, ties at random (each of n tied with probability 1/n). */
class LeastLoaded {
  best: AgentBackend | undefined;
  private min = Infinity;
  private ties = 0;

  offer(b: AgentBackend): void {
    const load = b.tunnel.load;
    if (load < this.min) {
      this.best = b;
      this.min = load;
      this.ties = 1;
    } else if (load === this.min && Math.random() * ++this.ties < 1) {
      this.best = b;
    }
  }
}

/** What one strategy allows, and the agent each preference class would get. */
interface Allowed {
  strategy: ProxyStrategy;
  /** Live and fresh, live, any: the least loaded of each class. */
  freshLive: LeastLoaded;
  live: LeastLoaded;
  any: LeastLoaded;
  /** Why the strategy allows nobody, for the dial's error. */
  none: string;
  contested?: Contest;
}

function allowedSet(strategy: ProxyStrategy, none: string, contested?: Contest): Allowed {
  return { strategy, freshLive: new LeastLoaded(), live: new LeastLoaded(), any: new LeastLoaded(), none, contested };
}

function offer(a: Allowed, b: AgentBackend): void {
  a.any.offer(b);
  if (quiet(b)) return;
  a.live.offer(b);
  if (fresh(b)) a.freshLive.offer(b);
}

/** `candidates` holds tunnels of any agents; only each agent's chosen tunnel counts. */
function offerChosen(a: Allowed, index: RouteIndex, candidates: Iterable<AgentBackend>): void {
  for (const b of candidates) if (index.chosen(b) === b) offer(a, b);
}

function destHost(index: RouteIndex, host: string | undefined): Allowed {
  if (!host) return allowedSet('destHost', 'destHost: the dial names no host');
  const dest = canonicalHost(host);
  /** Exact matches score Infinity, cidr matches their prefix length. */
  const scored: Array<[AgentBackend, number]> = [];
  for (const b of index.announcing(dest)) if (index.chosen(b) === b) scored.push([b, Infinity]);
  if (isIP(dest) !== 0) {
    for (const b of index.withCidrs) {
      if (index.chosen(b) !== b || scored.some(([s]) => s === b)) continue;
      let longest = -1;
      for (const c of b.identifiers.cidrs) if (c.length > longest && prefixContains(c, dest)) longest = c.length;
      if (longest >= 0) scored.push([b, longest]);
    }
  }
  if (scored.length === 0) return allowedSet('destHost', `destHost: no agent announces ${dest}`);
  const credentials = new Map(scored.map(([b]) => [b.credential.key, b.credential.subject]));
  if (credentials.size > 1) {
    const contested = { host: dest, subjects: [...credentials.values()] };
    return allowedSet(
      'destHost',
      `destHost: agents of ${credentials.size} credentials announce ${dest}, so none is trusted with it`,
      contested,
    );
  }
  const best = Math.max(...scored.map(([, s]) => s));
  const a = allowedSet('destHost', '');
  for (const [b, s] of scored) if (s === best) offer(a, b);
  return a;
}

function allowed(strategy: ProxyStrategy, index: RouteIndex, host: string | undefined): Allowed {
  switch (strategy) {
    case 'default': {
      const a = allowedSet(strategy, 'default: no agent is connected');
      for (const tunnels of index.agents) {
        const b = chooseTunnel(tunnels);
        if (b) offer(a, b);
      }
      return a;
    }
    case 'defaultRoute': {
      const a = allowedSet(strategy, 'defaultRoute: no agent announces default-route=true');
      offerChosen(a, index, index.defaultRoute);
      return a;
    }
    case 'destHost':
      return destHost(index, host);
  }
}

/**
 * The agent `r` routes to, among one tunnel per agent of `index`. Strategies
 * are looked at in order until one has a live agent; destHost's always, as
 * its contest is reported whichever strategy wins.
 */
export function route(index: RouteIndex, r: Route): RouteOutcome {
  const dest = r.strategies.includes('destHost') ? destHost(index, r.host) : undefined;
  const contested = dest?.contested;
  const sets: Allowed[] = [];
  for (const strategy of r.strategies) {
    const s = (strategy === 'destHost' ? dest : undefined) ?? allowed(strategy, index, r.host);
    sets.push(s);
    const backend = s.freshLive.best ?? s.live.best;
    if (backend) return { ok: true, backend, strategy, contested };
  }
  for (const s of sets) {
    if (s.any.best) return { ok: true, backend: s.any.best, strategy: s.strategy, contested };
  }
  return { ok: false, reason: sets.map((s) => s.none).join('; '), contested };
}
