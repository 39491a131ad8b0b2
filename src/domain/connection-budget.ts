/**
 * A count of connections (file descriptors) held against a cap, shared by
 * everything that opens them: one agent must not take the descriptors the
 * frontends and the health endpoint need.
 */
export class ConnectionBudget {
  /** Connections taken and not yet released; never above `limit`. */
  private held = 0;

  constructor(readonly limit: number) {}

  get used(): number {
    return this.held;
  }

  /** Takes one; returns its release function (safe to call more than once), or undefined at the cap. */
  take(): (() => void) | undefined {
    if (this.held >= this.limit) return undefined;
    this.held++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.held--;
    };
  }
}
