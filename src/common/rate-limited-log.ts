/**
 * Logs a repeated warning at most once per interval per key, with a count of
 * what was suppressed, so a misbehaving peer cannot flood the logs.
 */
import type { Logger } from 'pino';

export class RateLimitedLog {
  private readonly last = new Map<string, { at: number; suppressed: number }>();

  constructor(
    private readonly log: Logger,
    private readonly intervalMs: number,
  ) {}

  warn(key: string, fields: Record<string, unknown>, message: string): void {
    const now = Date.now();
    const entry = this.last.get(key);
    if (entry && now - entry.at < this.intervalMs) {
      entry.suppressed++;
      return;
    }
    const suppressed = entry?.suppressed ?? 0;
    this.last.set(key, { at: now, suppressed: 0 });
    this.log.warn(suppressed > 0 ? { ...fields, suppressed } : fields, message);
  }
}
