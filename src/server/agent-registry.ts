/**
 * Connected agents and how a dial picks one. Agents that sent DRAIN, or
 * whose tunnel is not being read, are used only when no other agent is left.
 */
import { EventEmitter } from 'node:events';
import type { Tunnel } from '../tunnel/tunnel.js';
import type { AgentIdentifiers } from './agent-identifiers.js';

export interface AgentBackend {
  agentID: string;
  identifiers: AgentIdentifiers;
  tunnel: Tunnel;
  peer: string;
  connectedAt: Date;
}

export interface AgentRegistryEvents {
  change: [];
}

export class AgentRegistry extends EventEmitter<AgentRegistryEvents> {
  private readonly backends = new Set<AgentBackend>();

  add(backend: AgentBackend): void {
    this.backends.add(backend);
    this.emit('change');
  }

  remove(backend: AgentBackend): void {
    if (this.backends.delete(backend)) this.emit('change');
  }

  get size(): number {
    return this.backends.size;
  }

  list(): AgentBackend[] {
    return [...this.backends];
  }

  /**
   * A random agent, preferring ones that are not draining, and of that agent
   * its oldest tunnel. An agent behind a load balancer briefly opens a second
   * stream to a server it already holds before closing it; choosing per agent
   * (as upstream does) keeps dials off that doomed stream and gives every
   * agent the same share whatever its number of streams.
   */
  pick(): AgentBackend | undefined {
    const oldestPerAgent = new Map<string, AgentBackend>();
    // Insertion order is age: the first live backend seen per agent is its oldest.
    for (const b of this.backends) {
      if (!b.tunnel.closed && !oldestPerAgent.has(b.agentID)) oldestPerAgent.set(b.agentID, b);
    }
    const live = [...oldestPerAgent.values()];
    // A tunnel not being read (slow reader with an upstream agent, or an agent that does not read, #11/#12) would hold the dial's answer too.
    const fresh = live.filter((b) => !b.tunnel.drainRequested && !b.tunnel.readPaused);
    const pool = fresh.length > 0 ? fresh : live;
    return pool[Math.floor(Math.random() * pool.length)];
  }
}
