/**
 * Connections waiting for the transport's 'drain' to send more bulk data, at
 * most one entry each, resumed in turn: whoever did not get a turn goes first
 * next time, ahead of the ones that just sent and queued again (else one bulk
 * sender that refills the transport on every drain starves the rest).
 */
export class DrainWaiters {
  private waiting = new Set<() => void>();

  add(resume: () => void): void {
    this.waiting.add(resume);
  }

  /**
   * Resumes the waiters in order while `open()` and not `blocked()`; when a
   * resumed sender blocked the transport again, the rest wait ahead of it.
   */
  resume(open: () => boolean, blocked: () => boolean): void {
    const waiters = [...this.waiting];
    this.waiting = new Set();
    for (let i = 0; i < waiters.length; i++) {
      waiters[i]();
      // Closed by what the waiter did: its close dropped the rest.
      if (!open()) return;
      if (blocked()) {
        const again = this.waiting;
        this.waiting = new Set(waiters.slice(i + 1));
        for (const w of again) this.waiting.add(w);
        return;
      }
    }
  }

  clear(): void {
    this.waiting.clear();
  }
}
