/**
 * One connection's bytes sent and not yet acknowledged (resume), oldest
 * first, copied into slabs of the process's pool (slab-pool.ts): each sent
 * piece is copied once, no object per piece is kept, and a buffer with
 * nothing left holds no slab (an idle connection costs nothing here).
 * What it may hold is the send queue's decision (connection-send-queue.ts);
 * this only keeps the bytes.
 */
import type { SlabPool } from './slab-pool.js';

export class ResendBuffer {
  /**
   * The slabs, oldest first, from index `first` on (those before it went back
   * to the pool and are never read). Invariants, with S = pool.slabBytes:
   * bytes === 0 exactly when no slab is held (slabs.length === first === 0,
   * head === tail === 0); otherwise 0 <= head < S, 0 < tail <= S, and
   * bytes === (slabs.length - first) * S - head - (S - tail).
   */
  private readonly slabs: Buffer[] = [];
  private first = 0;
  /** Offset of the oldest byte in slabs[first]. */
  private head = 0;
  /** Bytes filled in the newest slab. */
  private tail = 0;
  private bytes = 0;

  constructor(private readonly pool: SlabPool) {}

  /** Bytes held. */
  get length(): number {
    return this.bytes;
  }

  /** Slabs held (for tests and bounds: at most ceil(length / S) + 1). */
  get slabCount(): number {
    return this.slabs.length - this.first;
  }

  /** Keeps a copy of `piece` after what is held; `piece` itself is not kept. */
  append(piece: Buffer): void {
    const n = piece.length;
    const size = this.pool.slabBytes;
    let from = 0;
    while (from < n) {
      if (this.tail === size || this.slabs.length === this.first) {
        this.slabs.push(this.pool.take());
        this.tail = 0;
      }
      const k = Math.min(size - this.tail, n - from);
      // One copy into the slab; a Buffer's copy() makes no view object, set(subarray()) would.
      piece.copy(this.slabs[this.slabs.length - 1], this.tail, from, from + k);
      this.tail += k;
      from += k;
    }
    this.bytes += n;
  }

  /** Forgets the oldest `n` bytes (acknowledged). Throws on a count it does not hold: the caller checks the peer's numbers. */
  drop(n: number): void {
    if (!Number.isSafeInteger(n) || n < 0 || n > this.bytes) throw new RangeError(`cannot drop ${n} of ${this.bytes} retained bytes`);
    if (n === this.bytes) {
      this.release();
      return;
    }
    const size = this.pool.slabBytes;
    this.bytes -= n;
    this.head += n;
    while (this.head >= size) {
      this.pool.give(this.slabs[this.first++]);
      this.head -= size;
    }
    // Amortised O(1): the given-back prefix is cut once it is half the array.
    if (this.first >= 16 && this.first * 2 >= this.slabs.length) {
      this.slabs.copyWithin(0, this.first);
      this.slabs.length -= this.first;
      this.first = 0;
    }
  }

  /** Copies what is held, oldest first, into `target` from `at`; returns the bytes copied. Keeps them. */
  copyTo(target: Uint8Array, at = 0): number {
    if (target.length - at < this.bytes) throw new RangeError(`${this.bytes} retained bytes do not fit in ${target.length - at}`);
    const size = this.pool.slabBytes;
    const last = this.slabs.length - 1;
    let p = at;
    for (let i = this.first; i <= last; i++) {
      const start = i === this.first ? this.head : 0;
      const end = i === last ? this.tail : size;
      p += this.slabs[i].copy(target, p, start, end);
    }
    return p - at;
  }

  /** A new Buffer with a copy of what is held (a resend: rare, and the slabs may be given back while the copy is still being written). */
  copy(): Buffer {
    const out = Buffer.allocUnsafe(this.bytes);
    this.copyTo(out);
    return out;
  }

  /** Gives every slab back: nothing is held. */
  release(): void {
    for (let i = this.first; i < this.slabs.length; i++) this.pool.give(this.slabs[i]);
    this.slabs.length = 0;
    this.first = 0;
    this.head = 0;
    this.tail = 0;
    this.bytes = 0;
  }
}
