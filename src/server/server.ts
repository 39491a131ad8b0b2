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
import type { LabelledCounter } from '../domain/metrics.js';
import type { TokenAuthenticator } from './identity/token-authenticator.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { KanalMetrics } from '../domain/metrics.js';
import { ConnectionBudget } from '../domain/connection-budget.js';
import { defaultNodeToCpConnections, openFilesLimit } from '../common/open-files-limit.js';
import { defaultMemoryBudget } from '../common/memory-limit.js';
import { RetentionLedger } from '../domain/retention-ledger.js';
import type { AgentRegistry } from './agents/agent-registry.js';
import { listenForAgents, listenForFrontends, peerOf, type FrontendConnection, type Listener } from './listeners.js';
import { Refusals } from '../domain/refusal-log.js';
import { listenError } from '../common/listen-error.js';
import { errorMessage } from '../common/error-message.js';
import { assertRolesSeparated, ClientRoles, NO_PINS } from './identity/client-roles.js';
import type { AgentConnection, AgentCredential } from './identity/agent-credential.js';
import { MD_AUTHORIZATION } from '../wire/metadata.js';
import { DEFAULT_PROXY_STRATEGIES } from './routing/proxy-strategies.js';
import type { UpstreamServerLeaseMetrics } from '../domain/upstream-metrics.js';
import { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';
import { feedLeaseMetrics } from './tenants/tenant-gauges.js';
import { Tenant } from './tenants/tenant.js';
import { TenantDirectory } from './tenants/tenant-directory.js';
import type { TenantDefinition } from './tenants/tenant-definition.js';
import { logRefusedReload, reloadCounter } from './tenants/tenants-watch.js';
import { forward, listenForHandoffs, type Handoff } from './workers/handoff.js';
import { readFirstRequest } from './workers/first-request.js';
import type { FrontendServices, TenantFrontend } from './frontends/frontend.js';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { mergeExpositions, renderEach } from '../common/metrics-text.js';
import { serverStatus } from './server-status.js';
import { StatusIndex } from './status-index.js';
import type { ServerStatusDocument } from '../domain/status-document.js';
import type { StatusQuery } from '../domain/status-query.js';

export { DEFAULT_AGENT_KEEPALIVE, type ServerOptions, type ServerStats } from './server-options.js';

/** Streams one agent connection may have open: agents use one; room for a second while one closes. */
const MAX_STREAMS_PER_AGENT_CONNECTION = 2;
/** A worker: how long an agent connection placed by its token has for its first request (the HTTP/2 handshake's time, h2/server.ts). */
const FIRST_REQUEST_TIMEOUT_MS = 10_000;

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

/** The moves transition() allows. */
const NEXT_STATES: Readonly<Record<ServerState['kind'], readonly ServerState['kind'][]>> = {
  created: ['starting', 'stopped'],
  starting: ['listening', 'stopped'],
  listening: ['stopping'],
  stopping: ['stopped'],
  stopped: [],
};

/** The implicit tenant's key in `rooms`: a server without --tenants-config. */
const ONE_CLUSTER = '';

/** A tenant being served, with what was loaded for it and its own Unix socket. */
interface Room {
  tenant: Tenant;
  loaded?: TenantDefinition;
  uds?: Listener;
  /** Closes what was opened for it (its kube-apiserver client). */
  release?: () => void;
}

/** What a reload of the tenants file changed (names), or why it changed nothing. */
export type ReloadResult = { ok: true; added: string[]; changed: string[]; removed: string[] } | { ok: false; error: string };

export class KanalServer {
  /** The process's metrics, and the tenant's on a server of one cluster. */
  readonly metrics = new KanalMetrics('server');
  /** See ServerState; changed only by transition(). */
  private current: ServerState = { kind: 'created' };
  /** Node -> control plane connections of all agents together (file descriptors here). */
  private readonly nodeToCp: ConnectionBudget;
  /** Tenant name (ONE_CLUSTER without --tenants-config) -> what serves it. */
  private readonly rooms = new Map<string, Room>();
  /** Whose a connection is; replaced whole on a reload (undefined: one cluster). */
  private directory: TenantDirectory | undefined;
  /** Set while starting and kept once closed, so their ports can still be read (tests, logs). */
  private agentListener: Listener | undefined;
  private frontendListener: Listener | undefined;
  private health: HealthServer | undefined;
  private closers: (() => Promise<void>)[] = [];
  /** Report the refusals still held back by rate limiting (at stop). */
  private flushers: (() => void)[] = [];
  private readonly log: ServerOptions['log'];
  /** Listener-level refusals (before a tenant is known): counted in the process's metrics. */
  private readonly refusalLogs: { frontend: Refusals; agents: Refusals };
  /** One reload at a time; a request during one sets reloadAgain and is served by one more pass. */
  private reloading: Promise<ReloadResult> | undefined;
  private reloadAgain = false;
  /** kanal_tenants_config_reloads_total{result}: with --tenants-config only. */
  private readonly reloads: LabelledCounter<{ result: 'applied' | 'invalid' }> | undefined;
  private frontendGrpc: GrpcServerTransport<FrontendConnection> | undefined;
  private agentGrpc: GrpcServerTransport<AgentConnection> | undefined;
  /** What every tenant's connections hold, and the process's budget for it (--memory-budget). */
  readonly ledger: RetentionLedger;
  /** --audit-log-path: opened by bringUp(), closed after everything else by release(). */
  private readonly audit: ProcessAuditLog | undefined;

  constructor(private readonly opts: ServerOptions) {
    this.log = opts.log;
    this.audit = opts.auditLog && new ProcessAuditLog(opts.auditLog);
    this.nodeToCp = new ConnectionBudget(opts.maxNodeToCpConnections ?? defaultNodeToCpConnections());
    this.ledger = new RetentionLedger({ budgetBytes: opts.memoryBudgetBytes || defaultMemoryBudget() });
    this.refusalLogs = {
      frontend: this.refusals(opts.log.child({ part: 'frontend' })),
      agents: this.refusals(opts.log.child({ part: 'agents' })),
    };
    this.reloads = opts.tenants ? reloadCounter(this.metrics.registry) : undefined;
    if (!opts.tenants) {
      this.rooms.set(ONE_CLUSTER, { tenant: this.oneCluster() });
    } else {
      this.metrics.gauge('kanal_server_tenants', 'Tenants this server serves (--tenants-config)', () => this.rooms.size);
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

  /** A tenant of the file, in its own metrics and log lines. */
  private tenantFrom(loaded: TenantDefinition, tokens: TokenAuthenticator | undefined): Tenant {
    const name = loaded.name;
    return new Tenant({
      ...loaded.options,
      ...(tokens ? { tokens } : {}),
      name,
      serverID: this.opts.serverID,
      resumeTimeoutMs: this.opts.agent.resumeTimeoutMs ?? 0,
      nodeToCp: this.nodeToCp,
      ledger: this.ledger,
      metrics: new KanalMetrics('server', name),
      log: this.log.child({ tenant: name }),
      ...(this.audit ? { audit: this.audit } : {}),
    });
  }

  /** Where the server is in its life (ServerState). */
  get state(): ServerState['kind'] {
    return this.current.kind;
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
      throw new Error(name === ONE_CLUSTER ? 'this server has --tenants-config: name the tenant' : `no tenant ${JSON.stringify(name)}`);
    return room.tenant;
  }

  /** Names of the tenants served (empty without --tenants-config). */
  get tenantNames(): string[] {
    return [...this.rooms.keys()].filter((n) => n !== ONE_CLUSTER);
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
    const ready = this.current.kind === 'listening';
    return { ready, detail: `${this.rooms.size} tenant(s)${lines.length > 0 ? `\n${lines.join('\n')}` : ''}` };
  }

  /** The tenants this process serves (a worker: its own share of the file). */
  tenantsServed(): string[] {
    return [...this.rooms.keys()].filter((name) => name !== ONE_CLUSTER);
  }

  stats(): ServerStats {
    const tenants = [...this.rooms.values()].map((r) => r.tenant);
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
  private readonly statusIndex = new StatusIndex(() => [...this.rooms.values()].map((r) => r.tenant));

  /**
   * The admin port's /status: one page of its agents and their tunnels
   * (server-status.ts), or what is wrong with `query`. `build`: Kanal's version and commit.
   */
  status(build: { version: string; commit: string }, query: StatusQuery): ServerStatusDocument | { error: string } {
    return serverStatus(
      {
        serverID: this.opts.serverID,
        serverCount: this.opts.tenant.serverCount,
        state: this.current.kind,
        tenants: [...this.rooms.values()].map((r) => r.tenant),
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
    const s = this.current;
    if (s.kind !== 'created') throw new Error(`the server cannot start when ${s.kind}: a KanalServer starts once (create a new one)`);
    // Deferred a turn, so the state says 'starting' before anything is bound.
    const started = Promise.resolve().then(() => this.bringUp());
    this.transition({ kind: 'starting', started });
    return started;
  }

  private async bringUp(): Promise<void> {
    try {
      await this.audit?.open(this.metrics.registry, this.log.child({ part: 'audit' }));
      if (this.opts.tenants) await this.addTenants(this.opts.tenants.load());
      await this.startListeners();
      for (const room of this.rooms.values()) if (room.loaded?.uds) room.uds = await this.listenTenantSocket(room);
    } catch (err) {
      await this.release();
      this.transition({ kind: 'stopped' });
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
    this.transition({ kind: 'listening' });
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
    const agentGrpc = this.relaying(this.startAgentGrpc(), 'agent');
    const frontendGrpc = this.relaying(this.startFrontendGrpc(), 'frontend');
    const directory = this.directory;
    const tcp = opts.frontend.tcp;
    if (tcp || !opts.tenants) {
      this.frontendListener = await listenForFrontends({
        mode: opts.frontend.mode,
        identifyClients: this.audit !== undefined,
        uds: opts.tenants ? undefined : opts.frontend.uds,
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
    if (worker) await this.listenForHandoffs(worker.handoffPath(worker.index));
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
    if (!this.directory) throw new Error('no tenant directory on a server of one cluster');
    return this.directory;
  }

  /** The node -> control plane budget, against the open-files limit, said once at start. */
  private warnAboutBudget(): void {
    const openFiles = openFilesLimit();
    const { limit } = this.nodeToCp;
    if (openFiles !== undefined && limit >= openFiles) {
      this.log.warn(
        { maxNodeToCpConnections: limit, openFilesLimit: openFiles },
        '--max-node-to-cp-connections leaves no file descriptors for frontends and health: lower it or raise the open-files limit',
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
      ? (connection.tenant ?? this.directory?.tenantOfToken(incoming.metadata.get(MD_AUTHORIZATION) ?? []))
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
    return listenForFrontends({
      mode: this.opts.frontend.mode,
      identifyClients: this.audit !== undefined,
      uds,
      tenant: room.tenant.name,
      requestHeadTimeoutMs: this.opts.frontend.headerTimeoutMs,
      services: this.frontendServices(this.frontendGrpc, room.tenant.log.child({ part: 'frontend' })),
      log: room.tenant.log.child({ part: 'frontend' }),
      refusals: this.refusalLogs.frontend,
    });
  }

  /** The tenants of the file at start (the file was checked whole by load()). */
  private async addTenants(list: readonly TenantDefinition[]): Promise<void> {
    this.directory = new TenantDirectory(
      list.map((l) => l.credentials),
      this.opts.tenants?.policy ?? {},
    );
    const own = list.filter((l) => this.owns(l.name));
    for (const loaded of own) this.rooms.set(loaded.name, await this.openRoom(loaded));
    this.log.info({ tenants: own.map((l) => l.name) }, `serving ${own.length} tenant(s)`);
  }

  private async openRoom(loaded: TenantDefinition): Promise<Room> {
    const review = loaded.tokens && (await this.opts.tenants?.tokenReview?.(loaded));
    const tenant = this.tenantFrom(loaded, review?.authenticator);
    return { tenant, loaded, ...(review ? { release: review.release } : {}) };
  }

  /**
   * Re-reads the tenants file and applies what changed, touching no other
   * tenant: added tenants start, removed ones are closed (one line each), a
   * changed one is closed and started anew. A file that cannot be used
   * changes nothing. One reload at a time; requests during one are merged into the next.
   */
  async reloadTenants(): Promise<ReloadResult> {
    if (!this.opts.tenants) return { ok: false, error: 'this server has no --tenants-config' };
    if (this.current.kind !== 'listening') return { ok: false, error: `the server is ${this.current.kind}` };
    if (this.reloading) {
      this.reloadAgain = true;
      return this.reloading;
    }
    const run = async (): Promise<ReloadResult> => {
      let result: ReloadResult;
      do {
        this.reloadAgain = false;
        result = await this.applyReload();
      } while (this.reloadAgain && this.current.kind === 'listening');
      return result;
    };
    this.reloading = run().finally(() => (this.reloading = undefined));
    return this.reloading;
  }

  private async applyReload(): Promise<ReloadResult> {
    const tenants = this.opts.tenants;
    if (!tenants) return { ok: false, error: 'no --tenants-config' };
    let list: TenantDefinition[];
    let directory: TenantDirectory;
    try {
      list = tenants.load();
      directory = new TenantDirectory(
        list.map((l) => l.credentials),
        tenants.policy,
        this.directory,
      );
    } catch (err) {
      const error = errorMessage(err);
      logRefusedReload(this.log, err);
      this.reloads?.inc({ result: 'invalid' });
      return { ok: false, error };
    }
    const next = new Map(list.filter((l) => this.owns(l.name)).map((l) => [l.name, l]));
    const removed = [...this.rooms.keys()].filter((n) => !next.has(n));
    const changed = [...next.keys()].filter((n) => {
      const room = this.rooms.get(n);
      return room !== undefined && room.loaded?.fingerprint !== next.get(n)?.fingerprint;
    });
    const added = [...next.keys()].filter((n) => !this.rooms.has(n));
    // Settings alone changed: applied in place, the tenant's agents and connections stay.
    const tuned = changed.filter((n) => this.rooms.get(n)?.loaded?.identity === next.get(n)?.identity);
    const rebuilt = changed.filter((n) => !tuned.includes(n));
    for (const name of [...removed, ...rebuilt]) await this.closeRoom(name, removed.includes(name) ? 'removed from' : 'changed in');
    for (const name of tuned) {
      const room = this.rooms.get(name);
      const loaded = next.get(name);
      if (!room || !loaded) continue;
      room.tenant.update(loaded.options);
      room.loaded = loaded;
      room.tenant.log.info(
        { agentTunnels: room.tenant.registry.size },
        'tenant changed: settings applied in place, its agents and connections stay',
      );
    }
    // The listeners' default contexts hold no trust store: the directory is the trust, consulted per connection.
    this.directory = directory;
    for (const name of [...rebuilt, ...added]) {
      const loaded = next.get(name);
      if (!loaded) continue;
      const room = await this.openRoom(loaded);
      this.rooms.set(name, room);
      try {
        room.uds = await this.listenTenantSocket(room);
      } catch (err) {
        room.tenant.log.error(
          { err: errorMessage(err) },
          "cannot listen on the tenant's Unix socket; its agents are served, its kube-apiserver cannot reach it",
        );
      }
      room.tenant.log.info(rebuilt.includes(name) ? 'tenant changed: started anew' : 'tenant added');
    }
    this.reloads?.inc({ result: 'applied' });
    this.log.info({ added, changed, inPlace: tuned, removed, tenants: this.rooms.size }, 'tenants file applied');
    return { ok: true, added, changed, removed };
  }

  /** Whether this process serves `tenant` (always, unless it is one of several workers). */
  private owns(tenant: string): boolean {
    const w = this.opts.worker;
    return !w || w.owner(tenant) === w.index;
  }

  /**
   * A worker's gRPC server as the listeners see it: a connection recognised as
   * a tenant another worker serves is relayed there (workers/handoff.ts).
   */
  private relaying<C extends { tenant?: string; credential?: AgentCredential }>(
    grpc: GrpcServerTransport<C>,
    kind: Handoff['kind'],
  ): GrpcServerTransport<C> {
    const w = this.opts.worker;
    if (!w) return grpc;
    return {
      injectConnection: (connection, context) => {
        const tenant = context?.tenant;
        if (tenant === undefined && kind === 'agent' && this.directory?.hasTokenIssuers()) {
          this.routeByToken(connection, context, grpc);
          return;
        }
        if (tenant === undefined || this.owns(tenant)) {
          grpc.injectConnection(connection, context);
          return;
        }
        const peer = connection instanceof net.Socket ? peerOf(connection, 'unknown') : 'unknown';
        forward(
          connection,
          w.handoffPath(w.owner(tenant)),
          { kind, tenant, peer, ...(context?.credential ? { credential: context.credential } : {}) },
          this.log,
        );
      },
      close: (graceMs) => grpc.close(graceMs),
    };
  }

  /**
   * A worker: an agent connection that neither its server name nor a
   * certificate placed, so its token's issuer will name its tenant. Its first
   * request's token is read (first-request.ts); when that names a tenant
   * another worker serves, the whole connection goes there, marked so that
   * worker judges every stream by its token as this one would have.
   */
  private routeByToken<C extends { tenant?: string; credential?: AgentCredential }>(
    connection: Duplex,
    context: C | undefined,
    grpc: GrpcServerTransport<C>,
  ): void {
    const w = this.opts.worker;
    const peer = connection instanceof net.Socket ? peerOf(connection, 'unknown') : 'unknown';
    void readFirstRequest(connection, FIRST_REQUEST_TIMEOUT_MS).then((first) => {
      if (first.kind === 'none') {
        this.log.debug({ peer, why: first.why }, 'closed agent connection before its first request');
        connection.destroy();
        return;
      }
      if (connection.destroyed) return;
      connection.unshift(first.replay);
      const tenant = this.directory?.tenantOfToken(first.authorization);
      if (!w || tenant === undefined || this.owns(tenant)) {
        grpc.injectConnection(connection, context);
        connection.resume();
        return;
      }
      this.log.debug({ peer, tenant, to: w.owner(tenant) }, "agent connection relayed to its token's tenant");
      forward(connection, w.handoffPath(w.owner(tenant)), { kind: 'agent', tenant, peer, byToken: true }, this.log);
    });
  }

  /** What the front doors of a frontend listener use (frontends/frontend.ts). */
  private frontendServices(grpc: GrpcServerTransport<FrontendConnection>, log: ServerOptions['log']): FrontendServices {
    return { grpc, log, tenantFrontend: (tenant, door) => this.tenantFrontendOf(tenant, door) };
  }

  /** A front door's part in a tenant, or, on a worker, what relays its connection to the worker that serves it. */
  private tenantFrontendOf(tenant: string | undefined, door: string): Pick<TenantFrontend, 'serve'> | undefined {
    const w = this.opts.worker;
    if (w && tenant !== undefined && !this.owns(tenant)) {
      return { serve: (socket, { peer }) => forward(socket, w.handoffPath(w.owner(tenant)), { kind: 'frontend', tenant, peer }, this.log) };
    }
    return this.rooms.get(tenant ?? ONE_CLUSTER)?.tenant.frontends.get(door);
  }

  /** A worker: a connection the primary accepted on the agent port, with what it read of it. */
  adoptAgent(socket: net.Socket, head: Buffer): void {
    this.agentListener?.adopt?.(socket, head);
  }

  /** A worker: a connection the primary accepted on the TCP frontend. */
  adoptFrontend(socket: net.Socket, head: Buffer): void {
    if (this.frontendListener?.adopt) this.frontendListener.adopt(socket, head);
    else socket.destroy();
  }

  /** The text of this process's registry and each tenant's, rendered a few at a time (metrics-text.ts); the primary of workers merges them. */
  metricsTexts(): Promise<string[]> {
    return renderEach([this.metrics.registry, ...[...this.rooms.values()].map((r) => r.tenant.metrics.registry)]);
  }

  /** Stops serving a tenant: its socket, its agents' tunnels and its kube-apiserver's streams, in one line. */
  private async closeRoom(name: string, how: string): Promise<void> {
    const room = this.rooms.get(name);
    if (!room) return;
    this.rooms.delete(name);
    await room.uds?.close();
    const { agents, frontendStreams } = { agents: room.tenant.registry.size, frontendStreams: room.tenant.frontendTunnels.size };
    room.tenant.close(new Error(`tenant ${name} was ${how} the tenants file`));
    room.release?.();
    room.tenant.log.info(
      { agentTunnels: agents, frontendStreams },
      `tenant ${how.replace(/ (from|in)$/, '')} the tenants file: its agents and connections closed`,
    );
  }

  private async startHealth(): Promise<void> {
    if (!this.opts.health) return;
    const { host, port } = this.opts.health;
    this.health = await startHealthServer({
      host,
      port,
      limits: this.opts.health.limits,
      metrics: this.opts.health.metrics,
      metricsFlag: '--health-metrics',
      readiness: (query) => this.readiness(query),
      registry: this.metricsSource,
      onRefusal: (reason) => this.metrics.refusals.inc({ reason }),
      log: this.log,
    }).catch((err: unknown) => {
      throw listenError(err, `${host}:${port}`, '--health-bind-address, --health-port');
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
      await this.reloading?.catch(() => undefined);
      await this.release();
      this.transition({ kind: 'stopped' });
    }
    this.log.info('kanal server stopped');
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
    for (const room of this.rooms.values()) {
      await room.uds?.close();
      room.tenant.close();
      room.release?.();
    }
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
