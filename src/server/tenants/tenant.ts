/**
 * One cluster's room in a server: its agents (registry, agent service,
 * token review), the dials its kube-apiserver makes through them (frontends'
 * handlers, routing), its nodes' dials toward the control plane (its own
 * allow-list) and its limits and metrics. A server of one cluster has one
 * unnamed tenant built from its flags; with --tenants-config each declared
 * tenant is one (docs/multi-tenant.md). Nothing here is shared between
 * tenants but the server-wide connection budget: the listeners decide whose
 * a connection is and hand it to that tenant's handlers.
 */
import type { Logger } from 'pino';
import type { IncomingStream } from '../../transport/transport.js';
import type { Tunnel } from '../../tunnel/tunnel.js';
import type { TunnelLimits } from '../../tunnel/limits.js';
import { Feature, type FeatureSet } from '../../wire/features.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import { registerUpstreamServerMetrics, type UpstreamServerLeaseMetrics } from '../../domain/upstream-metrics.js';
import type { ConnectionBudget } from '../../domain/connection-budget.js';
import { Refusals } from '../../domain/refusal-log.js';
import { AgentRegistry, MAX_TUNNELS_PER_AGENT } from '../agents/agent-registry.js';
import { ResumableTunnels } from '../agents/resumable-tunnels.js';
import { ResumeMetrics } from '../../domain/resume-metrics.js';
import { createAgentService, type AgentServiceOptions } from '../agents/agent-service.js';
import { AllowList } from '../destinations/allow-list.js';
import { DestinationDialer } from '../destinations/destination-dialer.js';
import { BackendDialer } from '../frontends/backend-dialer.js';
import { DirectRoutes } from '../clients/direct-routes.js';
import { DirectDials } from '../clients/direct-dials.js';
import { ClientQuotaBook } from '../clients/client-quota.js';
import { TenantClients } from '../clients/tenant-clients.js';
import { ClientTokenReview } from '../clients/client-token-review.js';
import type { ClientEntry } from '../clients/client-entry.js';
import { createGrpcFrontend, type FrontendStream, type GrpcFrontendOptions } from '../frontends/grpc-frontend.js';
import { FRONTENDS } from '../frontends/frontend-registry.js';
import type { Frontend, TenantFrontend } from '../frontends/frontend.js';
import { httpConnectFrontend } from '../frontends/http-connect-frontend.js';
import type { AgentCredential } from '../identity/agent-credential.js';
import type { TokenAuthenticator } from '../identity/token-authenticator.js';
import type { ProxyStrategy } from '../routing/proxy-strategies.js';
import { registerServerGauges } from './tenant-gauges.js';
import { DialQuota, type DialQuotaLimits } from '../../domain/dial-quota.js';
import { ConnectionAuditor } from '../../audit/connection-auditor.js';
import type { AuditSink } from '../../audit/audit-record.js';
import {
  DEFAULT_AGENT_RETAINED_BYTES,
  DEFAULT_TENANT_RETAINED_BYTES,
  RetentionLedger,
  type LedgerAccount,
} from '../../domain/retention-ledger.js';

const SERVER_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial, Feature.Resolve]);
const RESUMING_SERVER_FEATURES: FeatureSet = new Set([...SERVER_FEATURES, Feature.Resume]);

/**
 * What a tenant's settings give it (config/tenant-options.ts maps them, for
 * one cluster and for a tenants file's entry alike); update() applies every
 * field in place, and fails to compile when one has no applier.
 */
export interface TenantSettingsOptions {
  serverCount: number;
  maxAgentsPerCredential: number;
  /** Distinct agents of the tenant (max-agents); absent: unbounded but for the per-credential bound. */
  maxAgents?: number;
  /** The tenant's share of dials and connections (max-connections, max-pending-dials, dial-rate); absent: none. */
  quota?: DialQuotaLimits;
  proxyStrategies?: readonly ProxyStrategy[];
  backendDialTimeoutMs: number;
  allowedDestinations: readonly string[];
  destinationDialTimeoutMs: number;
  /** Frontend destinations the server dials itself (direct-route, clients/direct-routes.ts); empty: none. */
  directRoutes: readonly string[];
  /** Limits of every tunnel (agent tunnels and gRPC frontend streams). */
  limits?: Partial<TunnelLimits>;
  /** Further limits of agent tunnels: the per-agent caps. */
  agentLimits?: Partial<TunnelLimits>;
  /** Bytes kept for resends one agent, and the whole tenant, may hold (--max-retained-bytes-per-agent, -per-tenant). */
  retainedBytes?: { perAgent: number; perTenant: number };
  /** The frontend clients and their rules (clients:, --frontend-clients-config); absent or empty: the kube-apiserver alone, as upstream. */
  clients?: readonly ClientEntry[];
}

export interface TenantOptions extends TenantSettingsOptions {
  /** Absent: the one cluster of a server without --tenants-config (no `tenant` label anywhere). */
  name?: string;
  serverID: string;
  /** Resume: how long a lost agent tunnel's connections wait for it (0: not offered). */
  resumeTimeoutMs: number;
  /** Token review against this tenant's kube-apiserver. */
  tokens?: TokenAuthenticator;
  /** Node -> control plane connections of the whole server (file descriptors): shared by every tenant. */
  nodeToCp: ConnectionBudget;
  /** The server's audit log (--audit-log-path); absent: none. */
  audit?: AuditSink;
  /** What the process's connections hold (the server's); absent: a ledger of the tenant's own, without a budget. */
  ledger?: RetentionLedger;
  /** The tenant's own metrics (labelled with its name on a shared server). */
  metrics: KanalMetrics;
  /** Already carries the tenant's name on a shared server. */
  log: Logger;
}

export class Tenant {
  readonly name: string | undefined;
  readonly registry: AgentRegistry;
  readonly metrics: KanalMetrics;
  readonly log: Logger;
  readonly quota: DialQuota | undefined;
  /** gRPC frontend streams open (the server closes them with the tenant). */
  readonly frontendTunnels = new Set<Tunnel>();
  /** Each front door's part in the tenant, by the door's name (frontends/frontend.ts). */
  readonly frontends: ReadonlyMap<string, TenantFrontend>;
  /** AgentService/Connect for this tenant's agents: `context` is who authenticated the connection. */
  readonly serveAgent: (incoming: IncomingStream<AgentCredential>) => void;
  /** ProxyService/Proxy for this tenant's kube-apiserver. */
  readonly serveProxy: (incoming: FrontendStream) => void;
  /** Upstream's lease metric names, for a lease controller to feed. */
  readonly upstreamLeaseMetrics: UpstreamServerLeaseMetrics;
  /** What the agent service and the gRPC frontend read per new stream, changed by update(). */
  private readonly agentOptions: AgentServiceOptions;
  private readonly frontendOptions: GrpcFrontendOptions;
  private readonly dialer: BackendDialer;
  private readonly destinations: DestinationDialer;
  /** Agent tunnels that can be resumed, by token (with --resume-timeout). */
  private readonly resumable: ResumableTunnels;
  /** Frontend and agent refusal logs, flushed when the tenant closes. */
  private readonly refusalLogs: Refusals[] = [];
  /** The log line and audit record of each ended connection, failed dial and refusal of the tenant. */
  private readonly auditor: ConnectionAuditor;
  /** What the tenant's connections hold, below the process's account; its agents' accounts below it. */
  readonly account: LedgerAccount;
  readonly allowList: AllowList;
  /** Frontend destinations the server dials itself, replaced in place when the tenant's settings change. */
  readonly directRoutes: DirectRoutes;
  /** --destination-dial-timeout now: direct routes read it per dial. */
  private destinationDialTimeoutMs: number;
  /** Who the tenant's frontend clients are and what they may reach (every door admits and dials through it). */
  readonly clients: TenantClients;

  constructor(readonly opts: TenantOptions) {
    this.name = opts.name;
    this.destinationDialTimeoutMs = opts.destinationDialTimeoutMs;
    this.metrics = opts.metrics;
    this.log = opts.log;
    this.registry = new AgentRegistry(opts.maxAgentsPerCredential, opts.maxAgents);
    const retained = opts.retainedBytes ?? { perAgent: DEFAULT_AGENT_RETAINED_BYTES, perTenant: DEFAULT_TENANT_RETAINED_BYTES };
    this.account = (opts.ledger ?? new RetentionLedger({ budgetBytes: Number.POSITIVE_INFINITY })).tenant(
      opts.name ?? '',
      retained.perTenant,
    );
    this.quota = opts.quota && new DialQuota(opts.quota);
    this.auditor = new ConnectionAuditor({
      side: 'server',
      log: opts.log.child({ part: 'connections' }),
      ...(opts.audit ? { sink: opts.audit } : {}),
      ...(opts.name === undefined ? {} : { tenant: opts.name }),
    });
    const agentTunnels = (): Tunnel[] => this.registry.list().map((b) => b.tunnel);
    this.upstreamLeaseMetrics = registerUpstreamServerMetrics(this.metrics.registry, {
      agentStreams: () => this.registry.size,
      proxyStreams: () => this.frontendTunnels.size,
      httpConnectConnections: () => this.frontends.get(httpConnectFrontend.name)?.size ?? 0,
      readyAgents: () => this.registry.agentCount,
      pendingDials: () => agentTunnels().reduce((n, t) => n + t.stats().pendingDials, 0),
      establishedConnections: () => agentTunnels().reduce((n, t) => n + t.stats().connections, 0),
      pausedAgentStreams: () => agentTunnels().filter((t) => t.stats().readPaused).length,
      pausedProxyStreams: () => [...this.frontendTunnels].filter((t) => t.stats().readPaused).length,
    });
    registerServerGauges(this.metrics, { registry: this.registry, frontendTunnels: this.frontendTunnels, nodeToCp: opts.nodeToCp });
    const logs = { frontend: opts.log.child({ part: 'frontend' }), agents: opts.log.child({ part: 'agents' }) };
    const dialer = (this.dialer = new BackendDialer({
      registry: this.registry,
      timeoutMs: opts.backendDialTimeoutMs,
      log: logs.frontend,
      metrics: this.metrics,
      refusals: this.refusals(logs.frontend),
      strategies: opts.proxyStrategies,
      auditor: this.auditor,
      ...(this.quota ? { quota: this.quota } : {}),
    }));
    const directRoutes = (this.directRoutes = new DirectRoutes(opts.directRoutes));
    const clients = (this.clients = new TenantClients(
      {
        dialer,
        registry: this.metrics.registry,
        refusals: this.refusals(logs.frontend),
        dialRefusals: this.refusals(logs.frontend, false),
        auditor: this.auditor,
        reviewer: () => opts.tokens && new ClientTokenReview({ api: opts.tokens.api, audience: opts.tokens.audience }),
        quotas: new ClientQuotaBook(),
        direct: new DirectDials({
          routes: directRoutes,
          timeoutMs: () => this.destinationDialTimeoutMs,
          registry: this.metrics.registry,
          log: logs.frontend,
          auditor: this.auditor,
        }),
      },
      opts.clients,
    ));
    this.frontendOptions = {
      dialer,
      clients,
      log: logs.frontend,
      track: (t) => this.trackFrontend(t),
      limits: opts.limits,
      metrics: this.metrics,
    };
    this.serveProxy = createGrpcFrontend(this.frontendOptions);
    this.frontends = new Map(
      FRONTENDS.flatMap((door: Frontend) => {
        if (!door.forTenant) return [];
        const log = opts.log.child({ part: 'frontend', frontend: door.name });
        return [[door.name, door.forTenant({ dialer, clients, refusals: this.refusals(log), log })] as const];
      }),
    );
    this.allowList = new AllowList(opts.allowedDestinations);
    if (!this.directRoutes.empty)
      opts.log.info({ directRoutes: this.directRoutes.list() }, 'frontend destinations the server dials itself');
    const quota = this.quota;
    this.destinations = this.destinationDialer();
    // Detached tunnels one credential may leave waiting: as many as it may hold live.
    this.resumable = new ResumableTunnels(opts.maxAgentsPerCredential * MAX_TUNNELS_PER_AGENT);
    const resumeMetrics = new ResumeMetrics(this.metrics, this.resumable);
    this.agentOptions = {
      serverID: opts.serverID,
      serverCount: opts.serverCount,
      registry: this.registry,
      destinations: this.destinations,
      features: opts.resumeTimeoutMs > 0 ? RESUMING_SERVER_FEATURES : SERVER_FEATURES,
      limits: { ...opts.limits, ...opts.agentLimits },
      log: logs.agents,
      metrics: this.metrics,
      refusals: this.refusals(logs.agents),
      tokens: opts.tokens && { authenticator: opts.tokens },
      hideTenant: opts.name !== undefined,
      auditor: this.auditor,
      onConnectionClosed: (c: object) => {
        quota?.release(c);
        clients.connectionClosed(c);
      },
      resume: { timeoutMs: opts.resumeTimeoutMs, tunnels: this.resumable, metrics: resumeMetrics },
      retention: { tenant: this.account, perAgentBytes: retained.perAgent },
    };
    this.serveAgent = createAgentService(this.agentOptions);
    this.metrics.gauge(
      'kanal_server_retained_bytes',
      "Bytes the tenant's agent connections keep for resends (unacknowledged, lingering, detached)",
      () => this.account.retained,
    );
    this.metrics.gauge(
      'kanal_server_held_bytes',
      "Bytes the tenant's agent connections hold: kept for resends plus queued each way (what --memory-budget counts)",
      () => this.account.held,
    );
  }

  /**
   * The tenant's settings changed in its file while who it is did not (its
   * credentials, names, token review and socket): applied in place, so its
   * agents and connections stay. Bounds and limits apply to what comes next
   * (a new agent, dial or tunnel); nothing already admitted is undone.
   */
  update(next: TenantSettingsOptions): void {
    const agentLimits = (): void => void (this.agentOptions.limits = { ...next.limits, ...next.agentLimits });
    const agentBounds = (): void =>
      this.registry.configure({ maxAgentsPerCredential: next.maxAgentsPerCredential, maxAgents: next.maxAgents });
    // One applier per field: a field without one is a compile error, so no setting is silently left unapplied.
    const appliers: { readonly [K in keyof TenantSettingsOptions]-?: () => void } = {
      serverCount: () => void (this.agentOptions.serverCount = next.serverCount),
      maxAgentsPerCredential: () => {
        agentBounds();
        this.resumable.configure(next.maxAgentsPerCredential * MAX_TUNNELS_PER_AGENT);
      },
      maxAgents: agentBounds,
      quota: () => next.quota && this.quota?.configure(next.quota),
      proxyStrategies: () => this.dialer.configure({ timeoutMs: next.backendDialTimeoutMs, strategies: next.proxyStrategies }),
      backendDialTimeoutMs: () => this.dialer.configure({ timeoutMs: next.backendDialTimeoutMs, strategies: next.proxyStrategies }),
      allowedDestinations: () => this.allowList.replace(next.allowedDestinations),
      destinationDialTimeoutMs: () => {
        this.destinationDialTimeoutMs = next.destinationDialTimeoutMs;
        this.destinations.configure({ timeoutMs: next.destinationDialTimeoutMs });
      },
      directRoutes: () => this.directRoutes.replace(next.directRoutes),
      limits: () => {
        this.frontendOptions.limits = next.limits;
        agentLimits();
      },
      agentLimits,
      clients: () => this.clients.configure(next.clients),
      retainedBytes: () => {
        if (!next.retainedBytes) return;
        this.account.cap = next.retainedBytes.perTenant;
        this.agentOptions.retention = { tenant: this.account, perAgentBytes: next.retainedBytes.perAgent };
      },
    };
    for (const apply of Object.values(appliers)) apply();
  }

  /** Node -> control plane dials: this tenant's allow-list within the server-wide budget. */
  private destinationDialer(): DestinationDialer {
    const log = this.opts.log.child({ part: 'node-dial' });
    if (this.allowList.empty) this.opts.log.info('no allowed destination: every node -> control plane dial will be refused');
    else this.opts.log.info({ allowed: this.allowList.list() }, 'node -> control plane destinations allowed');
    return new DestinationDialer({
      allowList: this.allowList,
      timeoutMs: this.opts.destinationDialTimeoutMs,
      budget: this.opts.nodeToCp,
      log,
      refusals: this.refusals(log),
      metrics: this.metrics,
      ...(this.quota ? { quota: this.quota } : {}),
    });
  }

  /** A Refusals counted in this tenant's metrics, flushed when it closes; `audited`: each refusal is an audit record of its own. */
  private refusals(log: Logger, audited = true): Refusals {
    const r = new Refusals(log, this.metrics, undefined, audited ? this.auditor : undefined);
    this.refusalLogs.push(r);
    return r;
  }

  private trackFrontend(tunnel: Tunnel): void {
    this.frontendTunnels.add(tunnel);
    tunnel.once('close', () => this.frontendTunnels.delete(tunnel));
  }

  /** Agent tunnels whose stream was lost, waiting for a resume (they are out of the registry meanwhile). */
  detachedAgentTunnels(): ReturnType<ResumableTunnels['detachedTunnels']> {
    return this.resumable.detachedTunnels();
  }

  /** "3 agent(s) connected" or "no agent connected". */
  agentsDetail(): string {
    const n = this.registry.size;
    return n > 0 ? `${n} agent(s) connected` : 'no agent connected';
  }

  /** Closes every tunnel of the tenant (agents and frontend streams) and what its doors hold; `why` is what their peers and logs are told. */
  close(why?: Error): void {
    for (const t of this.frontendTunnels) t.close(why);
    for (const f of this.frontends.values()) f.close?.();
    for (const b of this.registry.list()) b.tunnel.close(why);
    this.resumable.closeDetached(why);
    for (const r of this.refusalLogs) r.flush();
  }
}
