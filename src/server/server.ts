/**
 * Kanal proxy server: wires the agent listener, the frontends, routing,
 * the allow-list and health together, and takes them down in order.
 */
import type { Logger } from 'pino';
import type { Transport } from '../transport/transport.js';
import type { TunnelLimits } from '../tunnel/limits.js';
import { Tunnel, type TunnelStats } from '../tunnel/tunnel.js';
import { Feature, type FeatureSet } from '../wire/features.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { KanalMetrics } from '../common/metrics.js';
import { AgentRegistry } from './agent-registry.js';
import { AllowList } from './allow-list.js';
import { createAgentService } from './agent-service.js';
import { BackendDialer } from './backend-dialer.js';
import { DestinationDialer } from './destination-dialer.js';
import { createGrpcFrontend } from './grpc-frontend.js';
import { createHttpConnectFrontend } from './http-connect-frontend.js';
import { listenForAgents, listenForFrontends, type FrontendMode, type Listener, type TlsFiles } from './listeners.js';
import { assertRolesSeparated, ClientRoles, NO_PINS, type RolePins } from './client-roles.js';
import type { AgentCredential } from './agent-credential.js';
import type { KeepaliveOptions } from '../transport/liveness.js';

export interface ServerOptions {
  serverID: string;
  serverCount: number;
  agent: {
    host: string;
    port: number;
    tls: TlsFiles;
    allowUnauthenticated: boolean;
    /** Client certificates of agents must match these (when set) and never the frontend's. */
    clientPins?: RolePins;
    /** Agents (distinct agentIDs) one credential may hold on this server. Default 1. */
    maxAgentsPerCredential?: number;
    /** Server PINGs on agent connections. Default DEFAULT_AGENT_KEEPALIVE. */
    keepalive?: Omit<KeepaliveOptions, 'onTimeout'>;
  };
  frontend: {
    mode: FrontendMode;
    uds?: { path: string; deleteExisting: boolean };
    /** `clientPins`: the KAS's client certificate must match these (when set) and never the agents'. */
    tcp?: { host: string; port: number; tls: TlsFiles; clientPins?: RolePins };
  };
  health?: { host: string; port: number };
  backendDialTimeoutMs: number;
  allowedDestinations: readonly string[];
  destinationDialTimeoutMs: number;
  maxReceiveMessageBytes: number;
  transport: Transport;
  limits?: Partial<TunnelLimits>;
  log: Logger;
}

export interface ServerStats {
  agents: number;
  frontendStreams: number;
  agentTunnels: (TunnelStats & { agentID: string; credential: string })[];
  frontendTunnels: TunnelStats[];
}

const SERVER_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

/** An agent that misses PINGs for this long is closed; quiet (avoided) after QUIET_AFTER_MS already. */
export const DEFAULT_AGENT_KEEPALIVE = { intervalMs: 10_000, timeoutMs: 20_000 };
/** Streams one agent connection may have open: agents use one; room for a second while one closes. */
const MAX_STREAMS_PER_AGENT_CONNECTION = 2;

export class KanalServer {
  readonly registry: AgentRegistry;
  readonly metrics = new KanalMetrics('server');
  private readonly frontendTunnels = new Set<Tunnel>();
  private agentListener: Listener | undefined;
  private frontendListener: Listener | undefined;
  private health: HealthServer | undefined;
  private closers: (() => Promise<void>)[] = [];

  constructor(private readonly opts: ServerOptions) {
    this.registry = new AgentRegistry(opts.agent.maxAgentsPerCredential ?? 1);
  }

  get agentPort(): number {
    return this.agentListener?.port ?? 0;
  }

  get frontendPort(): number {
    return this.frontendListener?.port ?? 0;
  }

  get healthPort(): number {
    return this.health?.port ?? 0;
  }

  readiness(): Readiness {
    const n = this.registry.size;
    return n > 0 ? { ready: true, detail: `${n} agent(s) connected` } : { ready: false, detail: 'no agent connected' };
  }

  stats(): ServerStats {
    return {
      agents: this.registry.size,
      frontendStreams: this.frontendTunnels.size,
      agentTunnels: this.registry.list().map((b) => ({ agentID: b.agentID, credential: b.credential.subject, ...b.tunnel.stats() })),
      frontendTunnels: [...this.frontendTunnels].map((t) => t.stats()),
    };
  }

  async start(): Promise<void> {
    const { opts } = this;
    const log = opts.log;
    const metrics = this.metrics;
    const roles = new ClientRoles(opts.agent.clientPins ?? NO_PINS, opts.frontend.tcp?.clientPins ?? NO_PINS);
    assertRolesSeparated(opts.agent.tls.ca, opts.frontend.tcp?.tls.ca, roles);
    metrics.gauge('kanal_server_agents', 'Agent tunnels connected to this server', () => this.registry.size);
    metrics.gauge('kanal_server_agent_identities', 'Distinct agents (credential + agentID) connected to this server', () => this.registry.agentCount);
    metrics.gauge('kanal_server_agent_tunnels_quiet', 'Agent tunnels whose liveness PING is unanswered (dials avoid them)', () =>
      this.registry.list().filter((b) => b.liveness?.quiet).length,
    );
    metrics.gauge('kanal_server_frontend_streams', 'gRPC frontend streams open', () => this.frontendTunnels.size);
    metrics.gauge('kanal_server_connections_open', 'Tunnelled connections open through agents', () =>
      this.registry.list().reduce((n, b) => n + b.tunnel.stats().connections, 0),
    );
    metrics.gauge('kanal_server_pending_dials', 'Dials through agents waiting for an answer', () =>
      this.registry.list().reduce((n, b) => n + b.tunnel.stats().pendingDials, 0),
    );
    metrics.gauge('kanal_server_window_growth_bytes', 'Receive-window growth (beyond the first window) held by connections on agent tunnels and frontend streams', () =>
      [...this.registry.list().map((b) => b.tunnel), ...this.frontendTunnels].reduce((n, t) => n + t.stats().windowGrowthBytes, 0),
    );
    const refused = (reason: string): void => metrics.refusals.inc({ reason });
    const allowList = new AllowList(opts.allowedDestinations);
    if (allowList.empty) log.info('no --allowed-destination: every node -> control plane dial will be refused');
    else log.info({ allowed: allowList.list() }, 'node -> control plane destinations allowed');

    const keepalive = opts.agent.keepalive ?? DEFAULT_AGENT_KEEPALIVE;
    const agentLog = log.child({ part: 'agents' });
    const agentGrpc = opts.transport.createServer<AgentCredential>(
      {
        agentConnect: createAgentService({
          serverID: opts.serverID,
          serverCount: opts.serverCount,
          registry: this.registry,
          destinations: new DestinationDialer(allowList, opts.destinationDialTimeoutMs, log.child({ part: 'node-dial' }), metrics),
          features: SERVER_FEATURES,
          limits: opts.limits,
          log: agentLog,
          metrics,
        }),
      },
      {
        maxReceiveMessageBytes: opts.maxReceiveMessageBytes,
        maxConcurrentStreams: MAX_STREAMS_PER_AGENT_CONNECTION,
        keepalive: {
          ...keepalive,
          onTimeout: (peer, reason) => {
            agentLog.warn({ peer, reason }, 'closing agent connection: it stopped answering PINGs');
            metrics.deadTunnels.inc({ reason: 'keepalive_timeout' });
          },
        },
      },
    );
    this.closers.push(() => agentGrpc.close(1000));

    const backendDialer = new BackendDialer(this.registry, opts.backendDialTimeoutMs, log.child({ part: 'frontend' }), metrics);
    const frontendGrpc = opts.transport.createServer(
      {
        proxy: createGrpcFrontend(backendDialer, log.child({ part: 'frontend' }), (t) => this.trackFrontend(t), opts.limits),
      },
      { maxReceiveMessageBytes: opts.maxReceiveMessageBytes },
    );
    this.closers.push(() => frontendGrpc.close(1000));
    const httpConnect = createHttpConnectFrontend(backendDialer, log.child({ part: 'frontend', frontend: 'http-connect' }));

    this.frontendListener = await listenForFrontends({
      mode: opts.frontend.mode,
      uds: opts.frontend.uds,
      tcp: opts.frontend.tcp && { ...opts.frontend.tcp, roles },
      grpc: frontendGrpc,
      httpConnect,
      log: log.child({ part: 'frontend' }),
      refused,
    });
    this.agentListener = await listenForAgents({
      host: opts.agent.host,
      port: opts.agent.port,
      tls: opts.agent.tls,
      allowUnauthenticated: opts.agent.allowUnauthenticated,
      roles,
      grpc: agentGrpc,
      log: agentLog,
      refused,
    });
    if (opts.health) {
      this.health = await startHealthServer({ ...opts.health, readiness: () => this.readiness(), registry: metrics.registry, log });
    }
    log.info(
      { serverID: opts.serverID, serverCount: opts.serverCount, maxAgentsPerCredential: this.registry.maxAgentsPerCredential, keepalive },
      'kanal server started',
    );
  }

  /** Stops listening, closes every tunnel and connection. */
  async stop(): Promise<void> {
    await this.frontendListener?.close();
    await this.agentListener?.close();
    for (const t of this.frontendTunnels) t.close();
    for (const b of this.registry.list()) b.tunnel.close();
    await Promise.all(this.closers.map((c) => c()));
    this.closers = [];
    await this.health?.close();
    this.opts.log.info('kanal server stopped');
  }

  private trackFrontend(tunnel: Tunnel): void {
    this.frontendTunnels.add(tunnel);
    tunnel.once('close', () => this.frontendTunnels.delete(tunnel));
  }
}
