/**
 * Who waits for a writer's queue to empty, each for a bounded time: the
 * logs' flush() at exit (log-destination.ts) and the audit log's close()
 * (src/audit/queued-writer.ts). A waiter leaves at wake() or at its
 * timeout, whichever comes first.
 */
export class IdleWaiters {
  private readonly waiters = new Set<() => void>();

  /** Resolves at the next wake(), or after `timeoutMs`. */
  wait(timeoutMs: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.waiters.delete(done);
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      this.waiters.add(done);
    });
  }

  /** Whether anyone waits: a writer then writes what it has without lingering. */
  get waiting(): boolean {
    return this.waiters.size > 0;
  }

  /** The queue emptied, or the writer failed: every waiter goes on. */
  wake(): void {
    for (const done of [...this.waiters]) done();
  }
}
