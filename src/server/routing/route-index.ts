/**
 * What routing needs, kept as tunnels come and go (#15): each agent's
 * tunnels, and who announces which destination, so a dial looks up the few
 * agents a strategy allows instead of filtering every agent's identifiers.
 * Identifiers are fixed when a tunnel is admitted, so the index never goes stale.
 */
import type { AgentBackend } from '../agent-registry.js';

export class RouteIndex {
  /**
   * One entry per agent: its open and closing tunnels, oldest first (the
   * registry's own arrays). Invariant: no empty array; exactly the registry's agents.
   */
  readonly agents = new Set<readonly AgentBackend[]>();
  /** Each tunnel's agent entry. */
  private readonly agentOf = new Map<AgentBackend, readonly AgentBackend[]>();
  /** Canonical host name, IPv4 or IPv6 address -> the tunnels announcing it; no empty sets. */
  private readonly byHost = new Map<string, Set<AgentBackend>>();
  /** Tunnels announcing at least one cidr. */
  readonly withCidrs = new Set<AgentBackend>();
  /** Tunnels announcing default-route=true. */
  readonly defaultRoute = new Set<AgentBackend>();

  /** `tunnels`: the array of `backend`'s agent (already holding it). */
  add(backend: AgentBackend, tunnels: readonly AgentBackend[]): void {
    this.agents.add(tunnels);
    this.agentOf.set(backend, tunnels);
    const ids = backend.identifiers;
    for (const host of new Set([...ids.hosts, ...ids.ipv4, ...ids.ipv6])) {
      let set = this.byHost.get(host);
      if (!set) this.byHost.set(host, (set = new Set()));
      set.add(backend);
    }
    if (ids.cidrs.length > 0) this.withCidrs.add(backend);
    if (ids.defaultRoute) this.defaultRoute.add(backend);
  }

  /** `agentGone`: `backend` was its agent's last tunnel. */
  remove(backend: AgentBackend, agentGone: boolean): void {
    const tunnels = this.agentOf.get(backend);
    if (!tunnels) return;
    this.agentOf.delete(backend);
    if (agentGone) this.agents.delete(tunnels);
    const ids = backend.identifiers;
    for (const host of [...ids.hosts, ...ids.ipv4, ...ids.ipv6]) {
      const set = this.byHost.get(host);
      if (set?.delete(backend) && set.size === 0) this.byHost.delete(host);
    }
    this.withCidrs.delete(backend);
    this.defaultRoute.delete(backend);
  }

  /** Tunnels announcing `host` (canonical) as a host name or address. */
  announcing(host: string): ReadonlySet<AgentBackend> {
    return this.byHost.get(host) ?? EMPTY;
  }

  /** The agent's tunnel routing uses: its oldest open one that answers PINGs, else its newest open one. */
  chosen(backend: AgentBackend): AgentBackend | undefined {
    const tunnels = this.agentOf.get(backend);
    return tunnels && chooseTunnel(tunnels);
  }
}

const EMPTY: ReadonlySet<AgentBackend> = new Set();

/** Routing avoids these: closed, or a PING unanswered (liveness.ts). */
export function quiet(b: AgentBackend): boolean {
  return b.tunnel.closed || b.liveness?.quiet === true;
}

/**
 * Of one agent's tunnels, the one a dial may use: a load balancer's duplicate
 * stays unused, a newer live tunnel wins over a quiet older one, a closed one
 * is never used.
 */
export function chooseTunnel(tunnels: readonly AgentBackend[]): AgentBackend | undefined {
  let newestOpen: AgentBackend | undefined;
  for (const b of tunnels) {
    if (b.tunnel.closed) continue;
    if (!quiet(b)) return b;
    newestOpen = b;
  }
  return newestOpen;
}
