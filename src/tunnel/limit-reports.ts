/**
 * How a tunnel tells of a limit it reached: the metric hook (TunnelOptions.onLimit)
 * and the flag that sets the limit, named in log lines and refusals so an
 * operator knows what to raise (docs/limits.md).
 */
import type { TunnelLimitName, TunnelLimits } from './limits.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { DialRate } from '../domain/dial-rate.js';

/** The kanal_refusals_total reason for each dial-refusing tunnel limit, per kind of tunnel. */
export type RefusalReasons = Partial<Record<TunnelLimitName, RefusalReason>>;

/** A dial a limit refused: the text for the requester and logs, and the refusal's reason when the tunnel's kind names one. */
export interface LimitRefusal {
  message: string;
  reason?: RefusalReason;
}

export interface LimitReportsOptions {
  limits: TunnelLimits;
  onLimit?: (limit: TunnelLimitName, reason: RefusalReason | undefined) => void;
  limitFlags?: Partial<Record<TunnelLimitName, string>>;
  refusalReasons?: RefusalReasons;
}

export class LimitReports {
  constructor(private readonly opts: LimitReportsOptions) {}

  /** Counts one hit of `limit` (metrics). */
  reached(limit: TunnelLimitName): void {
    this.opts.onLimit?.(limit, this.opts.refusalReasons?.[limit]);
  }

  /** `{ flag }` naming the setting of `limit`, for log lines. */
  flagOf(limit: TunnelLimitName): { flag?: string } {
    const flag = this.opts.limitFlags?.[limit];
    return flag ? { flag } : {};
  }

  /** The refusal when `rate` has no token for a dial now (which is then reported as dialRate), or undefined. */
  overRate(rate: DialRate): LimitRefusal | undefined {
    if (rate.take()) return undefined;
    this.reached('dialRate');
    const { flag } = this.flagOf('dialRate');
    return this.refusal('dialRate', `too many dials: faster than ${rate.describe()}${flag ? ` (${flag})` : ''}`);
  }

  /** The refusal text when `count` has reached `limit` (which is then reported), or undefined. */
  overLimit(limit: TunnelLimitName, count: number, what: string): LimitRefusal | undefined {
    const max = this.opts.limits[limit];
    if (count < max) return undefined;
    this.reached(limit);
    const { flag } = this.flagOf(limit);
    return this.refusal(limit, `too many ${what}: ${count}, limit ${max}${flag ? ` (${flag})` : ''}`);
  }

  private refusal(limit: TunnelLimitName, message: string): LimitRefusal {
    const reason = this.opts.refusalReasons?.[limit];
    return reason ? { message, reason } : { message };
  }
}
