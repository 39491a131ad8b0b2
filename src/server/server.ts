/**
 * Kanal proxy server: the listeners (agent port, frontends, health) and the
 * tenants they hand connections to (tenants/tenant.ts), started and taken
 * down in order. Without --tenants-config there is one unnamed tenant from
 * the flags; with it, every tenant of the file, recognised per connection
 * by tenants/tenant-directory.ts and changed live (docs/multi-tenant.md).
 */
import { ConnectionAuditor } from '../audit/connection-auditor.js';
import { ProcessAuditLog } from '../audit/process-audit-log.js';
import type { GrpcServerTransport, IncomingStream } from '../transport/transport.js';
import { GrpcStatus } from '../transport/grpc-status.js';
import { AGENT_NOT_AUTHENTICATED } from './identity/peer-refusals.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { TokenAuthenticator } from './identity/token-authenticator.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { KanalMetrics } from '../domain/metrics.js';
import { ConnectionBudget } from '../domain/connection-budget.js';
import { defaultNodeToCpConnections, openFilesLimit } from '../common/open-files-limit.js';
import { defaultMemoryBudget } from '../common/memory-limit.js';
import { RetentionLedger } from '../domain/retention-ledger.js';
import type { AgentRegistry } from './agents/agent-registry.js';
import { listenForAgents, listenForFrontends, peerOf, type FrontendConnection, type Listener } from './listeners.js';
import { formatHostPort } from '../common/host-port.js';
import { Refusals } from '../domain/refusal-log.js';
import { listenError } from '../common/listen-error.js';
import { assertRolesSeparated, ClientRoles, NO_PINS } from './identity/client-roles.js';
import type { AgentConnection } from './identity/agent-credential.js';
import { MD_AUTHORIZATION } from '../wire/metadata.js';
import { DEFAULT_PROXY_STRATEGIES } from './routing/proxy-strategies.js';
import type { UpstreamServerLeaseMetrics } from '../domain/upstream-metrics.js';
import { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';
import { feedLeaseMetrics } from './tenants/tenant-gauges.js';
import { Tenant, type TenantSettingsOptions } from './tenants/tenant.js';
import { sharedTenantServer } from './workers/worker-server.js';
import type { TenantDirectory } from './tenants/tenant-directory.js';
import type { TenantDefinition } from './tenants/tenant-definition.js';
import { reloadCounter } from './tenants/tenants-watch.js';
import { watchClientsFile, type ClientsFileWatch } from './tenants/clients-file-watch.js';
import { ONE_CLUSTER, TenantRooms, type ReloadResult, type Room } from './tenants/tenant-rooms.js';
import { listenForHandoffs } from './workers/handoff.js';
import { WorkerRelay } from './workers/relay.js';
import type { FrontendServices, TenantFrontend } from './frontends/frontend.js';
import net from 'node:net';
import { StateMachine, type Lifecycle } from '../common/state-machine.js';
import { mergeExpositions, renderEach } from '../common/metrics-text.js';
import { serverStatus } from './server-status.js';
import { StatusIndex } from './status-index.js';
import type { ServerStatusDocument } from '../domain/status-document.js';
import type { StatusQuery } from '../domain/status-query.js';

export { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';
export type { ReloadResult } from './tenants/tenant-rooms.js';

/** Streams one agent connection may have open: agents use one; room for a second while one closes. */
const MAX_STREAMS_PER_AGENT_CONNECTION = 2;
/**
 * Where a KanalServer is in its life; it only moves forward (SERVER_LIFECYCLE), so
 * a server starts at most once.
 * - created: nothing bound; the gauges are registered (constructor).
 * - starting: start() binds the listeners and the health port; stop() waits
 *   for it to finish, then stops what it started.
 * - listening: every listener serves; the lease controller runs.
 * - stopping: stop() takes everything down; another stop() waits for the same end.
 * - stopped: listeners, tunnels, gRPC servers and the health port released
 *   (also after a start that failed); a stop() again does nothing, a start() throws.
 * Invariants: the shared listeners (agent port, frontend, health) are bound
 * only in 'starting' and never again after it (a tenant's own socket is bound
 * when the tenant starts, also on a reload while 'listening');
 * the lease controller starts at the end of 'starting', once every listener
 * serves, and is stopped first in 'stopping'.
 */
export type ServerState =
  | { readonly kind: 'created' }
  | { readonly kind: 'starting'; readonly started: Promise<void> }
  | { readonly kind: 'listening' }
  | { readonly kind: 'stopping'; readonly stopped: Promise<void> }
  | { readonly kind: 'stopped' };

/** The moves a server's state may make (state-machine.ts). */
const SERVER_LIFECYCLE: Lifecycle<ServerState> = {
  name: 'server',
  moves: {
    created: ['starting', 'stopped'],
    starting: ['listening', 'stopped'],
    listening: ['stopping'],
    stopping: ['stopped'],
    stopped: [],
  },
};

export class KanalServer {
  /** The process's metrics, and the tenant's on a server of one cluster. */
  readonly metrics = new KanalMetrics('server');
  /** See ServerState; moved only along SERVER_LIFECYCLE, each move a debug line. */
  private readonly machine: StateMachine<ServerState>;
  /** Node -> control plane connections of all agents together (file descriptors here). */
  private readonly nodeToCp: ConnectionBudget;
  /** What serves each tenant (one room, ONE_CLUSTER, without --tenants-config), and the file's reloads. */
  private readonly rooms: TenantRooms;
  /** A worker of several: what relays another worker's tenants' connections there. */
  private readonly relay: WorkerRelay | undefined;
  /** Set while starting and kept once closed, so their ports can still be read (tests, logs). */
  private agentListener: Listener | undefined;
  private frontendListener: Listener | undefined;
  /** ServerOptions.frontend.extra, as bound. */
  private extraListeners: Listener[] = [];
  private health: HealthServer | undefined;
  private closers: (() => Promise<void>)[] = [];
  /** One cluster's --frontend-clients-config, watched once the server listens. */
  private clientsWatch: ClientsFileWatch | undefined;
  /** Report the refusals still held back by rate limiting (at stop). */
  private flushers: (() => void)[] = [];
  private readonly log: ServerOptions['log'];
  /** Listener-level refusals (before a tenant is known): counted in the process's metrics. */
  private readonly refusalLogs: { frontend: Refusals; agents: Refusals };
  private frontendGrpc: GrpcServerTransport<FrontendConnection> | undefined;
  private agentGrpc: GrpcServerTransport<AgentConnection> | undefined;
  /** What every tenant's connections hold, and the process's budget for it (--memory-budget). */
  readonly ledger: RetentionLedger;
  /** --audit-log-path: opened by bringUp(), closed after everything else by release(). */
  private readonly audit: ProcessAuditLog | undefined;

  constructor(private readonly opts: ServerOptions) {
    this.log = opts.log;
    this.machine = new StateMachine<ServerState>({ kind: 'created' }, SERVER_LIFECYCLE, (from, to) =>
      this.log.debug({ from: from.kind, to: to.kind }, 'server state'),
    );
    this.audit = opts.auditLog && new ProcessAuditLog(opts.auditLog);
    this.nodeToCp = new ConnectionBudget(opts.maxNodeToCpConnections ?? defaultNodeToCpConnections());
    this.ledger = new RetentionLedger({ budgetBytes: opts.memoryBudgetBytes || defaultMemoryBudget() });
    this.refusalLogs = {
      frontend: this.refusals(opts.log.child({ part: 'frontend' })),
      agents: this.refusals(opts.log.child({ part: 'agents' })),
    };
    const worker = opts.worker;
    // The primary merges its workers' /metrics: each worker's series carry its index.
    if (worker) this.metrics.registry.setDefaultLabels({ worker: String(worker.index) });
    // A worker of one cluster is a server of its own to every agent: nothing to relay (docs/multi-tenant.md, "Workers of one cluster").
    this.relay =
      worker &&
      opts.tenants &&
      new WorkerRelay({
        worker,
        shareOf: (tenant) => this.rooms.shareOf(tenant),
        tenantOfToken: (authorization) => this.rooms.directory?.tenantOfToken(authorization),
        hasTokenIssuers: () => this.rooms.directory?.hasTokenIssuers() ?? false,
        peerOf: (connection) => (connection instanceof net.Socket ? peerOf(connection, 'unknown') : 'unknown'),
        log: this.log,
      });
    const tenants = opts.tenants;
    if (!tenants) {
      this.rooms = TenantRooms.oneCluster(this.oneCluster());
    } else {
      this.rooms = new TenantRooms({
        ...tenants,
        tenantFrom: (loaded, tokens) => this.tenantFrom(loaded, tokens),
        listenSocket: (room) => this.listenTenantSocket(room),
        owns: (tenant, share) => this.relay?.ownsShared(tenant, share) ?? true,
        settingsOf: (loaded) => this.servedOptions(loaded),
        refusal: () => (this.machine.is('listening') ? undefined : `the server is ${this.machine.kind}`),
        reloads: reloadCounter(this.metrics.registry),
        log: this.log,
      });
      this.metrics.gauge('kanal_server_tenants', `Tenants this server serves (${opts.flags.tenantsConfig})`, () => this.rooms.size);
    }
  }

  /** The tenant of a server without --tenants-config, from its options, sharing the server's metrics. */
  private oneCluster(): Tenant {
    const o = this.opts;
    return new Tenant({
      ...o.tenant,
      serverID: o.serverID,
      resumeTimeoutMs: o.agent.resumeTimeoutMs ?? 0,
      tokens: o.agent.tokens,
      nodeToCp: this.nodeToCp,
      ledger: this.ledger,
      metrics: this.metrics,
      log: o.log,
      ...(this.audit ? { audit: this.audit } : {}),
    });
  }

  /** A tenant's options as this process serves it: a tenant shared by several workers is a server of its own on each (workers/worker-server.ts). */
  private servedOptions(loaded: TenantDefinition): TenantSettingsOptions {
    const worker = this.opts.worker;
    return worker ? { ...loaded.options, serverCount: sharedTenantServer(this.opts.serverID, loaded, worker).serverCount } : loaded.options;
  }

  /** A tenant of the file, in its own metrics and log lines. */
  private tenantFrom(loaded: TenantDefinition, tokens: TokenAuthenticator | undefined): Tenant {
    const name = loaded.name;
    const worker = this.opts.worker;
    const placed = worker ? sharedTenantServer(this.opts.serverID, loaded, worker) : { shared: false, serverID: this.opts.serverID };
    const metrics = new KanalMetrics('server', name);
    // Its series from each of its workers, merged by the primary, stay apart (a tenant of one worker has one set).
    if (worker && placed.shared) metrics.registry.setDefaultLabels({ tenant: name, worker: String(worker.index) });
    return new Tenant({
      ...this.servedOptions(loaded),
      ...(tokens ? { tokens } : {}),
      name,
      serverID: placed.serverID,
      resumeTimeoutMs: this.opts.agent.resumeTimeoutMs ?? 0,
      nodeToCp: this.nodeToCp,
      ledger: this.ledger,
      metrics,
      log: this.log.child({ tenant: name }),
      ...(this.audit ? { audit: this.audit } : {}),
    });
  }

  /** Where the server is in its life (ServerState). */
  get state(): ServerState['kind'] {
    return this.machine.kind;
  }

  /** The agents of a server of one cluster (tests and the in-process kit read it). */
  get registry(): AgentRegistry {
    return this.tenant(ONE_CLUSTER).registry;
  }

  /** Upstream's lease metric names of a server of one cluster, for the lease controller to feed. */
  get upstreamLeaseMetrics(): UpstreamServerLeaseMetrics {
    return this.tenant(ONE_CLUSTER).upstreamLeaseMetrics;
  }

  /** The tenant named `name` (ONE_CLUSTER: the one of a server without --tenants-config); throws when there is none. */
  tenant(name: string): Tenant {
    const room = this.rooms.get(name);
    if (!room)
      throw new Error(
        name === ONE_CLUSTER ? `this server has ${this.opts.flags.tenantsConfig}: name the tenant` : `no tenant ${JSON.stringify(name)}`,
      );
    return room.tenant;
  }

  /** Names of the tenants served (empty without --tenants-config). */
  get tenantNames(): string[] {
    return this.rooms.names();
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

  /**
   * One cluster: ready once an agent is connected (upstream's rule). Many: ready
   * once listening, since a tenant without nodes must not take the shared
   * server out of its load balancer; the detail lists every tenant, and
   * `?tenant=NAME` asks one tenant's question (an agent connected).
   */
  readiness(query?: URLSearchParams): Readiness {
    const one = query?.get('tenant');
    if (this.opts.tenants && one) {
      const room = this.rooms.get(one);
      if (!room) return { ready: false, detail: `no tenant ${JSON.stringify(one)} here` };
      return { ready: room.tenant.registry.size > 0, detail: `tenant ${one}: ${room.tenant.agentsDetail()}` };
    }
    if (!this.opts.tenants) {
      const n = this.registry.size;
      return n > 0 ? { ready: true, detail: `${n} agent(s) connected` } : { ready: false, detail: 'no agent connected' };
    }
    const lines = [...this.rooms.values()].map((r) => `tenant ${r.tenant.name ?? ''}: ${r.tenant.agentsDetail()}`);
    const ready = this.machine.is('listening');
    return { ready, detail: `${this.rooms.size} tenant(s)${lines.length > 0 ? `\n${lines.join('\n')}` : ''}` };
  }

  /** The agents of every tenant served (a worker tells its primary, workers/worker-link.ts). */
  agentCount(): number {
    return this.rooms.tenants().reduce((n, t) => n + t.registry.size, 0);
  }

  /** The agents of each tenant served (a worker tells its primary, which steers a shared tenant's connections by them). */
  agentsByTenant(): [string, number][] {
    return this.rooms.names().map((name) => [name, this.rooms.get(name)?.tenant.registry.size ?? 0]);
  }

  /** The tenants this process serves (a worker: its own share of the file). */
  tenantsServed(): string[] {
    return this.rooms.names();
  }

  stats(): ServerStats {
    const tenants = this.rooms.tenants();
    return {
      agents: tenants.reduce((n, t) => n + t.registry.size, 0),
      frontendStreams: tenants.reduce((n, t) => n + t.frontendTunnels.size, 0),
      agentTunnels: tenants.flatMap((t) =>
        t.registry.list().map((b) => ({
          agentID: b.agentID,
          credential: b.credential.subject,
          ...(t.name ? { tenant: t.name } : {}),
          ...b.tunnel.stats(),
        })),
      ),
      frontendTunnels: tenants.flatMap((t) => [...t.frontendTunnels].map((x) => x.stats())),
    };
  }

  /** Every tenant's agents in /status's order, walked at most once a second however often /status is asked. */
  private readonly statusIndex = new StatusIndex(() => this.rooms.tenants());

  /**
   * The admin port's /status: one page of its agents and their tunnels
   * (server-status.ts), or what is wrong with `query`. `build`: Kanal's version and commit.
   */
  status(build: { version: string; commit: string }, query: StatusQuery): ServerStatusDocument | { error: string } {
    return serverStatus(
      {
        serverID: this.opts.serverID,
        serverCount: this.opts.tenant.serverCount,
        state: this.machine.kind,
        tenants: this.rooms.tenants(),
        agents: this.statusIndex.agents(),
        named: this.opts.tenants !== undefined,
        metrics: this.metrics,
        build,
      },
      query,
    );
  }

  /** /metrics: the process's registry, with every tenant's labelled series beside it. */
  readonly metricsSource = {
    contentType: this.metrics.registry.contentType,
    metrics: async (): Promise<string> => {
      if (!this.opts.tenants) return this.metrics.registry.metrics();
      return mergeExpositions(await this.metricsTexts());
    },
  };

  /**
   * Starts every listener. On failure everything already started is
   * released (the Unix socket file included, so the next start is not
   * blocked by it) before the error is rethrown, and the server is stopped.
   * Throws unless the server is new: a server starts once.
   */
  async start(): Promise<void> {
    const s = this.machine.state;
    if (s.kind !== 'created') throw new Error(`the server cannot start when ${s.kind}: a KanalServer starts once (create a new one)`);
    // Deferred a turn, so the state says 'starting' before anything is bound.
    const started = Promise.resolve().then(() => this.bringUp());
    this.machine.to({ kind: 'starting', started });
    return started;
  }

  private async bringUp(): Promise<void> {
    try {
      await this.audit?.open(this.metrics.registry, this.log.child({ part: 'audit' }));
      if (this.opts.tenants) await this.rooms.addFromFile();
      await this.startListeners();
      for (const room of this.rooms.values()) if (room.loaded?.uds) room.uds = await this.listenTenantSocket(room);
    } catch (err) {
      await this.release();
      this.machine.to({ kind: 'stopped' });
      throw err;
    }
    const { serverID, agent, leases } = this.opts;
    const serverCount = this.opts.tenant.serverCount;
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
    this.machine.to({ kind: 'listening' });
    const clientsFile = this.opts.clientsFile;
    if (clientsFile && !this.opts.tenants) {
      const tenant = this.tenant(ONE_CLUSTER);
      const watch = watchClientsFile(clientsFile, (entries) => tenant.clients.configure(entries), this.metrics.registry, this.log);
      this.clientsWatch = watch;
      this.closers.push(() => {
        this.clientsWatch = undefined;
        watch.close();
        return Promise.resolve();
      });
    }
    if (this.opts.tenants) {
      this.log.info({ serverID, keepalive, tenants: this.tenantNames.length }, 'kanal server started');
      return;
    }
    const proxyStrategies = (this.opts.tenant.proxyStrategies ?? DEFAULT_PROXY_STRATEGIES).join(',');
    this.log.info(
      { serverID, serverCount, maxAgentsPerCredential: this.registry.maxAgentsPerCredential, proxyStrategies, keepalive, tokens, lease },
      'kanal server started',
    );
  }

  /** Binds the frontend, the agent port and the health port, in that order; what it started is released by release(). */
  private async startListeners(): Promise<void> {
    const { opts } = this;
    const roles = new ClientRoles(opts.agent.clientPins ?? NO_PINS, opts.frontend.tcp?.clientPins ?? NO_PINS);
    if (!opts.tenants) assertRolesSeparated(opts.agent.tls.ca, opts.frontend.tcp?.tls.ca, roles);
    this.warnAboutBudget();
    const worker = this.opts.worker;
    const agentGrpc = this.relay ? this.relay.wrap(this.startAgentGrpc(), 'agent') : this.startAgentGrpc();
    const frontendGrpc = this.relay ? this.relay.wrap(this.startFrontendGrpc(), 'frontend') : this.startFrontendGrpc();
    const directory = this.rooms.directory;
    const tcp = opts.frontend.tcp;
    if (tcp || !opts.tenants) {
      this.frontendListener = await listenForFrontends({
        mode: opts.frontend.mode,
        // Who a client is: for the audit log, and for clients: lists (docs/frontends.md, "Clients"). The shared TCP
        // frontend of many tenants reads every client's certificate subject (any tenant's list may come with a reload).
        identifyClients:
          this.audit !== undefined || opts.tenants !== undefined || (() => this.rooms.tenants().some((t) => t.clients.configured)),
        uds: opts.tenants || worker ? undefined : opts.frontend.uds,
        ...(worker && !opts.tenants && opts.frontend.uds ? { adoptedUds: { path: opts.frontend.uds.path } } : {}),
        tcp: tcp && {
          ...tcp,
          port: worker ? undefined : tcp.port,
          // A shared frontend's CertificateRequest names no CA (the directory verifies): no tenant's CA is shown to all.
          tls: directory ? { ...tcp.tls, ca: undefined } : tcp.tls,
          roles,
          ...(directory ? { recognise: (socket) => this.currentDirectory().recogniseFrontend(socket) } : {}),
        },
        requestHeadTimeoutMs: opts.frontend.headerTimeoutMs,
        services: this.frontendServices(frontendGrpc, this.log.child({ part: 'frontend' })),
        log: this.log.child({ part: 'frontend' }),
        refusals: this.refusalLogs.frontend,
      });
    }
    if (!opts.tenants) await this.startExtraListeners(frontendGrpc);
    if (this.relay && worker) await this.listenForHandoffs(worker.handoffPath(worker.index));
    this.agentListener = await listenForAgents({
      host: opts.agent.host,
      port: worker ? undefined : opts.agent.port,
      // Without a tenant's server name, the CertificateRequest names no CA (the directory verifies); with one, that tenant's.
      tls: directory ? { ...opts.agent.tls, ca: undefined } : opts.agent.tls,
      allowUnauthenticated: opts.agent.allowUnauthenticated,
      tokenAuthentication: !!opts.agent.tokens,
      roles,
      grpc: agentGrpc,
      log: this.log.child({ part: 'agents' }),
      refusals: this.refusalLogs.agents,
      ...(directory
        ? {
            recognise: (socket) => this.currentDirectory().recogniseAgent(socket),
            sni: (name) => this.currentDirectory().contextFor(name),
          }
        : {}),
    });
    await this.startHealth();
  }

  /** The listeners of single doors beside the frontend (ServerOptions.frontend.extra), closed with the rest. */
  private async startExtraListeners(grpc: GrpcServerTransport<FrontendConnection>): Promise<void> {
    // A worker of one cluster binds none of them: its primary hands each connection over (adoptExtra).
    const worker = this.opts.worker;
    for (const extra of this.opts.frontend.extra ?? []) {
      const log = this.log.child({ part: 'frontend', listener: extra.mode });
      const where = worker
        ? {
            ...(extra.uds ? { adoptedUds: { path: extra.uds.path } } : {}),
            ...(extra.plain ? { adoptedPlain: { address: formatHostPort(extra.plain) } } : {}),
          }
        : { ...(extra.uds ? { uds: extra.uds } : {}), ...(extra.plain ? { plain: extra.plain } : {}) };
      const listener = await listenForFrontends({
        mode: extra.mode,
        identifyClients: true,
        ...where,
        listenFlags: extra.flags,
        requestHeadTimeoutMs: this.opts.frontend.headerTimeoutMs,
        services: this.frontendServices(grpc, log),
        log,
        refusals: this.refusalLogs.frontend,
      });
      this.extraListeners.push(listener);
      // Said once per server: by its first worker, not by each.
      if (extra.plain && (worker?.index ?? 0) === 0 && !this.rooms.get(ONE_CLUSTER)?.tenant.clients.configured)
        log.warn(
          { address: listener.address, flags: extra.flags },
          'plain TCP listener without a clients: list: whoever reaches it is the kube-apiserver and may reach every destination',
        );
    }
  }

  /** A worker: connections relayed by other workers, each served as its handoff line says. */
  private async listenForHandoffs(path: string): Promise<void> {
    const handoffs = await listenForHandoffs(
      path,
      (socket, h) => {
        if (!this.owns(h.tenant) || !this.rooms.has(h.tenant)) {
          socket.destroy();
          return;
        }
        if (h.kind === 'agent')
          // byToken: placed by its first stream's token, so each stream is judged by its own token, as where it arrived.
          this.agentGrpc?.injectConnection(
            socket,
            h.byToken
              ? { peer: h.peer }
              : {
                  tenant: h.tenant,
                  peer: h.peer,
                  ...(h.credential ? { credential: h.credential } : {}),
                },
          );
        else if (this.frontendListener?.adoptDecided) {
          this.frontendListener.adoptDecided(socket, { tenant: h.tenant }, h.peer);
          // The handoff paused it to read its line; the sniffer reads on from here.
          socket.resume();
        } else socket.destroy();
      },
      this.log,
    );
    this.closers.push(() => handoffs.close());
  }

  private currentDirectory(): TenantDirectory {
    const directory = this.rooms.directory;
    if (!directory) throw new Error('no tenant directory on a server of one cluster');
    return directory;
  }

  /** The node -> control plane budget, against the open-files limit, said once at start. */
  private warnAboutBudget(): void {
    const openFiles = openFilesLimit();
    const { limit } = this.nodeToCp;
    if (openFiles !== undefined && limit >= openFiles) {
      this.log.warn(
        { maxNodeToCpConnections: limit, openFilesLimit: openFiles },
        `${this.opts.flags.maxNodeToCpConnections} leaves no file descriptors for frontends and health: lower it or raise the open-files limit`,
      );
    } else this.log.info({ maxConnections: limit, openFilesLimit: openFiles }, 'node -> control plane connections bounded');
  }

  /** The gRPC server of the agent port: AgentService/Connect, with keepalive PINGs, each stream handed to its tenant. */
  private startAgentGrpc(): GrpcServerTransport<AgentConnection> {
    const { opts, metrics } = this;
    const keepalive = opts.agent.keepalive ?? DEFAULT_AGENT_KEEPALIVE;
    const agentLog = this.log.child({ part: 'agents' });
    const agentGrpc = opts.transport.createServer<AgentConnection>(
      { agentConnect: (incoming) => this.routeAgent(incoming) },
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
    this.agentGrpc = agentGrpc;
    return agentGrpc;
  }

  /** An agent stream to its tenant: the one its connection was recognised as, else the one its token's issuer names. */
  private routeAgent(incoming: IncomingStream<AgentConnection>): void {
    const connection = incoming.context ?? {};
    const name = this.opts.tenants
      ? (connection.tenant ?? this.rooms.directory?.tenantOfToken(incoming.metadata.get(MD_AUTHORIZATION) ?? []))
      : ONE_CLUSTER;
    const room = name === undefined ? undefined : this.rooms.get(name);
    // A peer no tenant has verified yet is told the same whichever tenant it named, if any (identity/peer-refusals.ts).
    const refuse = (reason: RefusalReason, detail: string, fields: Record<string, unknown>): void => {
      this.refusalLogs.agents.refuse({
        reason,
        peer: incoming.peer,
        fields: { ...fields, reason: detail },
        message: `refused agent stream: ${reason === 'agent_tenant_unknown' ? 'it belongs to no tenant' : 'no certificate'}`,
        detail,
      });
      if (connection.credential === undefined) incoming.reject(AGENT_NOT_AUTHENTICATED.code, AGENT_NOT_AUTHENTICATED.message);
      // Its certificate proved it is this tenant's: it may hear the tenant named.
      else incoming.reject(GrpcStatus.UNAUTHENTICATED, `this server serves no tenant for this agent: ${detail}`);
    };
    if (!room) {
      const detail =
        name === undefined ? 'no tenant recognises its connection or token' : `tenant ${JSON.stringify(name)} is no longer served`;
      refuse('agent_tenant_unknown', detail, name === undefined ? {} : { tenant: name });
      return;
    }
    if (connection.tenant === undefined && room.loaded?.credentials.agentCa) {
      // Named by its token alone, but this tenant wants a client certificate as well (as --cluster-ca-cert with tokens).
      refuse(
        'agent_tenant_mismatch',
        `tenant ${JSON.stringify(name)} needs a client certificate from its cluster-ca-cert as well as a token`,
        {
          tenant: name,
        },
      );
      return;
    }
    room.tenant.serveAgent(withContext(incoming, connection.credential, connection.peer));
  }

  /** The KAS's side: the gRPC ProxyService, each stream handed to its connection's tenant. */
  private startFrontendGrpc(): GrpcServerTransport<FrontendConnection> {
    const frontendGrpc = this.opts.transport.createServer<FrontendConnection>(
      {
        proxy: (incoming) => {
          const room = this.rooms.get(incoming.context?.tenant ?? ONE_CLUSTER);
          if (!room) {
            incoming.reject(GrpcStatus.UNAVAILABLE, 'the tenant of this connection is no longer served');
            return;
          }
          room.tenant.serveProxy(withContext(incoming, incoming.context?.client ? { client: incoming.context.client } : undefined));
        },
      },
      { maxReceiveMessageBytes: this.opts.maxReceiveMessageBytes },
    );
    this.closers.push(() => frontendGrpc.close(1000));
    this.frontendGrpc = frontendGrpc;
    return frontendGrpc;
  }

  /** A tenant's own Unix socket for its kube-apiserver. */
  private async listenTenantSocket(room: Room): Promise<Listener | undefined> {
    const uds = room.loaded?.uds;
    if (!uds || !this.frontendGrpc) return undefined;
    const worker = this.opts.worker;
    // A tenant shared by several workers: one socket file, bound by their primary, which hands each connection to one of them.
    const shared = worker !== undefined && room.loaded !== undefined && sharedTenantServer(this.opts.serverID, room.loaded, worker).shared;
    return listenForFrontends({
      mode: this.opts.frontend.mode,
      identifyClients: this.audit !== undefined || (() => room.tenant.clients.configured),
      ...(shared ? { adoptedUds: { path: uds.path } } : { uds }),
      tenant: room.tenant.name,
      requestHeadTimeoutMs: this.opts.frontend.headerTimeoutMs,
      services: this.frontendServices(this.frontendGrpc, room.tenant.log.child({ part: 'frontend' })),
      log: room.tenant.log.child({ part: 'frontend' }),
      refusals: this.refusalLogs.frontend,
    });
  }

  /** Re-reads the tenants file and applies what changed (tenants/tenant-rooms.ts); one reload at a time. */
  reloadTenants(): Promise<ReloadResult> {
    return this.rooms.reload();
  }

  /** A worker told to reload: the tenants file, or one cluster's clients file (its primary passes SIGHUP on, primary-process.ts). */
  async reload(): Promise<void> {
    if (this.opts.tenants) await this.reloadTenants();
    else await this.clientsWatch?.reload('the primary passed on a SIGHUP');
  }

  /** Whether this process serves `tenant` (always, unless it is one of several workers). */
  private owns(tenant: string): boolean {
    return this.relay?.owns(tenant) ?? true;
  }

  /** What the front doors of a frontend listener use (frontends/frontend.ts). */
  private frontendServices(grpc: GrpcServerTransport<FrontendConnection>, log: ServerOptions['log']): FrontendServices {
    return { grpc, log, tenantFrontend: (tenant, door) => this.tenantFrontendOf(tenant, door) };
  }

  /** A front door's part in a tenant, or, on a worker, what relays its connection to the worker that serves it. */
  private tenantFrontendOf(tenant: string | undefined, door: string): Pick<TenantFrontend, 'serve'> | undefined {
    return this.relay?.frontend(tenant) ?? this.rooms.get(tenant ?? ONE_CLUSTER)?.tenant.frontends.get(door);
  }

  /** A worker: a connection the primary accepted on the agent port, with what it read of it. */
  adoptAgent(socket: net.Socket, head: Buffer): void {
    this.agentListener?.adopt?.(socket, head);
  }

  /** A worker of one cluster: a connection the primary accepted on listener `index` of ServerOptions.frontend.extra. */
  adoptExtra(index: number, socket: net.Socket): void {
    const listener = this.extraListeners[index];
    if (listener?.adopt) listener.adopt(socket, Buffer.alloc(0));
    else socket.destroy();
  }

  /** A worker: a connection the primary accepted on the Unix socket of `tenant`, a tenant this worker shares with others. */
  adoptTenantSocket(tenant: string, socket: net.Socket): void {
    const listener = this.rooms.get(tenant)?.uds;
    if (listener?.adopt) listener.adopt(socket, Buffer.alloc(0));
    else socket.destroy();
  }

  /** A worker: a connection the primary accepted on the TCP frontend. */
  adoptFrontend(socket: net.Socket, head: Buffer): void {
    if (this.frontendListener?.adopt) this.frontendListener.adopt(socket, head);
    else socket.destroy();
  }

  /** The text of this process's registry and each tenant's, rendered a few at a time (metrics-text.ts); the primary of workers merges them. */
  metricsTexts(): Promise<string[]> {
    return renderEach([this.metrics.registry, ...this.rooms.tenants().map((t) => t.metrics.registry)]);
  }

  private async startHealth(): Promise<void> {
    if (!this.opts.health) return;
    const { host, port } = this.opts.health;
    this.health = await startHealthServer({
      host,
      port,
      limits: this.opts.health.limits,
      metrics: this.opts.health.metrics,
      metricsFlag: this.opts.flags.healthMetrics,
      readiness: (query) => this.readiness(query),
      registry: this.metricsSource,
      onRefusal: (reason) => this.metrics.refusals.inc({ reason }),
      log: this.log,
    }).catch((err: unknown) => {
      throw listenError(err, `${host}:${port}`, this.opts.flags.health);
    });
  }

  /** A Refusals for one part of the server, flushed when it stops. */
  private refusals(log: ServerOptions['log']): Refusals {
    const audit = this.audit && new ConnectionAuditor({ side: 'server', log, sink: this.audit });
    const r = new Refusals(log, this.metrics, undefined, audit);
    this.flushers.push(() => r.flush());
    return r;
  }

  /**
   * Stops listening, closes every tunnel and connection. Safe in any state:
   * before start() it only marks the server stopped, during start() it waits
   * for it, a second call waits for the first.
   */
  async stop(): Promise<void> {
    const s = this.machine.state;
    switch (s.kind) {
      case 'created':
        this.machine.to({ kind: 'stopped' });
        return;
      case 'starting':
        await s.started.catch(() => undefined);
        return this.stop();
      case 'listening': {
        // Deferred a turn, so the state says 'stopping' before anything closes.
        const stopped = Promise.resolve().then(() => this.takeDown());
        this.machine.to({ kind: 'stopping', stopped });
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
      await this.rooms.settled();
      await this.release();
      this.machine.to({ kind: 'stopped' });
    }
    this.log.info('kanal server stopped');
  }

  /** Releases whatever start() got to; safe at any point of it (closing a listener again does nothing). */
  private async release(): Promise<void> {
    await this.frontendListener?.close();
    await Promise.all(this.extraListeners.splice(0).map((l) => l.close()));
    await this.agentListener?.close();
    await this.rooms.closeAll();
    await Promise.all(this.closers.map((c) => c()));
    this.closers = [];
    await this.health?.close();
    for (const flush of this.flushers.splice(0)) flush();
    // Last: the tunnels closed above have written their connections' records.
    await this.audit?.close();
  }
}

/** The same stream with another context: a tenant's handlers take the credential, not the connection record. */
function withContext<C, D>(incoming: IncomingStream<C>, context: D | undefined, peer = incoming.peer): IncomingStream<D> {
  return {
    metadata: incoming.metadata,
    peer,
    context,
    ...(incoming.liveness ? { liveness: incoming.liveness } : {}),
    accept: (headers) => incoming.accept(headers),
    reject: (code, message) => incoming.reject(code, message),
  };
}
