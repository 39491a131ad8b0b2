/**
 * Accepts AgentService/Connect streams: checks the agent's metadata,
 * negotiates Kanal features, answers with serverID/serverCount and registers
 * the tunnel so frontends can dial through it.
 */
import type { Logger } from 'pino';
import type { IncomingStream } from '../transport/transport.js';
import { GrpcStatus } from '../transport/transport.js';
import { MD_AGENT_ID, MD_AGENT_IDENTIFIERS, MD_KANAL_FEATURES, MD_SERVER_COUNT, MD_SERVER_ID, firstValue } from '../wire/metadata.js';
import { Feature, formatFeatures, intersectFeatures, parseFeatures, type FeatureSet } from '../wire/features.js';
import { Tunnel } from '../tunnel/tunnel.js';
import type { TunnelLimitName, TunnelLimits } from '../tunnel/limits.js';
import { parseAgentIdentifiers, type AgentIdentifiers } from './agent-identifiers.js';
import type { AgentRegistry, AgentBackend } from './agent-registry.js';
import type { DestinationDialer } from './destination-dialer.js';
import type { KanalMetrics, RefusalReasons } from '../common/metrics.js';

/** On an agent tunnel the server performs node -> control plane dials (inbound) and dials toward the node (outbound). */
const AGENT_TUNNEL_REFUSALS: RefusalReasons = {
  maxPendingDials: 'agent_pending_dials',
  maxInboundConnections: 'agent_node_to_cp_connections',
  maxOutboundConnections: 'agent_cp_to_node_connections',
};

/** The server flags behind each limit of an agent tunnel, named in log lines. */
const AGENT_TUNNEL_LIMIT_FLAGS: Partial<Record<TunnelLimitName, string>> = {
  maxPendingDials: '--max-pending-dials-per-agent',
  maxInboundConnections: '--max-node-to-cp-connections-per-agent',
  maxOutboundConnections: '--max-cp-to-node-connections-per-agent',
  pauseReadingQueuedBytes: '--peer-read-timeout',
  maxQueuedBytes: '--peer-read-timeout',
  peerReadTimeoutMs: '--peer-read-timeout',
};

export interface AgentServiceOptions {
  serverID: string;
  serverCount: number;
  registry: AgentRegistry;
  destinations: DestinationDialer;
  features: FeatureSet;
  limits?: Partial<TunnelLimits>;
  log: Logger;
  metrics?: KanalMetrics;
}

/** Host names and UUIDs fit; longer IDs would ride on every log line of the agent (#11 finding 8). */
export const MAX_AGENT_ID_LENGTH = 253;

export function createAgentService(opts: AgentServiceOptions): (incoming: IncomingStream) => void {
  return (incoming) => {
    const agentIDs = incoming.metadata.get(MD_AGENT_ID) ?? [];
    if (agentIDs.length !== 1 || !agentIDs[0]) {
      opts.log.warn({ peer: incoming.peer, got: agentIDs.length }, 'refused agent stream: expected exactly one agentID');
      opts.metrics?.refusals.inc({ reason: 'agent_metadata' });
      incoming.reject(GrpcStatus.INVALID_ARGUMENT, `expected exactly one agentID in the metadata, got ${agentIDs.length}`);
      return;
    }
    const agentID = agentIDs[0];
    if (agentID.length > MAX_AGENT_ID_LENGTH) {
      opts.log.warn({ peer: incoming.peer, length: agentID.length }, 'refused agent stream: agentID too long');
      opts.metrics?.refusals.inc({ reason: 'agent_metadata' });
      incoming.reject(GrpcStatus.INVALID_ARGUMENT, `agentID is ${agentID.length} characters long; at most ${MAX_AGENT_ID_LENGTH} are accepted`);
      return;
    }
    let identifiers: AgentIdentifiers;
    try {
      identifiers = parseAgentIdentifiers(firstValue(incoming.metadata, MD_AGENT_IDENTIFIERS) ?? '');
    } catch (err) {
      opts.log.warn({ peer: incoming.peer, agentID, err: (err as Error).message }, 'refused agent stream: bad agentIdentifiers');
      opts.metrics?.refusals.inc({ reason: 'agent_metadata' });
      incoming.reject(GrpcStatus.INVALID_ARGUMENT, (err as Error).message);
      return;
    }
    const features = intersectFeatures(parseFeatures(firstValue(incoming.metadata, MD_KANAL_FEATURES)), opts.features);
    const headers: Record<string, string> = {
      [MD_SERVER_ID]: opts.serverID,
      [MD_SERVER_COUNT]: String(opts.serverCount),
    };
    if (features.size > 0) headers[MD_KANAL_FEATURES] = formatFeatures(features);
    const stream = incoming.accept(headers);
    const log = opts.log.child({ agentID });
    const nodeDial = features.has(Feature.NodeDial);
    const tunnel = new Tunnel(stream, {
      side: 'server',
      features,
      log,
      limits: opts.limits,
      dialHandler: nodeDial ? (dial) => opts.destinations.dial(agentID, dial) : undefined,
      refuseDialsReason: 'node -> control plane dials were not negotiated on this stream',
      // On an agent tunnel the server dials toward nodes and performs dials toward the control plane.
      onConnectionClosed: (c) => opts.metrics?.connectionClosed(c.role === 'dialer' ? 'cp_to_node' : 'node_to_cp', c.bytesOut, c.bytesIn),
      onLimit: (limit) => opts.metrics?.tunnelLimit(limit, AGENT_TUNNEL_REFUSALS),
      limitFlags: AGENT_TUNNEL_LIMIT_FLAGS,
    });
    const backend: AgentBackend = { agentID, identifiers, tunnel, peer: incoming.peer, connectedAt: new Date() };
    opts.registry.add(backend);
    log.info({ peer: incoming.peer, features: formatFeatures(features) || 'none', agents: opts.registry.size }, 'agent connected');
    tunnel.once('close', (err) => {
      opts.registry.remove(backend);
      log.info({ peer: incoming.peer, reason: err?.message ?? 'stream ended', agents: opts.registry.size }, 'agent disconnected');
    });
  };
}
