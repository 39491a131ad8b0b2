/**
 * Bounded concurrency with a bounded, timed wait: at most `limit` holders,
 * at most `maxWaiting` callers queued (FIFO), each for at most its own wait
 * budget. Beyond either bound a caller is refused at once, so a slow
 * dependency costs callers time, never memory.
 */

export class SlotsUnavailableError extends Error {
  override readonly name = 'SlotsUnavailableError';
  constructor(
    readonly why: 'queue-full' | 'wait-timeout',
    message: string,
  ) {
    super(message);
  }
}

interface Waiter {
  grant: (release: () => void) => void;
  timer: NodeJS.Timeout;
}

export class RequestSlots {
  /** Slots held; never above `limit`. */
  private held = 0;
  /** Callers waiting in arrival order; never longer than `maxWaiting`. */
  private readonly waiters: Waiter[] = [];

  constructor(
    readonly limit: number,
    readonly maxWaiting: number,
  ) {
    if (!(limit >= 1) || !(maxWaiting >= 0))
      throw new RangeError(`RequestSlots(${limit}, ${maxWaiting}): need limit >= 1 and maxWaiting >= 0`);
  }

  get inUse(): number {
    return this.held;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /** A release function once a slot is free; call it exactly once. */
  acquire(maxWaitMs: number): Promise<() => void> {
    if (this.held < this.limit) {
      this.held++;
      return Promise.resolve(this.releaser());
    }
    if (this.waiters.length >= this.maxWaiting) {
      return Promise.reject(
        new SlotsUnavailableError('queue-full', `${this.held} requests in flight and ${this.waiters.length} waiting (the limit)`),
      );
    }
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        grant: resolve,
        timer: setTimeout(
          () => {
            const i = this.waiters.indexOf(waiter);
            if (i >= 0) this.waiters.splice(i, 1);
            reject(
              new SlotsUnavailableError('wait-timeout', `no request slot free within ${Math.round(maxWaitMs)} ms (${this.held} in flight)`),
            );
          },
          Math.max(0, maxWaitMs),
        ),
      };
      this.waiters.push(waiter);
    });
  }

  private releaser(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.waiters.shift();
      if (next) {
        clearTimeout(next.timer);
        next.grant(this.releaser()); // the slot passes on; `held` is unchanged
      } else {
        this.held--;
      }
    };
  }
}
