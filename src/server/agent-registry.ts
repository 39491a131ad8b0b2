/**
 * Connected agents and how a dial picks one. Agents that sent DRAIN are used
 * only when no other agent is left, as upstream does.
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

  /** A random usable agent, preferring ones that are not draining. */
  pick(): AgentBackend | undefined {
    const live = this.list().filter((b) => !b.tunnel.closed);
    const fresh = live.filter((b) => !b.tunnel.drainRequested);
    const pool = fresh.length > 0 ? fresh : live;
    return pool[Math.floor(Math.random() * pool.length)];
  }
}
