/**
 * How the agent's loops wait (server-tunnels.ts): for a timeout, a change
 * (a tunnel lost, the addresses changed: wake()), their own abort, or the
 * agent's stop — whichever comes first. A waiter is called once, then dropped.
 */
import { setMaxListeners } from 'node:events';

export class Wakeups {
  /** Loops waiting for a change; each is called once, then dropped. */
  private readonly waiters = new Set<() => void>();

  /** @param stopped aborted when the agent stops: wakes every wait, for good */
  constructor(private readonly stopped: AbortSignal) {
    // A waiting loop per address listens on it (changeOrTimeout); as many as DNS gives addresses.
    setMaxListeners(0, stopped);
  }

  /** Loops waiting for a change now. */
  get waiting(): number {
    return this.waiters.size;
  }

  /** Wakes every loop waiting in changeOrTimeout(). */
  wake(): void {
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const w of waiters) w();
  }

  /**
   * Resolves after `timeoutMs` (Infinity: never), once `signal` aborts or the
   * agent stops, or (unless `onChange` is false) when a tunnel goes down or the addresses change.
   */
  changeOrTimeout(timeoutMs: number, signal: AbortSignal, onChange = true): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = Number.isFinite(timeoutMs) ? setTimeout(() => done(), timeoutMs) : undefined;
      const done = (): void => {
        clearTimeout(timer);
        this.waiters.delete(done);
        signal.removeEventListener('abort', done);
        this.stopped.removeEventListener('abort', done);
        resolve();
      };
      if (onChange) this.waiters.add(done);
      signal.addEventListener('abort', done, { once: true });
      this.stopped.addEventListener('abort', done, { once: true });
      if (signal.aborted || this.stopped.aborted) done();
    });
  }

  /** Waits `ms`, or less when `signal` aborts or the agent stops. */
  pause(ms: number, signal: AbortSignal): Promise<void> {
    return this.changeOrTimeout(ms, signal, false);
  }

  /** `work`'s result, or undefined as soon as the agent stops (a lookup may take the resolver's whole timeout). */
  async unlessStopped<T>(work: Promise<T>): Promise<T | undefined> {
    let onAbort = (): void => undefined;
    const stopped = new Promise<undefined>((resolve) => {
      onAbort = () => resolve(undefined);
      this.stopped.addEventListener('abort', onAbort, { once: true });
    });
    if (this.stopped.aborted) return undefined;
    try {
      return await Promise.race([work, stopped]);
    } finally {
      this.stopped.removeEventListener('abort', onAbort);
    }
  }
}
