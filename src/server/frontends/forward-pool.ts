/**
 * Idle connections to destinations kept by the forward proxy for the next
 * request of the same client to the same destination (RFC 9112 section 9.3,
 * persistence), bounded per destination, in all, and in time. Each is what
 * the client's dial gave (through a tunnel, or direct) as a stream; while
 * idle nothing may come from it: a byte, a FIN or an error drops it (the
 * destination closed it, or broke the protocol).
 */
import type { Duplex } from 'node:stream';

export interface ForwardPoolLimits {
  /** Idle connections kept per (client, destination). */
  maxIdlePerDestination: number;
  /** Idle connections kept in all (of a tenant's door). */
  maxIdle: number;
  /** How long one is kept unused. */
  idleTimeoutMs: number;
}

export const DEFAULT_FORWARD_POOL_LIMITS: ForwardPoolLimits = {
  maxIdlePerDestination: 8,
  maxIdle: 256,
  // Below the usual servers' idle timeouts (Go's net/http 90 s at the client, many servers 60 s).
  idleTimeoutMs: 30_000,
};

interface Idle {
  readonly key: string;
  readonly stream: Duplex;
  readonly timer: NodeJS.Timeout;
  readonly drop: () => void;
}

export class ForwardPool {
  /** Per key, most recently released last (taken first: the warmest connection). */
  private readonly idle = new Map<string, Idle[]>();
  private count = 0;

  constructor(private readonly limits: ForwardPoolLimits = DEFAULT_FORWARD_POOL_LIMITS) {}

  /** The key of a client's connections to `address`. */
  static key(client: string, address: string): string {
    return `${client}\u0000${address}`;
  }

  /** Idle connections kept now. */
  get size(): number {
    return this.count;
  }

  /** An idle connection for `key`, taken out of the pool; undefined: dial one. */
  take(key: string): Duplex | undefined {
    const list = this.idle.get(key);
    while (list && list.length > 0) {
      const entry = list.pop();
      if (!entry) break;
      this.forget(entry, list);
      if (!entry.stream.destroyed && !entry.stream.readableEnded && entry.stream.writable) return entry.stream;
      entry.stream.destroy();
    }
    return undefined;
  }

  /** Keeps `stream` for `key` (or closes it, when the pool is full); it must be between messages, nothing unread. */
  put(key: string, stream: Duplex): void {
    let list = this.idle.get(key);
    if (stream.destroyed || (list && list.length >= this.limits.maxIdlePerDestination)) {
      stream.destroy();
      return;
    }
    if (this.count >= this.limits.maxIdle) this.evictOldest();
    list ??= [];
    this.idle.set(key, list);
    const owner = list;
    const drop = (): void => {
      const i = owner.indexOf(entry);
      if (i >= 0) {
        owner.splice(i, 1);
        this.forget(entry, owner);
      }
      stream.destroy();
    };
    const timer = setTimeout(drop, this.limits.idleTimeoutMs);
    timer.unref();
    const entry: Idle = { key, stream, timer, drop };
    stream.on('data', drop);
    stream.on('end', drop);
    stream.on('error', drop);
    stream.on('close', drop);
    list.push(entry);
    this.count++;
    stream.resume();
  }

  /** Closes every idle connection (the tenant or the server stops). */
  close(): void {
    for (const list of [...this.idle.values()]) for (const e of [...list]) e.drop();
  }

  private evictOldest(): void {
    // Maps iterate in insertion order: the first key's first entry is about the oldest (good enough for a bound).
    for (const list of this.idle.values()) {
      const e = list[0];
      if (e) {
        e.drop();
        return;
      }
    }
  }

  private forget(entry: Idle, list: Idle[]): void {
    clearTimeout(entry.timer);
    const s = entry.stream;
    s.off('data', entry.drop);
    s.off('end', entry.drop);
    s.off('error', entry.drop);
    s.off('close', entry.drop);
    s.pause();
    this.count--;
    if (list.length === 0) this.idle.delete(entry.key);
  }
}
