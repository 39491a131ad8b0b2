/**
 * The agent's status document (domain/status-document.ts) from where its
 * state lives: ServerTunnels (addresses, tunnels up and detached), the node
 * listeners and the host interface. Read on request; nothing is copied meanwhile.
 */
import type { AgentTunnelsSnapshot } from './server-tunnels.js';
import type { NodeListeners } from './node-listeners.js';
import type { HostInterfaceManager } from './host-interface-manager.js';
import type { KanalMetrics } from '../domain/metrics.js';
import {
  statusHeader,
  tunnelStatus,
  type AgentStatusDocument,
  type ServerAddressStatus,
  type ServerTunnelStatus,
} from '../domain/status-document.js';

export interface AgentStatusSources {
  agentID: string;
  tunnels: AgentTunnelsSnapshot;
  metrics: KanalMetrics;
  nodeListeners?: Pick<NodeListeners, 'snapshot'>;
  hostInterface?: Pick<HostInterfaceManager, 'snapshot'>;
  build: { version: string; commit: string };
}

export function agentStatus(src: AgentStatusSources, now = Date.now()): AgentStatusDocument {
  const { tunnels: snap } = src;
  const tunnels: ServerTunnelStatus[] = snap.tunnels.map((h) => ({
    ...tunnelStatus(h.tunnel, 'agent', now),
    serverID: h.serverID,
    address: h.address,
  }));
  const servers = snap.endpoints.map((e): ServerAddressStatus => {
    const through = snap.tunnels.filter((h) => h.address === e.target);
    const up = through.filter((h) => !h.detached);
    const state: ServerAddressStatus['state'] =
      up.length > 0
        ? 'connected'
        : through.length > 0
          ? 'detached'
          : e.reachedHeld !== undefined
            ? 'reaches-held'
            : e.lastError
              ? 'backing-off'
              : 'connecting';
    return {
      address: e.target,
      name: e.name,
      state,
      serverIDs: state === 'reaches-held' && e.reachedHeld !== undefined ? [e.reachedHeld] : through.map((h) => h.serverID),
      ...(e.lastError ? { lastError: e.lastError } : {}),
    };
  });
  return {
    ...statusHeader(src.build, src.metrics.recent.counts(), now),
    component: 'agent',
    agent: { agentID: src.agentID, state: snap.state, expectedServers: { count: snap.expected.count, from: snap.expected.from } },
    servers,
    tunnels,
    ...(src.nodeListeners ? { nodeListeners: src.nodeListeners.snapshot() } : {}),
    ...(src.hostInterface ? { hostInterface: src.hostInterface.snapshot() } : {}),
  };
}
