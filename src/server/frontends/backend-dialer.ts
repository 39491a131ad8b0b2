/**
 * Dials through some agent on behalf of a frontend (the KAS). Shared by the
 * HTTP CONNECT and gRPC frontends so both route and fail the same way.
 */
import type { Logger } from 'pino';
import type { CancelSignal } from '../../common/cancel.js';
import { DialError } from '../../tunnel/errors.js';
import type { TunnelConnection } from '../../tunnel/connection.js';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import { parseHostPort } from '../../common/host-port.js';
import { RateLimitedLog } from '../../common/rate-limited-log.js';
import { peerHost, REFUSAL_LOG_INTERVAL_MS, Refusals } from '../../domain/refusal-log.js';
import { DEFAULT_PROXY_STRATEGIES, type ProxyStrategy } from '../routing/proxy-strategies.js';
import { errorMessage } from '../../common/error-message.js';
import { isQuotaRefusal, type DialQuota } from '../../domain/dial-quota.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import type { ConnectionAuditor } from '../../audit/connection-auditor.js';
import type { ResolvedName } from '../../tunnel/name-resolution.js';

export interface BackendDialerOptions {
  registry: AgentRegistry;
  /** How long a dial waits for the agent's DIAL_RSP (--backend-dial-timeout). */
  timeoutMs: number;
  log: Logger;
  metrics?: KanalMetrics;
  /** Default: a Refusals of its own on `log`. */
  refusals?: Refusals;
  /** How a dial picks its agent (--proxy-strategies); default upstream's. */
  strategies?: readonly ProxyStrategy[];
  /** The tenant's share of the server (tenants/tenant-quota.ts); absent: a server of one cluster. */
  quota?: DialQuota;
  /** Records the dials that made no connection (the audit log). */
  auditor?: ConnectionAuditor;
}

export class BackendDialer {
  /** Failed dials are logged once per interval per frontend peer and kind of failure. */
  private readonly failures: RateLimitedLog;
  private readonly registry: AgentRegistry;
  private timeoutMs: number;
  private readonly log: Logger;
  private readonly metrics: KanalMetrics | undefined;
  private readonly refusals: Refusals;
  private strategies: readonly ProxyStrategy[];
  private readonly quota: DialQuota | undefined;
  private readonly auditor: ConnectionAuditor | undefined;

  constructor(opts: BackendDialerOptions) {
    this.auditor = opts.auditor;
    this.registry = opts.registry;
    this.timeoutMs = opts.timeoutMs;
    this.log = opts.log;
    this.metrics = opts.metrics;
    this.refusals = opts.refusals ?? new Refusals(opts.log, opts.metrics);
    this.strategies = opts.strategies ?? DEFAULT_PROXY_STRATEGIES;
    this.quota = opts.quota;
    this.failures = new RateLimitedLog(opts.log, REFUSAL_LOG_INTERVAL_MS);
  }

  /** A tenant's settings changed in its file: dials from now on use these. */
  configure(o: { timeoutMs: number; strategies?: readonly ProxyStrategy[] }): void {
    this.timeoutMs = o.timeoutMs;
    this.strategies = o.strategies ?? DEFAULT_PROXY_STRATEGIES;
  }

  /**
   * Resolves `name` inside the cluster, through an agent picked as a dial to
   * `name` would pick it (the clients' rules check the addresses before the
   * dial: clients/client-policy.ts); rejects with DialError 'no-backend' or 'unresolved'.
   */
  async resolve(name: string, signal?: CancelSignal): Promise<ResolvedName> {
    try {
      const resolved = await this.resolveThrough(name, signal);
      this.metrics?.resolves.inc({ result: 'ok' });
      return resolved;
    } catch (err) {
      this.metrics?.resolves.inc({ result: err instanceof DialError ? err.failure : 'refused' });
      throw err;
    }
  }

  private async resolveThrough(name: string, signal: CancelSignal | undefined): Promise<ResolvedName> {
    const outcome = await this.registry.pickVerified({ strategies: this.strategies, host: name });
    if (!outcome.ok)
      throw new DialError(
        'no-backend',
        this.registry.size === 0
          ? 'no agent is connected to this proxy server'
          : `no agent serves ${name} to resolve it: ${outcome.reason}`,
      );
    return outcome.backend.tunnel.resolve(name, { timeoutMs: this.timeoutMs, signal });
  }

  /**
   * `client` is the frontend client the dial is for (logs, the audit log and its connection's record);
   * `routeHost`: the host agents are picked for (the name a client asked for, when it is dialled by an address it resolved to).
   */
  async dial(
    address: string,
    signal?: CancelSignal,
    client: ClientIdentity = { address: 'unknown' },
    routeHost?: string,
  ): Promise<TunnelConnection> {
    const t0 = performance.now();
    const peer = client.address;
    let host: string;
    try {
      host = parseHostPort(address).host;
    } catch (err) {
      // Not worth an agent's time, and not worth a line per request.
      this.metrics?.dialDone('cp_to_node', 'refused', t0);
      this.refusals.refuse({
        reason: 'frontend_bad_address',
        peer,
        fields: { address, err: errorMessage(err) },
        message: 'refused dial: malformed address',
      });
      const failure = new DialError('refused', `bad address: ${errorMessage(err)}`, 'frontend_bad_address');
      this.auditor?.dialFailed({ direction: 'cp_to_node', client, destination: address, error: failure, startedAt: t0 });
      throw failure;
    }
    if (routeHost !== undefined) host = routeHost;
    // A server of one cluster has no quota: its dial takes no detour.
    if (!this.quota) return this.dialThrough(address, host, t0, signal, client);
    const ticket = this.quota.take();
    if (isQuotaRefusal(ticket)) {
      this.metrics?.dialDone('cp_to_node', 'exhausted', t0);
      this.refusals.refuse({
        reason: ticket.reason,
        peer,
        fields: { address },
        message: "refused dial: over the tenant's limits",
        detail: ticket.message,
      });
      const failure = new DialError('exhausted', ticket.message, ticket.reason);
      this.auditor?.dialFailed({ direction: 'cp_to_node', client, destination: address, error: failure, startedAt: t0 });
      throw failure;
    }
    try {
      const conn = await this.dialThrough(address, host, t0, signal, client);
      this.quota.hold(conn, ticket);
      return conn;
    } catch (err) {
      ticket.done();
      throw err;
    }
  }

  private async dialThrough(
    address: string,
    host: string,
    t0: number,
    signal: CancelSignal | undefined,
    client: ClientIdentity,
  ): Promise<TunnelConnection> {
    const peer = client.address;
    const outcome = await this.registry.pickVerified({ strategies: this.strategies, host });
    if (outcome.contested) {
      const { host: contested, subjects } = outcome.contested;
      this.failures.warn(
        `contested ${contested}`,
        { host: contested, credentials: subjects.slice(0, 3) },
        'agents of several credentials announce the same destination; destHost routes it to none of them',
      );
    }
    if (!outcome.ok) {
      this.metrics?.dialDone('cp_to_node', 'no-backend', t0);
      const message =
        this.registry.size === 0
          ? 'no agent is connected to this proxy server'
          : `no agent serves ${address} under --proxy-strategies ${this.strategies.join(',')}: ${outcome.reason}`;
      this.failures.warn(`no-backend ${peerHost(peer)}`, { peer, address, reason: message }, 'no agent available for dial');
      const failure = new DialError('no-backend', message);
      this.auditor?.dialFailed({ direction: 'cp_to_node', client, destination: address, error: failure, startedAt: t0 });
      throw failure;
    }
    const { backend, strategy } = outcome;
    const started = performance.now();
    try {
      const conn = await backend.tunnel.dial(address, { timeoutMs: this.timeoutMs, signal });
      conn.client = client;
      this.metrics?.dialDone('cp_to_node', 'ok', t0);
      // Per dial: no fields built unless they are logged (the dial path's CPU counts).
      if (this.log.isLevelEnabled('debug')) {
        this.log.debug(
          {
            peer,
            agentID: backend.agentID,
            credential: backend.credential.subject,
            strategy,
            address,
            connectID: conn.connectID,
            dialID: String(conn.dialID),
            ms: Math.round(performance.now() - started),
          },
          'dial established',
        );
      }
      return conn;
    } catch (err) {
      const failure = err instanceof DialError ? err.failure : 'refused';
      this.metrics?.dialDone('cp_to_node', failure, t0);
      // An agent that lets a dial time out may be gone without a FIN: check now rather than at the next keepalive.
      if (failure === 'timeout') this.registry.verify(backend);
      const fields = {
        peer,
        agentID: backend.agentID,
        credential: backend.credential.subject,
        address,
        failure,
        err: errorMessage(err),
        ms: Math.round(performance.now() - started),
      };
      if (failure === 'cancelled') this.log.debug(fields, 'dial failed');
      else this.failures.warn(`${failure} ${peerHost(peer)}`, fields, 'dial failed');
      this.auditor?.dialFailed({
        direction: 'cp_to_node',
        party: { agent: { id: backend.agentID, credential: backend.credential.subject } },
        client,
        destination: address,
        error: err,
        startedAt: t0,
      });
      throw err;
    }
  }
}
