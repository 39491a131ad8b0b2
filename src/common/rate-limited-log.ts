/**
 * Logs a repeated event at most once per interval per key (a peer and a
 * reason, say), then one line with the count of what was suppressed, so a
 * misbehaving peer cannot flood the logs. Memory is bounded
 * too: past `maxKeys` keys in their window, new keys share one overflow key.
 */
import type { Logger } from 'pino';
import { boundFields } from './log-safety.js';

type Level = 'info' | 'warn';

interface Window {
  level: Level;
  message: string;
  /** The first event's fields, bounded: kept for the summary line. */
  fields: Record<string, unknown>;
  suppressed: number;
  timer: NodeJS.Timeout;
}

const OVERFLOW_KEY = '(too many distinct keys)';

export class RateLimitedLog {
  /** Keys in their window now; each entry leaves when its window ends. */
  private readonly windows = new Map<string, Window>();

  constructor(
    private readonly log: Logger,
    private readonly intervalMs: number,
    private readonly maxKeys = 256,
  ) {}

  warn(key: string, fields: Record<string, unknown>, message: string): void {
    this.write('warn', key, fields, message);
  }

  info(key: string, fields: Record<string, unknown>, message: string): void {
    this.write('info', key, fields, message);
  }

  /** Reports what is still suppressed and forgets every window (the owner is closing). */
  flush(): void {
    for (const key of [...this.windows.keys()]) this.endWindow(key);
  }

  private write(level: Level, key: string, fields: Record<string, unknown>, message: string): void {
    const open = this.windows.get(key) ?? (this.windows.size >= this.maxKeys ? this.windows.get(OVERFLOW_KEY) : undefined);
    if (open) {
      open.suppressed++;
      return;
    }
    const slot = this.windows.size >= this.maxKeys ? OVERFLOW_KEY : key;
    this.log[level](fields, message);
    const timer = setTimeout(() => this.endWindow(slot), this.intervalMs);
    timer.unref();
    this.windows.set(slot, { level, message, fields: boundFields(fields), suppressed: 0, timer });
  }

  private endWindow(key: string): void {
    const w = this.windows.get(key);
    if (!w) return;
    clearTimeout(w.timer);
    this.windows.delete(key);
    if (w.suppressed > 0) {
      this.log[w.level](
        { ...w.fields, suppressed: w.suppressed, withinMs: this.intervalMs },
        `${w.message} (repeated; ${w.suppressed} more suppressed)`,
      );
    }
  }
}
