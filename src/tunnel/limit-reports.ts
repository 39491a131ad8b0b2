/**
 * How a tunnel tells of a limit it reached: the metric hook (TunnelOptions.onLimit)
 * and the flag that sets the limit, named in log lines and refusals so an
 * operator knows what to raise (docs/limits.md).
 */
import type { TunnelLimitName, TunnelLimits } from './limits.js';

export interface LimitReportsOptions {
  limits: TunnelLimits;
  onLimit?: (limit: TunnelLimitName) => void;
  limitFlags?: Partial<Record<TunnelLimitName, string>>;
}

export class LimitReports {
  constructor(private readonly opts: LimitReportsOptions) {}

  /** Counts one hit of `limit` (metrics). */
  reached(limit: TunnelLimitName): void {
    this.opts.onLimit?.(limit);
  }

  /** `{ flag }` naming the setting of `limit`, for log lines. */
  flagOf(limit: TunnelLimitName): { flag?: string } {
    const flag = this.opts.limitFlags?.[limit];
    return flag ? { flag } : {};
  }

  /** The refusal text when `count` has reached `limit` (which is then reported), or undefined. */
  overLimit(limit: TunnelLimitName, count: number, what: string): string | undefined {
    const max = this.opts.limits[limit];
    if (count < max) return undefined;
    this.reached(limit);
    const { flag } = this.flagOf(limit);
    return `too many ${what}: ${count}, limit ${max}${flag ? ` (${flag})` : ''}`;
  }
}
