/**
 * What one identity's tunnels share of the dial limits (docs/limits.md):
 * a dial-rate bucket per direction, and the counts of dials waiting for an
 * answer and of connections open, summed over every tunnel of that identity
 * (live, duplicate or detached for a resume). A tunnel that joins an
 * allowance already used by another starts with what is left of it, so a
 * reconnect or a second stream never brings a full bucket or empty counts
 * (docs/trust-model.md: rates belong to identities, not to streams).
 */
import { DialRate } from '../domain/dial-rate.js';
import type { TunnelLimits } from './limits.js';

/** What one tunnel holds now, each direction: the peer's dials this side performs (inbound), and its own (outbound). */
export interface DialHoldings {
  inboundPending: number;
  inboundConnections: number;
  outboundPending: number;
  outboundConnections: number;
}

export type DialRateLimits = Pick<TunnelLimits, 'dialRate' | 'dialBurst'>;

export interface DialAllowanceOptions {
  limits: DialRateLimits;
  now?: () => number;
  /** Called each time the last tunnel leaves (the owning table then may forget it once its buckets are full again). */
  onUnused?: (allowance: DialAllowance) => void;
}

export class DialAllowance {
  /** The peer's dials a second that this side performs. */
  readonly inbound: DialRate;
  /** Dials a second this side asks the peer for. */
  readonly outbound: DialRate;
  /** The tunnels that hold a share of it now, each read when the counts are asked for. Invariant: a tunnel is in it from join() until its leave(). */
  private readonly members = new Set<() => DialHoldings>();

  constructor(private readonly opts: DialAllowanceOptions) {
    const { dialRate, dialBurst } = opts.limits;
    this.inbound = new DialRate(dialRate, dialBurst, opts.now);
    this.outbound = new DialRate(dialRate, dialBurst, opts.now);
  }

  /** New rate values (a reload, or a tenant's file changed): both buckets keep their tokens up to the new burst. */
  configure({ dialRate, dialBurst }: DialRateLimits): void {
    this.inbound.configure(dialRate, dialBurst);
    this.outbound.configure(dialRate, dialBurst);
  }

  /** A tunnel takes its share; the function returned (idempotent) gives it back when the tunnel has closed. */
  join(holdings: () => DialHoldings): () => void {
    this.members.add(holdings);
    return () => {
      if (!this.members.delete(holdings)) return;
      if (this.members.size === 0) this.opts.onUnused?.(this);
    };
  }

  /** Some tunnel holds a share of it now. */
  get inUse(): boolean {
    return this.members.size > 0;
  }

  /** No tunnel holds it and both buckets are full: nothing is lost when it is forgotten. */
  get idle(): boolean {
    return !this.inUse && this.inbound.full && this.outbound.full;
  }

  /** Starts no fuller than `other`, direction by direction (it takes the place of `other`'s identity). */
  noFullerThan(other: DialAllowance): void {
    this.inbound.noFullerThan(other.inbound);
    this.outbound.noFullerThan(other.outbound);
  }

  /** What all its tunnels hold together now. */
  holdings(): DialHoldings {
    const sum: DialHoldings = { inboundPending: 0, inboundConnections: 0, outboundPending: 0, outboundConnections: 0 };
    for (const member of this.members) {
      const h = member();
      sum.inboundPending += h.inboundPending;
      sum.inboundConnections += h.inboundConnections;
      sum.outboundPending += h.outboundPending;
      sum.outboundConnections += h.outboundConnections;
    }
    return sum;
  }
}
