/**
 * A frontend client's own limits (its `limits:` in `clients:`): its
 * connections, its dials waiting for an answer and its dial rate, through
 * agents and direct routes together, so a scraping Prometheus cannot take
 * what the kube-apiserver's `exec` and `logs -f` need. The tenant's DialQuota
 * (src/domain/dial-quota.ts), counted under the client_* refusal reasons and
 * worded with the client's name and setting.
 */
import { DialQuota, type DialQuotaLimits, type QuotaRefusal, type QuotaTicket, type QuotaWording } from '../../domain/dial-quota.js';

/** One client's limits, as its entry's `limits:` names them. */
export interface ClientLimits {
  connections: number;
  pendingDials: number;
  /** Dials per second; 0: not rate-limited. */
  dialRate: number;
  dialBurst: number;
}

/** What a client entry without `limits:` (or without one of them) gets. */
export const DEFAULT_CLIENT_CONNECTIONS = 1000;
export const DEFAULT_CLIENT_PENDING_DIALS = 100;
export const DEFAULT_CLIENT_DIAL_RATE = 100;
export const DEFAULT_CLIENT_DIAL_BURST = 200;

export const DEFAULT_CLIENT_LIMITS: Readonly<ClientLimits> = {
  connections: DEFAULT_CLIENT_CONNECTIONS,
  pendingDials: DEFAULT_CLIENT_PENDING_DIALS,
  dialRate: DEFAULT_CLIENT_DIAL_RATE,
  dialBurst: DEFAULT_CLIENT_DIAL_BURST,
};

/** `limits` with the defaults for what it leaves out, as DialQuota takes them. */
export function clientQuotaLimits(limits: Partial<ClientLimits> = {}): DialQuotaLimits {
  const l = { ...DEFAULT_CLIENT_LIMITS, ...limits };
  return { maxConnections: l.connections, maxPendingDials: l.pendingDials, dialRate: l.dialRate, dialBurst: l.dialBurst };
}

/** The refusals of client `name`'s quota: each names the client, the limit and the key of its entry that sets it. */
export function clientQuotaWording(name: string): QuotaWording {
  const of = `of client ${name} in clients:`;
  return {
    connections: {
      reason: 'client_connections',
      message: (max) => `client ${name} holds its maximum of ${max} connections (limits.connections ${of})`,
    },
    pendingDials: {
      reason: 'client_pending_dials',
      message: (max) => `client ${name} has its maximum of ${max} dials waiting for an answer (limits.pending-dials ${of})`,
    },
    dialRate: {
      reason: 'client_dial_rate',
      message: (perSecond) => `client ${name} dials faster than its ${perSecond} dials/s (limits.dial-rate, limits.dial-burst ${of})`,
    },
  };
}

export class ClientQuota {
  private readonly quota: DialQuota;

  constructor(
    /** The client's name (a DNS label: logs, metrics, audit). */
    readonly client: string,
    limits: Partial<ClientLimits> = {},
  ) {
    this.quota = new DialQuota(clientQuotaLimits(limits), clientQuotaWording(client));
  }

  /** New limits (the client's entry changed): tickets out stay valid, as DialQuota.configure(). */
  configure(limits: Partial<ClientLimits> = {}): void {
    this.quota.configure(clientQuotaLimits(limits));
  }

  get stats(): { pendingDials: number; connections: number } {
    return this.quota.stats;
  }

  /** A ticket for one dial of the client, or why it may not dial now (client_connections, client_pending_dials, client_dial_rate). */
  take(): QuotaTicket | QuotaRefusal {
    return this.quota.take();
  }

  /** `ticket`'s dial made `connection`: the ticket is given back when release(connection) is called. */
  hold(connection: object, ticket: QuotaTicket): void {
    this.quota.hold(connection, ticket);
  }

  /** A connection closed: its ticket, if it holds one, is given back. */
  release(connection: object): void {
    this.quota.release(connection);
  }
}

/**
 * Each client's quota, kept by name across reloads so tickets out stay
 * counted: an entry that limits nothing of its own (`allow: all` and no
 * `limits:`, the kube-apiserver) has none, as upstream; any other gets its
 * `limits:` with the defaults for what it leaves out.
 */
export class ClientQuotaBook {
  private readonly quotas = new Map<string, ClientQuota>();

  of(entry: { readonly name: string; readonly allow: unknown; readonly limits?: Partial<ClientLimits> }): ClientQuota | undefined {
    if (entry.allow === 'all' && entry.limits === undefined) return undefined;
    const known = this.quotas.get(entry.name);
    if (known) {
      known.configure(entry.limits);
      return known;
    }
    // Bounded by the entries of the lists loaded: a name no list has any more costs one small object.
    const quota = new ClientQuota(entry.name, entry.limits);
    this.quotas.set(entry.name, quota);
    return quota;
  }
}
