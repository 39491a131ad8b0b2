/**
 * Fixed-size slabs of memory shared by every connection of the process, for
 * the bytes a sender keeps until the peer acknowledges them (resume,
 * resend-buffer.ts). A slab lives as long as the pool does, so keeping bytes
 * for a while promotes no object per chunk to V8's old generation, and the
 * socket's read buffers die young in a scavenge (docs/memory.md, "While a tunnel waits to resume").
 *
 * Bounds: slabs in use are bounded by what connections may retain (their
 * retainLimit and the ledger's caps, docs/limits.md "Retained bytes"); free
 * slabs are kept up to `maxFreeSlabs`, and those not needed for a whole
 * `trimEveryMs` are dropped for the GC, so a process at rest holds none.
 */

/** Bytes per slab: small, so that a connection with a short tail unacknowledged holds little more than that tail. */
export const SLAB_BYTES = 4 * 1024;
/** Free slabs the process keeps at most (16 MiB): what an acknowledgement frees is taken again by the next sends. */
export const MAX_FREE_SLABS = 4096;
/** Free slabs unused for this long are dropped. */
export const TRIM_EVERY_MS = 1000;

export interface SlabPoolOptions {
  slabBytes: number;
  maxFreeSlabs: number;
  trimEveryMs: number;
}

export class SlabPool {
  readonly slabBytes: number;
  private readonly maxFreeSlabs: number;
  private readonly trimEveryMs: number;
  /**
   * Slabs given back, most recently returned last; taken from the end, so the
   * front ones are those unused longest. 0 <= free.length <= maxFreeSlabs;
   * every one of them was allocated here and is in no resend buffer.
   */
  private readonly free: Buffer[] = [];
  /** Slabs taken and not given back: what connections hold. */
  private taken = 0;
  /** The fewest free slabs since the last trim: that many were not needed for the whole interval. */
  private lowWater = 0;
  /** Armed while free slabs exist. */
  private trimTimer: NodeJS.Timeout | undefined;

  constructor(opts: SlabPoolOptions) {
    this.slabBytes = opts.slabBytes;
    this.maxFreeSlabs = opts.maxFreeSlabs;
    this.trimEveryMs = opts.trimEveryMs;
  }

  /** Slabs held by connections now. */
  get inUse(): number {
    return this.taken;
  }

  /** Free slabs kept for the next sends. */
  get idle(): number {
    return this.free.length;
  }

  /** Memory of the slabs in use and free. */
  get bytes(): number {
    return (this.taken + this.free.length) * this.slabBytes;
  }

  /** A slab to fill (its contents are whatever it held before). */
  take(): Buffer {
    this.taken++;
    const slab = this.free.pop();
    if (slab === undefined) return Buffer.allocUnsafeSlow(this.slabBytes);
    if (this.free.length < this.lowWater) this.lowWater = this.free.length;
    return slab;
  }

  /** Gives back a slab from take(); the caller keeps no reference to it. */
  give(slab: Buffer): void {
    this.taken--;
    if (this.free.length >= this.maxFreeSlabs) return;
    this.free.push(slab);
    if (this.trimTimer === undefined) {
      this.lowWater = this.free.length;
      this.trimTimer = setTimeout(this.trimUnused, this.trimEveryMs);
      this.trimTimer.unref();
    }
  }

  /** Drops every free slab now (tests; a process that wants its memory back). */
  drain(): void {
    clearTimeout(this.trimTimer);
    this.trimTimer = undefined;
    this.free.length = 0;
    this.lowWater = 0;
  }

  /** Drops the free slabs no take() needed since the last call (the timer calls it every trimEveryMs). */
  readonly trimUnused = (): void => {
    clearTimeout(this.trimTimer);
    this.trimTimer = undefined;
    const unused = Math.min(this.lowWater, this.free.length);
    if (unused > 0) this.free.splice(0, unused);
    this.lowWater = this.free.length;
    if (this.free.length > 0) {
      this.trimTimer = setTimeout(this.trimUnused, this.trimEveryMs);
      this.trimTimer.unref();
    }
  };
}

/** The process's pool: every connection's resend buffer takes its slabs here. */
export const sentBytesSlabs = new SlabPool({ slabBytes: SLAB_BYTES, maxFreeSlabs: MAX_FREE_SLABS, trimEveryMs: TRIM_EVERY_MS });
