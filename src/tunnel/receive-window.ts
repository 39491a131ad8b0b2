/**
 * The receive side of the window extension for one connection: how much the
 * peer may send (credit), when to grant more, and auto-tuning of the window
 * size, as TCP does it, within a per-connection cap and a per-tunnel budget.
 * Pure bookkeeping: no I/O, the clock is injected (tests: test/tunnel/receive-window.test.ts).
 */

/** A window consumed within this long counts as bulk traffic (see ReceiveWindow.grow). */
export const GROW_WITHIN_MS = 250;

/** Window growth all connections of one tunnel may hold together (TunnelLimits.windowGrowthBudgetBytes). */
export class WindowGrowthBudget {
  /** Growth reserved and not yet released: 0 <= held <= limit. */
  private heldBytes = 0;

  constructor(private readonly limit: number) {}

  get held(): number {
    return this.heldBytes;
  }

  /** Takes `bytes` from the budget; false (and nothing taken) when that would pass the limit. */
  reserve(bytes: number): boolean {
    if (this.heldBytes + bytes > this.limit) return false;
    this.heldBytes += bytes;
    return true;
  }

  release(bytes: number): void {
    this.heldBytes = Math.max(0, this.heldBytes - bytes);
  }
}

export interface ReceiveWindowSizes {
  /** The window first granted (TunnelLimits.windowBytes). */
  windowBytes: number;
  /** What it may grow to (TunnelLimits.maxWindowBytes >= windowBytes). */
  maxWindowBytes: number;
}

export class ReceiveWindow {
  /** The window now: windowBytes <= size <= maxWindowBytes; only grows, by reserving from the budget. */
  private sizeBytes: number;
  /** Bytes received from the peer so far (monotonic). */
  private receivedBytes = 0;
  /** Bytes consumed when credit was last granted: the peer may have at most `size` received beyond it. */
  private grantedBytes = 0;
  /** Start of the current growth measurement: bytes consumed then, and when. */
  private epochConsumed = 0;
  private epochStartedAt: number;
  /** Set by release(): the growth went back to the budget; nothing grows any more. */
  private released = false;

  constructor(
    private readonly sizes: ReceiveWindowSizes,
    private readonly budget: WindowGrowthBudget,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.sizeBytes = sizes.windowBytes;
    this.epochStartedAt = now();
  }

  get size(): number {
    return this.sizeBytes;
  }

  get received(): number {
    return this.receivedBytes;
  }

  /** The absolute offset up to which the peer may send: what was consumed at the last grant plus the window. */
  get limit(): number {
    return this.grantedBytes + this.sizeBytes;
  }

  /**
   * Counts `bytes` from the peer. Returns the bytes outstanding beyond the
   * last grant when the peer overran the window (a protocol fault), else 0.
   */
  receive(bytes: number): number {
    this.receivedBytes += bytes;
    const outstanding = this.receivedBytes - this.grantedBytes;
    return outstanding > this.sizeBytes ? outstanding : 0;
  }

  /**
   * The local reader has taken all received bytes but `queued`. Returns the
   * credit to grant the peer now, or 0. Credit is batched to a quarter window
   * at least, which cannot deadlock: a blocked sender means a whole window is
   * owed.
   */
  consumed(queued: number): number {
    const consumed = this.receivedBytes - queued;
    const grant = consumed - this.grantedBytes;
    if (grant < this.sizeBytes / 4) return 0;
    this.grantedBytes = consumed;
    return grant + this.grow(consumed, queued);
  }

  /**
   * A connection that consumed a whole window within GROW_WITHIN_MS while its
   * reader kept up (little queued) is held back by credit round trips, not by
   * its reader: its window doubles, up to maxWindowBytes and within the
   * tunnel's budget. Returns the extra credit. A stalled reader never grows it.
   */
  private grow(consumed: number, queued: number): number {
    if (consumed - this.epochConsumed < this.sizeBytes) return 0;
    const now = this.now();
    const bulk = now - this.epochStartedAt <= GROW_WITHIN_MS;
    this.epochConsumed = consumed;
    this.epochStartedAt = now;
    const max = this.sizes.maxWindowBytes;
    const readerKeepsUp = queued <= this.sizeBytes / 4;
    if (this.released || !bulk || !readerKeepsUp || this.sizeBytes >= max) return 0;
    const extra = Math.min(this.sizeBytes, max - this.sizeBytes);
    if (!this.budget.reserve(extra)) return 0;
    this.sizeBytes += extra;
    return extra;
  }

  /** Returns the growth to the budget (the connection closed); once. */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.budget.release(this.sizeBytes - this.sizes.windowBytes);
  }
}
