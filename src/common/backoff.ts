/** Capped exponential back-off with full jitter, reset after a healthy period. */
export class Backoff {
  private attempt = 0;

  constructor(
    private readonly initialMs: number,
    private readonly maxMs: number,
  ) {}

  next(): number {
    const ceiling = Math.min(this.maxMs, this.initialMs * 2 ** Math.min(this.attempt, 30));
    this.attempt++;
    // Half fixed, half random: spreads reconnect storms without ever waiting ~0.
    return Math.round(ceiling / 2 + Math.random() * (ceiling / 2));
  }

  reset(): void {
    this.attempt = 0;
  }
}
