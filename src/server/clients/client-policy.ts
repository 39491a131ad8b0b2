/**
 * A tenant's frontend clients with a `clients:` list (docs/frontends.md,
 * "Clients"): each connection's client is admitted by its credentials
 * (client-admission.ts), and each dial it asks for is checked against its
 * entry's rules (client-rules.ts) before anything is dialled:
 *
 * 1. an entry that allows all (the kube-apiserver's) dials as upstream;
 * 2. an IP literal must be allowed by a CIDR rule;
 * 3. a name allowed by a name rule is dialled by name (the agent resolves it);
 * 4. any other name, when some CIDR rule takes its port, is resolved first
 *    through an agent as the dial would pick it, and every address it
 *    resolved to must be allowed: then the first one is dialled (so the
 *    agent cannot resolve it anew to something else).
 *
 * A refusal is a DialError 'forbidden' naming the client, the destination
 * and the rules, counted (kanal_refusals_total{reason="client_forbidden"},
 * kanal_frontend_client_dials_total), logged (rate-limited) and audited with
 * the client's name. Direct routes and per-client limits are optional parts
 * (client-quota.ts, direct-routes.ts) typed here by what the policy needs.
 */
import type net from 'node:net';
import { isIP } from 'node:net';
import type { CancelSignal } from '../../common/cancel.js';
import { formatHostPort, parseHostPort } from '../../common/host-port.js';
import { truncateForLog } from '../../common/log-safety.js';
import type { Refusals } from '../../domain/refusal-log.js';
import type { RefusalReason } from '../../domain/refusal-reason.js';
import type { QuotaTicket } from '../../domain/dial-quota.js';
import type { ConnectionAuditor } from '../../audit/connection-auditor.js';
import { DialError } from '../../tunnel/errors.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import type { ClientEntry } from './client-entry.js';
import { ClientAdmission, type TokenReviewer } from './client-admission.js';
import { ClientRules } from './client-rules.js';
import type { ClientMetrics } from './client-metrics.js';
import {
  ClientRefused,
  type AgentDialer,
  type ClientCredentials,
  type Dialed,
  type FrontendClient,
  type FrontendClients,
} from './frontend-client.js';

/** A client's own limits (client-quota.ts): a ticket per dial, given back (done) when it fails or its connection closes. */
export interface ClientQuota {
  take(): QuotaTicket | { readonly reason: RefusalReason; readonly message: string };
}

/** Each entry's limits, when it has any (client-quota.ts). */
export interface ClientQuotas {
  of(entry: ClientEntry): ClientQuota | undefined;
}

/** Destinations the server dials itself, counted and audited (direct-dials.ts). */
export interface DirectRouter {
  readonly empty: boolean;
  matches(host: string, port: number): boolean;
  dial(address: string, client: ClientIdentity, signal?: CancelSignal): Promise<net.Socket>;
}

export interface ClientPolicyOptions {
  entries: readonly ClientEntry[];
  dialer: AgentDialer;
  metrics: ClientMetrics;
  /** Admission refusals: counted, logged and audited. */
  refusals: Refusals;
  /** Dial refusals: counted and logged; audited as the dial (auditor). */
  dialRefusals: Refusals;
  auditor?: ConnectionAuditor;
  /** Reviews service-account clients' tokens; needed when an entry has service-account. */
  reviewer?: TokenReviewer;
  quotas?: ClientQuotas;
  direct?: DirectRouter;
}

interface Admitted {
  readonly entry: ClientEntry;
  readonly rules: ClientRules | undefined;
  readonly quota: ClientQuota | undefined;
}

function isQuotaTicket(t: QuotaTicket | { reason: RefusalReason }): t is QuotaTicket {
  return !('reason' in t);
}

export class ClientPolicy implements FrontendClients {
  private admission!: ClientAdmission;
  private byName = new Map<string, Admitted>();
  /** What closes each open connection's count (and gives its ticket back): by connection, until connectionClosed(). */
  private readonly held = new Map<object, () => void>();

  constructor(private readonly opts: ClientPolicyOptions) {
    this.configure(opts.entries, opts.reviewer);
  }

  /** A reload's list: admissions and dials from now on follow it; connections open stay. */
  configure(entries: readonly ClientEntry[], reviewer = this.opts.reviewer): void {
    this.admission = new ClientAdmission(entries, reviewer);
    this.byName = new Map(
      entries.map((entry) => [
        entry.name,
        { entry, rules: entry.allow === 'all' ? undefined : new ClientRules(entry.allow), quota: this.opts.quotas?.of(entry) },
      ]),
    );
  }

  get size(): number {
    return this.byName.size;
  }

  async admit(credentials: ClientCredentials): Promise<FrontendClient> {
    try {
      const entry = await this.admission.admit(credentials);
      return { name: entry.name, identity: { ...credentials.identity, name: entry.name } };
    } catch (err) {
      if (err instanceof ClientRefused)
        this.opts.refusals.refuse({
          reason: 'client_unknown',
          peer: credentials.identity.address,
          fields: { door: credentials.door, status: err.status, why: err.message },
          message: 'refused frontend client: no clients: entry matches it',
          detail: String(err.status),
        });
      throw err;
    }
  }

  async dial(client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed> {
    const t0 = performance.now();
    const identity: ClientIdentity = client.identity.name === client.name ? client.identity : { ...client.identity, name: client.name };
    const who = { ...client, identity };
    const admitted = this.byName.get(client.name);
    if (!admitted) return this.forbid(who, address, `no client entry is named ${JSON.stringify(client.name)} any more`, t0);
    const ticket = this.ticket(who, admitted, address, t0);
    try {
      const dialed = await this.checkedDial(who, admitted, address, signal, t0);
      this.opts.metrics.dialed(client.name, 'ok');
      this.hold(client.name, dialed, ticket);
      return dialed;
    } catch (err) {
      ticket?.done();
      throw err;
    }
  }

  /** A tunnelled connection closed (the agent tunnel's onConnectionClosed): its client's count goes down. */
  connectionClosed(conn: object): void {
    const release = this.held.get(conn);
    if (!release) return;
    this.held.delete(conn);
    release();
  }

  private ticket(client: FrontendClient, admitted: Admitted, address: string, t0: number): QuotaTicket | undefined {
    const taken = admitted.quota?.take();
    if (taken === undefined || isQuotaTicket(taken)) return taken;
    this.opts.metrics.dialed(client.name, 'exhausted');
    this.opts.dialRefusals.refuse({
      reason: taken.reason,
      peer: client.identity.address,
      fields: { client: client.name, address },
      message: "refused dial: over the client's limits",
      detail: client.name,
    });
    const failure = new DialError('exhausted', `client ${JSON.stringify(client.name)}: ${taken.message}`, taken.reason);
    this.opts.auditor?.dialFailed({
      direction: 'cp_to_node',
      client: client.identity,
      destination: address,
      error: failure,
      startedAt: t0,
    });
    throw failure;
  }

  private hold(name: string, dialed: Dialed, ticket: QuotaTicket | undefined): void {
    ticket?.connected();
    const closed = this.opts.metrics.opened(name);
    const release = (): void => {
      closed();
      ticket?.done();
    };
    if (dialed.via === 'direct') dialed.socket.once('close', release);
    else if (dialed.conn.state === 'closed') release();
    else this.held.set(dialed.conn, release);
  }

  private async checkedDial(
    client: FrontendClient,
    { entry, rules }: Admitted,
    address: string,
    signal: CancelSignal | undefined,
    t0: number,
  ): Promise<Dialed> {
    if (!rules) return this.dialOut(client, address, signal);
    let host: string;
    let port: number;
    try {
      ({ host, port } = parseHostPort(address));
    } catch {
      // The dialer refuses it, counted and audited as a malformed address.
      return this.dialOut(client, address, signal);
    }
    if (isIP(host) !== 0) {
      if (rules.addressRule(host, port)) return this.dialOut(client, address, signal);
      return this.forbid(client, address, `no rule allows it (the rules of ${entry.name}: ${rules.describe()})`, t0);
    }
    if (rules.nameRule(host, port)) return this.dialOut(client, address, signal);
    if (!rules.addressesCanAllow(port))
      return this.forbid(client, address, `no rule allows it (the rules of ${entry.name}: ${rules.describe()})`, t0);
    let resolved;
    try {
      resolved = await this.opts.dialer.resolve(host, signal);
    } catch (err) {
      this.failed(client, address, err, t0);
      throw err;
    }
    const denied = resolved.addresses.filter((a) => !rules.addressRule(a, port));
    if (denied.length > 0) {
      const listed = denied.slice(0, 4).join(', ') + (denied.length > 4 ? ` and ${denied.length - 4} more` : '');
      return this.forbid(
        client,
        address,
        `${host} resolved (${truncateForLog(resolved.resolver, 80)}) to ${listed}, which no rule allows (the rules of ${entry.name}: ${rules.describe()})`,
        t0,
      );
    }
    return this.dialOut(client, formatHostPort({ host: resolved.addresses[0], port }), signal, host);
  }

  /** The dial itself: a direct route, else through an agent; a failure counted for the client (the dialer logs and audits it). */
  private async dialOut(client: FrontendClient, address: string, signal: CancelSignal | undefined, routeHost?: string): Promise<Dialed> {
    try {
      const direct = this.opts.direct;
      if (direct) {
        const { host, port } = parseHostPortOrUndefined(address) ?? { host: '', port: 0 };
        if (port > 0 && direct.matches(routeHost ?? host, port))
          return { via: 'direct', socket: await direct.dial(address, client.identity, signal) };
      }
      return { via: 'tunnel', conn: await this.opts.dialer.dial(address, signal, client.identity, routeHost) };
    } catch (err) {
      this.opts.metrics.dialed(client.name, err instanceof DialError ? err.failure : 'refused');
      throw err;
    }
  }

  /** A failure before the dial (resolving): counted and audited for the client. */
  private failed(client: FrontendClient, address: string, err: unknown, t0: number): void {
    this.opts.metrics.dialed(client.name, err instanceof DialError ? err.failure : 'refused');
    this.opts.auditor?.dialFailed({ direction: 'cp_to_node', client: client.identity, destination: address, error: err, startedAt: t0 });
  }

  private forbid(client: FrontendClient, address: string, why: string, t0: number): never {
    const message = `client ${JSON.stringify(client.name)} may not reach ${truncateForLog(address, 260)}: ${why}`;
    this.opts.metrics.dialed(client.name, 'forbidden');
    this.opts.dialRefusals.refuse({
      reason: 'client_forbidden',
      peer: client.identity.address,
      fields: { client: client.name, address, why },
      message: 'refused dial: no rule of the client allows the destination',
      detail: client.name,
    });
    const failure = new DialError('forbidden', message, 'client_forbidden');
    this.opts.auditor?.dialFailed({
      direction: 'cp_to_node',
      client: client.identity,
      destination: address,
      error: failure,
      startedAt: t0,
    });
    throw failure;
  }
}

function parseHostPortOrUndefined(address: string): { host: string; port: number } | undefined {
  try {
    return parseHostPort(address);
  } catch {
    return undefined;
  }
}
