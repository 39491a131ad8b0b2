/** Waits for "something arrived": wait(ms) resolves at the next wakeAll() or after ms, whichever comes first. */
export class Wakeup {
  private readonly waiters = new Set<() => void>();

  wait(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = (): void => {
        clearTimeout(timer);
        this.waiters.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.waiters.add(wake);
    });
  }

  wakeAll(): void {
    for (const wake of [...this.waiters]) wake();
  }
}
