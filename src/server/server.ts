/**
 * Kanal proxy server: wires the agent listener, the frontends, routing,
 * the allow-list and health together, and takes them down in order.
 */
import type { Logger } from 'pino';
import type { GrpcServerTransport } from '../transport/transport.js';
import type { Tunnel } from '../tunnel/tunnel.js';
import { Feature, type FeatureSet } from '../wire/features.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { KanalMetrics } from '../domain/metrics.js';
import { registerUpstreamServerMetrics, type UpstreamServerLeaseMetrics } from '../domain/upstream-metrics.js';
import { ConnectionBudget } from '../domain/connection-budget.js';
import { defaultNodeToCpConnections, openFilesLimit } from '../common/open-files-limit.js';
import { AgentRegistry } from './agents/agent-registry.js';
import { AllowList } from './destinations/allow-list.js';
import { createAgentService } from './agents/agent-service.js';
import { BackendDialer } from './frontends/backend-dialer.js';
import { DestinationDialer } from './destinations/destination-dialer.js';
import { createGrpcFrontend } from './frontends/grpc-frontend.js';
import { HttpConnectFrontend } from './frontends/http-connect-frontend.js';
import { listenForAgents, listenForFrontends, type Listener } from './listeners.js';
import { Refusals } from '../domain/refusal-log.js';
import { listenError } from '../common/listen-error.js';
import { assertRolesSeparated, ClientRoles, NO_PINS } from './identity/client-roles.js';
import type { AgentCredential } from './identity/agent-credential.js';
import { DEFAULT_PROXY_STRATEGIES } from './routing/proxy-strategies.js';
import { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';
import { feedLeaseMetrics, registerServerGauges } from './server-gauges.js';

export { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';

const SERVER_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

/** Streams one agent connection may have open: agents use one; room for a second while one closes. */
const MAX_STREAMS_PER_AGENT_CONNECTION = 2;

/**
 * Where a KanalServer is in its life; it only moves forward (transition()), so
 * a server starts at most once.
 * - created: nothing bound; the gauges are registered (constructor).
 * - starting: start() binds the listeners and the health port; stop() waits
 *   for it to finish, then stops what it started.
 * - listening: every listener serves; the lease controller runs.
 * - stopping: stop() takes everything down; another stop() waits for the same end.
 * - stopped: listeners, tunnels, gRPC servers and the health port released
 *   (also after a start that failed); a stop() again does nothing, a start() throws.
 * Invariants: listeners are bound only in 'starting' and never again after it;
 * the lease controller starts at the end of 'starting', once every listener
 * serves, and is stopped first in 'stopping'.
 */
export type ServerState =
  | { readonly kind: 'created' }
  | { readonly kind: 'starting'; readonly started: Promise<void> }
  | { readonly kind: 'listening' }
  | { readonly kind: 'stopping'; readonly stopped: Promise<void> }
  | { readonly kind: 'stopped' };

/** The moves transition() allows. */
const NEXT_STATES: Readonly<Record<ServerState['kind'], readonly ServerState['kind'][]>> = {
  created: ['starting', 'stopped'],
  starting: ['listening', 'stopped'],
  listening: ['stopping'],
  stopping: ['stopped'],
  stopped: [],
};

export class KanalServer {
  readonly registry: AgentRegistry;
  readonly metrics = new KanalMetrics('server');
  /** See ServerState; changed only by transition(). */
  private current: ServerState = { kind: 'created' };
  private readonly frontendTunnels = new Set<Tunnel>();
  /** Node -> control plane connections of all agents together (file descriptors here). */
  private readonly nodeToCp: ConnectionBudget;
  /** Set while starting and kept once closed, so their ports can still be read (tests, logs). */
  private agentListener: Listener | undefined;
  private frontendListener: Listener | undefined;
  private health: HealthServer | undefined;
  private httpConnect: HttpConnectFrontend | undefined;
  /** Upstream's lease metric names, for the lease controller to feed. */
  readonly upstreamLeaseMetrics: UpstreamServerLeaseMetrics;
  private closers: (() => Promise<void>)[] = [];
  /** Report the refusals still held back by rate limiting (at stop). */
  private flushers: (() => void)[] = [];

  constructor(private readonly opts: ServerOptions) {
    this.registry = new AgentRegistry(opts.agent.maxAgentsPerCredential ?? 1);
    const agentTunnels = (): Tunnel[] => this.registry.list().map((b) => b.tunnel);
    this.upstreamLeaseMetrics = registerUpstreamServerMetrics(this.metrics.registry, {
      agentStreams: () => this.registry.size,
      proxyStreams: () => this.frontendTunnels.size,
      httpConnectConnections: () => this.httpConnect?.size ?? 0,
      readyAgents: () => this.registry.agentCount,
      pendingDials: () => agentTunnels().reduce((n, t) => n + t.stats().pendingDials, 0),
      establishedConnections: () => agentTunnels().reduce((n, t) => n + t.stats().connections, 0),
      pausedAgentStreams: () => agentTunnels().filter((t) => t.stats().readPaused).length,
      pausedProxyStreams: () => [...this.frontendTunnels].filter((t) => t.stats().readPaused).length,
    });
    this.nodeToCp = new ConnectionBudget(opts.maxNodeToCpConnections ?? defaultNodeToCpConnections());
    registerServerGauges(this.metrics, { registry: this.registry, frontendTunnels: this.frontendTunnels, nodeToCp: this.nodeToCp });
  }

  /** Where the server is in its life (ServerState). */
  get state(): ServerState['kind'] {
    return this.current.kind;
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

  /**
   * Starts every listener. On failure everything already started is
   * released (the Unix socket file included, so the next start is not
   * blocked by it) before the error is rethrown, and the server is stopped.
   * Throws unless the server is new: a server starts once.
   */
  async start(): Promise<void> {
    const s = this.current;
    if (s.kind !== 'created') throw new Error(`the server cannot start when ${s.kind}: a KanalServer starts once (create a new one)`);
    // Deferred a turn, so the state says 'starting' before anything is bound.
    const started = Promise.resolve().then(() => this.bringUp());
    this.transition({ kind: 'starting', started });
    return started;
  }

  private async bringUp(): Promise<void> {
    try {
      await this.startListeners();
    } catch (err) {
      await this.release();
      this.transition({ kind: 'stopped' });
      throw err;
    }
    const { serverID, serverCount, agent, leases } = this.opts;
    const keepalive = agent.keepalive ?? DEFAULT_AGENT_KEEPALIVE;
    const tokens = agent.tokens && {
      user: agent.tokens.expectedUsername,
      audience: agent.tokens.audience,
      clientCertificate: agent.tls.ca ? 'required' : 'not asked for',
    };
    if (leases) {
      feedLeaseMetrics(leases, this.upstreamLeaseMetrics);
      leases.start();
    }
    const lease = leases && { name: leases.leaseName, namespace: leases.namespace, labels: leases.selector };
    const proxyStrategies = (this.opts.proxyStrategies ?? DEFAULT_PROXY_STRATEGIES).join(',');
    this.transition({ kind: 'listening' });
    this.opts.log.info(
      { serverID, serverCount, maxAgentsPerCredential: this.registry.maxAgentsPerCredential, proxyStrategies, keepalive, tokens, lease },
      'kanal server started',
    );
  }

  /** Binds the frontend, the agent port and the health port, in that order; what it started is released by release(). */
  private async startListeners(): Promise<void> {
    const { opts } = this;
    const roles = new ClientRoles(opts.agent.clientPins ?? NO_PINS, opts.frontend.tcp?.clientPins ?? NO_PINS);
    assertRolesSeparated(opts.agent.tls.ca, opts.frontend.tcp?.tls.ca, roles);
    const logs = { frontend: opts.log.child({ part: 'frontend' }), agents: opts.log.child({ part: 'agents' }) };
    const refusals = { frontend: this.refusals(logs.frontend), agents: this.refusals(logs.agents) };
    const destinations = this.destinationDialer();
    const agentGrpc = this.startAgentGrpc(destinations, logs.agents, refusals.agents);
    const { frontendGrpc, httpConnect } = this.startFrontends(logs.frontend, refusals.frontend);
    this.frontendListener = await listenForFrontends({
      mode: opts.frontend.mode,
      uds: opts.frontend.uds,
      tcp: opts.frontend.tcp && { ...opts.frontend.tcp, roles },
      requestHeadTimeoutMs: opts.frontend.headerTimeoutMs,
      grpc: frontendGrpc,
      httpConnect,
      log: logs.frontend,
      refusals: refusals.frontend,
    });
    this.agentListener = await listenForAgents({
      host: opts.agent.host,
      port: opts.agent.port,
      tls: opts.agent.tls,
      allowUnauthenticated: opts.agent.allowUnauthenticated,
      tokenAuthentication: !!opts.agent.tokens,
      roles,
      grpc: agentGrpc,
      log: logs.agents,
      refusals: refusals.agents,
    });
    await this.startHealth();
  }

  /** Node -> control plane dials: the allow-list within the server-wide budget, both logged as the server starts. */
  private destinationDialer(): DestinationDialer {
    const { opts, nodeToCp } = this;
    const log = opts.log;
    const openFiles = openFilesLimit();
    if (openFiles !== undefined && nodeToCp.limit >= openFiles) {
      log.warn(
        { maxNodeToCpConnections: nodeToCp.limit, openFilesLimit: openFiles },
        '--max-node-to-cp-connections leaves no file descriptors for frontends and health: lower it or raise the open-files limit',
      );
    }
    const allowList = new AllowList(opts.allowedDestinations);
    if (allowList.empty) log.info('no --allowed-destination: every node -> control plane dial will be refused');
    else
      log.info(
        { allowed: allowList.list(), maxConnections: nodeToCp.limit, openFilesLimit: openFiles },
        'node -> control plane destinations allowed',
      );
    const nodeDialLog = log.child({ part: 'node-dial' });
    return new DestinationDialer({
      allowList,
      timeoutMs: opts.destinationDialTimeoutMs,
      budget: nodeToCp,
      log: nodeDialLog,
      refusals: this.refusals(nodeDialLog),
      metrics: this.metrics,
    });
  }

  /** The gRPC server of the agent port: AgentService/Connect, with keepalive PINGs. */
  private startAgentGrpc(destinations: DestinationDialer, agentLog: Logger, agentRefusals: Refusals): GrpcServerTransport<AgentCredential> {
    const { opts, metrics } = this;
    const keepalive = opts.agent.keepalive ?? DEFAULT_AGENT_KEEPALIVE;
    const agentGrpc = opts.transport.createServer<AgentCredential>(
      {
        agentConnect: createAgentService({
          serverID: opts.serverID,
          serverCount: opts.serverCount,
          registry: this.registry,
          destinations,
          features: SERVER_FEATURES,
          limits: { ...opts.limits, ...opts.agentLimits },
          log: agentLog,
          metrics,
          refusals: agentRefusals,
          tokens: opts.agent.tokens && { authenticator: opts.agent.tokens },
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
    return agentGrpc;
  }

  /** The KAS's side: the gRPC ProxyService and HTTP CONNECT, both dialling through agents with one BackendDialer. */
  private startFrontends(
    frontendLog: Logger,
    frontendRefusals: Refusals,
  ): { frontendGrpc: GrpcServerTransport; httpConnect: HttpConnectFrontend } {
    const { opts, metrics } = this;
    const dialer = new BackendDialer({
      registry: this.registry,
      timeoutMs: opts.backendDialTimeoutMs,
      log: frontendLog,
      metrics,
      refusals: frontendRefusals,
      strategies: opts.proxyStrategies,
    });
    const frontendGrpc = opts.transport.createServer(
      {
        proxy: createGrpcFrontend({ dialer, log: frontendLog, track: (t) => this.trackFrontend(t), limits: opts.limits, metrics }),
      },
      { maxReceiveMessageBytes: opts.maxReceiveMessageBytes },
    );
    this.closers.push(() => frontendGrpc.close(1000));
    const httpConnect = new HttpConnectFrontend(dialer, this.refusals(opts.log.child({ part: 'frontend', frontend: 'http-connect' })));
    this.httpConnect = httpConnect;
    return { frontendGrpc, httpConnect };
  }

  private async startHealth(): Promise<void> {
    if (!this.opts.health) return;
    const { host, port } = this.opts.health;
    const { metrics, opts } = this;
    this.health = await startHealthServer({
      host,
      port,
      readiness: () => this.readiness(),
      registry: metrics.registry,
      log: opts.log,
    }).catch((err: unknown) => {
      throw listenError(err, `${host}:${port}`, '--health-bind-address, --health-port');
    });
  }

  /** A Refusals for one part of the server, flushed when it stops. */
  private refusals(log: Logger): Refusals {
    const r = new Refusals(log, this.metrics);
    this.flushers.push(() => r.flush());
    return r;
  }

  /**
   * Stops listening, closes every tunnel and connection. Safe in any state:
   * before start() it only marks the server stopped, during start() it waits
   * for it, a second call waits for the first.
   */
  async stop(): Promise<void> {
    const s = this.current;
    switch (s.kind) {
      case 'created':
        this.transition({ kind: 'stopped' });
        return;
      case 'starting':
        await s.started.catch(() => undefined);
        return this.stop();
      case 'listening': {
        // Deferred a turn, so the state says 'stopping' before anything closes.
        const stopped = Promise.resolve().then(() => this.takeDown());
        this.transition({ kind: 'stopping', stopped });
        return stopped;
      }
      case 'stopping':
        return s.stopped;
      case 'stopped':
        return;
    }
  }

  private async takeDown(): Promise<void> {
    try {
      // The lease goes first: agents counting leases stop counting this server at once.
      await this.opts.leases?.stop();
    } finally {
      // Released even when the lease could not be deleted: nothing may stay bound.
      await this.release();
      this.transition({ kind: 'stopped' });
    }
    this.opts.log.info('kanal server stopped');
  }

  /** Moves along NEXT_STATES; any other move is a bug here and throws. */
  private transition(next: ServerState): void {
    if (!NEXT_STATES[this.current.kind].includes(next.kind))
      throw new Error(`server: no transition from ${this.current.kind} to ${next.kind}`);
    this.current = next;
  }

  /** Releases whatever start() got to; safe at any point of it (closing a listener again does nothing). */
  private async release(): Promise<void> {
    await this.frontendListener?.close();
    await this.agentListener?.close();
    for (const t of this.frontendTunnels) t.close();
    for (const b of this.registry.list()) b.tunnel.close();
    await Promise.all(this.closers.map((c) => c()));
    this.closers = [];
    await this.health?.close();
    for (const flush of this.flushers.splice(0)) flush();
  }

  private trackFrontend(tunnel: Tunnel): void {
    this.frontendTunnels.add(tunnel);
    tunnel.once('close', () => this.frontendTunnels.delete(tunnel));
  }
}
