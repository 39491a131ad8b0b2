/**
 * What routing needs, kept as tunnels come and go: each agent's
 * tunnels, and who announces which destination, so a dial looks up the few
 * agents a strategy allows instead of filtering every agent's identifiers.
 * Identifiers are fixed when a tunnel is admitted, so the index never goes stale.
 * The registry (agent-registry.ts) tells it of every tunnel that comes and goes.
 */
import type { AgentBackend } from './agent-backend.js';

export class RouteIndex {
  /**
   * One entry per agent: its open and closing tunnels, oldest first.
   * Invariant: no empty array; exactly the agents of the tunnels added and
   * not removed, each array the one `byAgent` and `agentOf` hold for it.
   */
  readonly agents = new Set<readonly AgentBackend[]>();
  /** An agent is its credential plus the agentID it announces: credential key -> agentID -> its array; no empty maps. */
  private readonly byAgent = new Map<string, Map<string, AgentBackend[]>>();
  /** Each tunnel's agent array. */
  private readonly agentOf = new Map<AgentBackend, AgentBackend[]>();
  /** Canonical host name, IPv4 or IPv6 address -> the tunnels announcing it; no empty sets. */
  private readonly byHost = new Map<string, Set<AgentBackend>>();
  /** Tunnels announcing at least one cidr. */
  readonly withCidrs = new Set<AgentBackend>();
  /** Tunnels announcing default-route=true. */
  readonly defaultRoute = new Set<AgentBackend>();

  /** Adds a tunnel, the newest of its agent; adding one already held does nothing. */
  add(backend: AgentBackend): void {
    if (this.agentOf.has(backend)) return;
    let ofCredential = this.byAgent.get(backend.credential.key);
    if (!ofCredential) {
      ofCredential = new Map<string, AgentBackend[]>();
      this.byAgent.set(backend.credential.key, ofCredential);
    }
    let tunnels = ofCredential.get(backend.agentID);
    if (tunnels) tunnels.push(backend);
    else {
      ofCredential.set(backend.agentID, (tunnels = [backend]));
      this.agents.add(tunnels);
    }
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

  remove(backend: AgentBackend): void {
    const tunnels = this.agentOf.get(backend);
    if (!tunnels) return;
    this.agentOf.delete(backend);
    tunnels.splice(tunnels.indexOf(backend), 1);
    if (tunnels.length === 0) {
      this.agents.delete(tunnels);
      const ofCredential = this.byAgent.get(backend.credential.key);
      ofCredential?.delete(backend.agentID);
      if (ofCredential?.size === 0) this.byAgent.delete(backend.credential.key);
    }
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

/** Routing avoids these: not open, or a PING unanswered (liveness.ts). */
export function quiet(b: AgentBackend): boolean {
  return !b.tunnel.isOpen || b.liveness?.quiet === true;
}

/**
 * Of one agent's tunnels, the one a dial may use: a load balancer's duplicate
 * stays unused, a newer live tunnel wins over a quiet older one, a closed one
 * is never used.
 */
export function chooseTunnel(tunnels: readonly AgentBackend[]): AgentBackend | undefined {
  let newestOpen: AgentBackend | undefined;
  for (const b of tunnels) {
    if (!b.tunnel.isOpen) continue;
    if (!quiet(b)) return b;
    newestOpen = b;
  }
  return newestOpen;
}
