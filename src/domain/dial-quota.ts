/**
 * A tenant's share of the server (docs/multi-tenant.md, "Fairness"): its
 * tunnelled connections, its dials waiting for an answer and its dial rate,
 * both directions together, so one tenant's load is bounded by its own
 * limits and never by another's; a frontend client's share of its tenant
 * the same way (server/clients/client-quota.ts), under its own wording. A dial takes a ticket before anything is
 * dialled; the ticket is given back exactly once, when the dial fails or the
 * connection it made closes.
 */
import type { RefusalReason } from './refusal-reason.js';
import { DialRate } from './dial-rate.js';

export interface DialQuotaLimits {
  maxConnections: number;
  maxPendingDials: number;
  /** Dials per second; 0: not rate-limited. */
  dialRate: number;
  dialBurst: number;
}

/** The refusal reasons a quota counts under: a tenant's, or a frontend client's (server/clients/client-quota.ts). */
export type QuotaReason = Extract<
  RefusalReason,
  'tenant_connections' | 'tenant_pending_dials' | 'tenant_dial_rate' | 'client_connections' | 'client_pending_dials' | 'client_dial_rate'
>;

export type QuotaRefusal = {
  reason: QuotaReason;
  message: string;
};

/** Whose quota it is, in a refusal: its reasons and its messages, each naming the limit and the setting that sets it. */
export interface QuotaWording {
  connections: { reason: QuotaReason; message: (max: number) => string };
  pendingDials: { reason: QuotaReason; message: (max: number) => string };
  dialRate: { reason: QuotaReason; message: (perSecond: number) => string };
}

/** A tenant's (the tenants file's max-connections, max-pending-dials, dial-rate and dial-burst). */
export const TENANT_QUOTA_WORDING: QuotaWording = {
  connections: {
    reason: 'tenant_connections',
    message: (max) => `the tenant holds its maximum of ${max} tunnelled connections (max-connections)`,
  },
  pendingDials: {
    reason: 'tenant_pending_dials',
    message: (max) => `the tenant has its maximum of ${max} dials waiting for an answer (max-pending-dials)`,
  },
  dialRate: {
    reason: 'tenant_dial_rate',
    message: (perSecond) => `the tenant dials faster than its ${perSecond} dials/s (dial-rate, dial-burst)`,
  },
};

/** A dial's place in the quota: pending until connected() or done(); done() gives everything back (once). */
export interface QuotaTicket {
  connected(): void;
  done(): void;
}

export class DialQuota {
  /** Dials taken and not yet answered; connections established and not yet closed. Invariant: both >= 0. */
  private pending = 0;
  private connections = 0;
  private readonly rate: DialRate;

  /** Connections whose ticket is given back when they close (release()). */
  private readonly held = new Map<object, QuotaTicket>();

  constructor(
    private limits: DialQuotaLimits,
    private readonly wording: QuotaWording = TENANT_QUOTA_WORDING,
  ) {
    this.rate = new DialRate(limits.dialRate, limits.dialBurst);
  }

  /** New limits (a tenant's file changed): tickets out stay valid; the bucket keeps its tokens up to the new burst. */
  configure(limits: DialQuotaLimits): void {
    this.limits = limits;
    this.rate.configure(limits.dialRate, limits.dialBurst);
  }

  get stats(): { pendingDials: number; connections: number } {
    return { pendingDials: this.pending, connections: this.connections };
  }

  /** `ticket`'s dial made `connection`: the ticket is given back when release(connection) is called. */
  hold(connection: object, ticket: QuotaTicket): void {
    ticket.connected();
    this.held.set(connection, ticket);
  }

  /** A connection closed: its ticket, if it holds one, is given back. */
  release(connection: object): void {
    this.held.get(connection)?.done();
    this.held.delete(connection);
  }

  /** A ticket for one dial, or why the tenant may not dial now. */
  take(): QuotaTicket | QuotaRefusal {
    const { maxConnections, maxPendingDials, dialRate } = this.limits;
    const w = this.wording;
    if (this.pending + this.connections >= maxConnections)
      return { reason: w.connections.reason, message: w.connections.message(maxConnections) };
    if (this.pending >= maxPendingDials) return { reason: w.pendingDials.reason, message: w.pendingDials.message(maxPendingDials) };
    if (!this.rate.take()) return { reason: w.dialRate.reason, message: w.dialRate.message(dialRate) };
    this.pending++;
    let state: 'pending' | 'connected' | 'done' = 'pending';
    return {
      connected: () => {
        if (state !== 'pending') return;
        state = 'connected';
        this.pending--;
        this.connections++;
      },
      done: () => {
        if (state === 'pending') this.pending--;
        else if (state === 'connected') this.connections--;
        state = 'done';
      },
    };
  }
}

export function isQuotaRefusal(t: QuotaTicket | QuotaRefusal): t is QuotaRefusal {
  return 'reason' in t;
}
