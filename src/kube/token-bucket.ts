/**
 * Client-side request rate limit with client-go's semantics
 * (`--kubeconfig-qps`, `--kubeconfig-burst`; rest.Config QPS/Burst): a token
 * bucket that starts full with `burst` tokens and refills at `qps` per second;
 * 0 means client-go's default (5 QPS, burst 10), a negative QPS no limit.
 * Unlike client-go's Wait, a caller never queues past its own deadline: it
 * learns at once that it would, and can refuse instead.
 */

export const DEFAULT_QPS = 5;
export const DEFAULT_BURST = 10;

export class TokenBucket {
  readonly qps: number;
  readonly burst: number;
  /** Tokens available at `lastMs`; negative when later callers hold reservations. */
  private tokens: number;
  private lastMs: number;

  constructor(
    qps: number,
    burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.qps = qps === 0 ? DEFAULT_QPS : qps;
    this.burst = burst <= 0 ? DEFAULT_BURST : burst;
    this.tokens = this.burst;
    this.lastMs = this.now();
  }

  get unlimited(): boolean {
    return this.qps < 0;
  }

  /**
   * Takes a token: the delay (ms) before the caller may send, or undefined
   * when that delay would exceed `maxWaitMs` (nothing is taken then).
   */
  reserve(maxWaitMs: number): number | undefined {
    if (this.unlimited) return 0;
    this.refill();
    const delay = this.tokens >= 1 ? 0 : ((1 - this.tokens) / this.qps) * 1000;
    if (delay > maxWaitMs) return undefined;
    this.tokens -= 1;
    return delay;
  }

  /** Returns a reserved token the caller did not use (it gave up waiting). */
  release(): void {
    if (this.unlimited) return;
    this.refill();
    this.tokens = Math.min(this.burst, this.tokens + 1);
  }

  private refill(): void {
    const now = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.lastMs) / 1000) * this.qps);
    this.lastMs = now;
  }
}
