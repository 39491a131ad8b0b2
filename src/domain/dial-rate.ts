/**
 * A dial rate: a token bucket that refills at `rate` tokens a second up to
 * `burst`, and lets a dial through only while it holds a whole token. A
 * refused dial takes nothing and waits for nothing: it is answered at once
 * (exhaustion, as upstream answers a full server), so a flood costs no memory.
 */
export class DialRate {
  /** Tokens as of `refilledAt` (performance.now()). Invariant: 0 <= tokens <= burst. */
  private tokens: number;
  private refilledAt: number;

  /** `rate` dials a second, `burst` at once; a rate of 0 lets every dial through. */
  constructor(
    private rate: number,
    private burst: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.burst = Math.max(1, burst);
    this.tokens = this.burst;
    this.refilledAt = now();
  }

  get unlimited(): boolean {
    return this.rate <= 0;
  }

  /** New values (a reload): the bucket keeps its tokens up to the new burst. */
  configure(rate: number, burst: number): void {
    this.refill();
    this.rate = rate;
    this.burst = Math.max(1, burst);
    this.tokens = Math.min(this.tokens, this.burst);
  }

  /** Takes a token; false (nothing taken) when the dial comes too soon. */
  take(): boolean {
    if (this.rate <= 0) return true;
    this.refill();
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  /** True when the bucket holds its whole burst (or there is no rate): forgetting it now would give nothing away. */
  get full(): boolean {
    if (this.rate <= 0) return true;
    this.refill();
    return this.tokens >= this.burst;
  }

  /** Holds no more tokens than `other` does: a bucket that replaces another must not start fuller than it. */
  noFullerThan(other: DialRate): void {
    this.refill();
    other.refill();
    this.tokens = Math.min(this.tokens, other.tokens);
  }

  /** The values, for messages: "20 dials/s, burst 40". */
  describe(): string {
    return `${this.rate} dials/s, burst ${this.burst}`;
  }

  private refill(): void {
    const now = this.now();
    if (this.rate > 0) this.tokens = Math.min(this.burst, this.tokens + ((now - this.refilledAt) / 1000) * this.rate);
    this.refilledAt = now;
  }
}
