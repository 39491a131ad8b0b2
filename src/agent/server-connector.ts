/**
 * Opening one tunnel to one server address (connectToServer) with what
 * every connect shares: this process's features, resume offer and
 * incarnation, keepalive, per-server dial allowances, the dials it performs
 * for the server, and the metrics and audit records of its connections;
 * and what a connect offered, for the diagnosis of its failure.
 */
import type { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import type { ConnectionAuditor, TunnelParty } from '../audit/connection-auditor.js';
import type { ClientKeepalive, Transport } from '../transport/transport.js';
import { Feature, type FeatureSet } from '../wire/features.js';
import { MD_KANAL_FEATURES, type MetadataMap } from '../wire/metadata.js';
import type { TunnelLimitName } from '../tunnel/limits.js';
import { resolveLimits } from '../tunnel/limits.js';
import type { InboundDial } from '../tunnel/tunnel.js';
import { DialError } from '../tunnel/errors.js';
import { dialTcp } from '../tunnel/tcp-dial.js';
import { countTunnelLimit } from '../tunnel/limit-metrics.js';
import type { RefusalReasons } from '../tunnel/limit-reports.js';
import { DialAllowances } from '../tunnel/dial-allowances.js';
import { parseHostPort } from '../common/host-port.js';
import type { KanalMetrics } from '../domain/metrics.js';
import type { ResumeMetrics } from '../domain/resume-metrics.js';
import { connectToServer, type ServerConnection } from './server-connection.js';
import type { ServerEndpoint } from './server-addresses.js';
import type { ConnectAttempt } from './connect-diagnosis.js';
import type { ServerTunnelsOptions } from './server-tunnels-options.js';
import type { Tunnel } from '../tunnel/tunnel.js';
import { FLAG } from './settings.js';

export type ServerConnectorOptions = Pick<
  ServerTunnelsOptions,
  | 'agentID'
  | 'agentIdentifiers'
  | 'server'
  | 'keepalive'
  | 'token'
  | 'dialTimeoutMs'
  | 'connectTimeoutMs'
  | 'transport'
  | 'limits'
  | 'features'
  | 'targets'
  | 'resumeTimeoutMs'
  | 'resolveHandler'
  | 'log'
> & {
  metrics: KanalMetrics;
  auditor: ConnectionAuditor;
  resumeMetrics: ResumeMetrics;
  /** The tunnels waiting to resume, by their resume token: named on each new stream. */
  resumable: () => ReadonlyMap<string, Tunnel>;
  /** This agent and a server, as the audit log names them. */
  party: (serverID: string, address: string) => TunnelParty;
};

/**
 * Kanal servers accept a PING every few seconds (Node's nghttp2 and grpc-js
 * enforce no PING policy); upstream's grpc-go servers do not (transport.ts,
 * POLICED_PING_INTERVAL_MS). A server that answered kanal-features is Kanal.
 */
const acceptsFrequentPings = (responseMetadata: MetadataMap): boolean => (responseMetadata.get(MD_KANAL_FEATURES)?.length ?? 0) > 0;

const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial, Feature.Resolve]);
const RESUMING_AGENT_FEATURES: FeatureSet = new Set([...AGENT_FEATURES, Feature.Resume]);
/** Servers whose dial allowances the agent keeps (ServerConnector.allowances); beyond, new ones share one. */
const MAX_SERVER_ALLOWANCES = 256;

/** Whether an agent offering `features` (absent: the default set) offers node -> control plane dials. */
export function offersNodeDial(features: FeatureSet | undefined): boolean {
  return (features ?? AGENT_FEATURES).has(Feature.NodeDial);
}

/** On a tunnel to a server the agent performs control plane -> node dials (inbound) and requests node -> control plane ones. */
const SERVER_TUNNEL_REFUSALS: RefusalReasons = {
  maxPendingDials: 'pending_dials',
  maxInboundConnections: 'cp_to_node_connections',
  maxOutboundConnections: 'node_to_cp_connections',
  dialRate: 'throttled',
};
const SERVER_TUNNEL_LIMIT_FLAGS: Partial<Record<TunnelLimitName, string>> = {
  maxInboundConnections: FLAG['max-cp-to-node-connections'],
  maxOutboundConnections: FLAG['max-node-to-cp-connections'],
  maxPendingDials: FLAG['max-pending-dials'],
  dialRate: FLAG['dial-rate'],
  pauseReadingQueuedBytes: FLAG['peer-read-timeout'],
  maxQueuedBytes: FLAG['peer-read-timeout'],
  peerReadTimeoutMs: FLAG['peer-read-timeout'],
};

export class ServerConnector {
  /** The transport, its channels PINGing as the options say. */
  private readonly transport: Transport;
  /** This process, for the servers (MD_KANAL_INCARNATION). */
  private readonly incarnation = randomBytes(12).toString('base64url');
  /**
   * --dial-rate and the per-tunnel caps, per server (serverID) rather than
   * per stream: a reconnect to the same server starts with what its last
   * tunnel left (docs/limits.md). Servers a load balancer may show are few;
   * the table's bound is for a server that announces a new ID each time.
   */
  private readonly allowances = new DialAllowances({ maxEntries: MAX_SERVER_ALLOWANCES });

  constructor(private readonly opts: ServerConnectorOptions) {
    const base = opts.transport;
    const keepalive: ClientKeepalive | undefined = opts.keepalive && { ...opts.keepalive, acceptsFrequentPings };
    this.transport = keepalive ? { ...base, createChannel: (o) => base.createChannel({ ...o, keepalive }) } : base;
  }

  /** The one place a tunnel is opened: to `endpoint`, its certificate checked against the name it was given by. */
  connect(endpoint: ServerEndpoint): Promise<ServerConnection> {
    const { tls } = this.opts.server;
    const resumeTimeoutMs = this.opts.resumeTimeoutMs ?? 0;
    const resume =
      resumeTimeoutMs > 0
        ? {
            timeoutMs: resumeTimeoutMs,
            incarnation: this.incarnation,
            held: this.opts.resumable,
            onReplayed: (n: number) => this.opts.resumeMetrics.replayedBytes.inc(n),
          }
        : undefined;
    const { metrics, auditor, party } = this.opts;
    return connectToServer({
      ...(resume ? { resume } : {}),
      target: endpoint.target,
      tls: tls.serverName === undefined && endpoint.resolved ? { ...tls, serverName: endpoint.name } : tls,
      agentID: this.opts.agentID,
      agentIdentifiers: this.opts.agentIdentifiers,
      token: this.opts.token,
      features: this.opts.features ?? (resumeTimeoutMs > 0 ? RESUMING_AGENT_FEATURES : AGENT_FEATURES),
      targets: this.opts.targets?.map((t) => t.destination),
      transport: this.transport,
      dialHandler: this.dialForServer,
      ...(this.opts.resolveHandler ? { resolveHandler: this.opts.resolveHandler } : {}),
      limits: this.opts.limits,
      allowance: (serverID) => this.allowances.allowanceFor('', serverID, resolveLimits(this.opts.limits)),
      connectTimeoutMs: this.opts.connectTimeoutMs,
      log: this.opts.log,
      // The agent performs control plane -> node dials and requests node -> control plane ones.
      onConnectionClosed: (c, serverID) => {
        metrics.connectionClosed(
          c.role === 'performer' ? 'cp_to_node' : 'node_to_cp',
          c.bytesOut,
          c.bytesIn,
          (Date.now() - c.openedAt) / 1000,
        );
        auditor.connectionEnded(c, party(serverID, endpoint.target));
      },
      onInboundDialFailed: (f, serverID) => auditor.inboundDialFailed('performer', party(serverID, endpoint.target), f),
      onLimit: (limit, reason) => countTunnelLimit(metrics, limit, reason),
      refusalReasons: SERVER_TUNNEL_REFUSALS,
      limitFlags: SERVER_TUNNEL_LIMIT_FLAGS,
      onPeerFault: (reason) => {
        metrics.refusals.inc({ reason });
        metrics.recent.add(reason);
      },
    });
  }

  /** What a connect to `endpoint` offers and checks, for the diagnosis of its failure. */
  attempt(endpoint: ServerEndpoint): ConnectAttempt {
    const { tls } = this.opts.server;
    const host = endpoint.resolved ? endpoint.name : parseHostPort(endpoint.target).host;
    return {
      target: endpoint.target,
      verifyName: tls.serverName ?? host,
      clientCertificate: tls.cert !== undefined,
      token: this.opts.token !== undefined,
      connectTimeoutMs: this.opts.connectTimeoutMs,
    };
  }

  /** Performs a control plane -> node dial. */
  private dialForServer = (dial: InboundDial): Promise<Duplex> => {
    const t0 = performance.now();
    return dialTcp(dial.address, { timeoutMs: this.opts.dialTimeoutMs, signal: dial.signal }).then(
      (socket) => {
        this.opts.metrics.dialDone('cp_to_node', 'ok', t0);
        return socket;
      },
      (err: Error) => {
        this.opts.metrics.dialDone('cp_to_node', err instanceof DialError ? err.failure : 'refused', t0);
        throw err;
      },
    );
  };
}
