/**
 * One connection's bytes sent and not yet acknowledged (resume), oldest
 * first. A piece sent is kept as it is only until the next paced minor GC
 * (gc-pacer.ts): what is still unacknowledged then is copied into slabs of
 * the process's pool (slab-pool.ts) and the piece let go, so no read buffer
 * survives a scavenge because of resume, and only the bytes still in flight
 * at a scavenge are copied (docs/memory.md, "While a tunnel waits to
 * resume"). Without paced GCs every piece is copied as it is sent. A buffer
 * with nothing left holds no slab (an idle connection costs nothing here).
 * What it may hold is the send queue's decision (connection-send-queue.ts);
 * this only keeps the bytes.
 */
import type { PacedScavenges } from './gc-pacer.js';
import type { SlabPool } from './slab-pool.js';

export class ResendBuffer {
  /**
   * The older bytes: slabs, oldest first, from index `first` on (those before
   * it went back to the pool and are never read). Invariants, with
   * S = pool.slabBytes: slabBytes === 0 exactly when no slab is held
   * (slabs.length === first === 0, head === tail === 0); otherwise
   * 0 <= head < S, 0 < tail <= S, and
   * slabBytes === (slabs.length - first) * S - head - (S - tail).
   */
  private readonly slabs: Buffer[] = [];
  private first = 0;
  /** Offset of the oldest byte in slabs[first]. */
  private head = 0;
  /** Bytes filled in the newest slab. */
  private tail = 0;
  private slabBytes = 0;
  /**
   * The newer bytes: pieces as they were sent, oldest first, all after the
   * slabs' bytes; `youngHead` bytes of the first are acknowledged.
   * youngBytes === their lengths' sum - youngHead; empty unless scavenges
   * are paced, and then registered for the next one while not empty.
   */
  private readonly young: Buffer[] = [];
  private youngHead = 0;
  private youngBytes = 0;

  constructor(
    private readonly pool: SlabPool,
    private readonly scavenges: PacedScavenges,
  ) {}

  /** Bytes held. */
  get length(): number {
    return this.slabBytes + this.youngBytes;
  }

  /** Slabs held (for tests and bounds: at most ceil(length / S) + 1). */
  get slabCount(): number {
    return this.slabs.length - this.first;
  }

  /** Keeps `piece` after what is held: as it is until the next paced scavenge, else copied now. */
  append(piece: Buffer): void {
    if (!this.scavenges.active) {
      this.copyIn(piece, 0);
      return;
    }
    if (this.young.length === 0) this.scavenges.beforeNext(this.settle);
    this.young.push(piece);
    this.youngBytes += piece.length;
  }

  /** Copies the pieces still held into slabs and lets them go (just before a paced scavenge). */
  readonly settle = (): void => {
    for (let i = 0; i < this.young.length; i++) this.copyIn(this.young[i], i === 0 ? this.youngHead : 0);
    this.young.length = 0;
    this.youngHead = 0;
    this.youngBytes = 0;
  };

  /** Forgets the oldest `n` bytes (acknowledged). Throws on a count it does not hold: the caller checks the peer's numbers. */
  drop(n: number): void {
    if (!Number.isSafeInteger(n) || n < 0 || n > this.length) throw new RangeError(`cannot drop ${n} of ${this.length} retained bytes`);
    if (n === this.length) {
      this.release();
      return;
    }
    let left = n;
    if (this.slabBytes > 0) {
      const k = Math.min(left, this.slabBytes);
      this.dropSlabBytes(k);
      left -= k;
    }
    while (left > 0) {
      const rest = this.young[0].length - this.youngHead;
      if (rest <= left) {
        this.young.shift();
        this.youngHead = 0;
        this.youngBytes -= rest;
        left -= rest;
      } else {
        this.youngHead += left;
        this.youngBytes -= left;
        left = 0;
      }
    }
  }

  /** Copies what is held, oldest first, into `target` from `at`; returns the bytes copied. Keeps them. */
  copyTo(target: Uint8Array, at = 0): number {
    if (target.length - at < this.length) throw new RangeError(`${this.length} retained bytes do not fit in ${target.length - at}`);
    const size = this.pool.slabBytes;
    const last = this.slabs.length - 1;
    let p = at;
    for (let i = this.first; i <= last; i++) {
      const start = i === this.first ? this.head : 0;
      const end = i === last ? this.tail : size;
      p += this.slabs[i].copy(target, p, start, end);
    }
    for (let i = 0; i < this.young.length; i++) p += this.young[i].copy(target, p, i === 0 ? this.youngHead : 0);
    return p - at;
  }

  /** A new Buffer with a copy of what is held (a resend: rare, and the slabs may be given back while the copy is still being written). */
  copy(): Buffer {
    const out = Buffer.allocUnsafe(this.length);
    this.copyTo(out);
    return out;
  }

  /** Gives every slab back and lets every piece go: nothing is held. */
  release(): void {
    this.dropSlabBytes(this.slabBytes);
    // Registered while it held pieces: an empty buffer must not wait in the pacer's set (a closed connection would linger there).
    if (this.young.length > 0) this.scavenges.cancel(this.settle);
    this.young.length = 0;
    this.youngHead = 0;
    this.youngBytes = 0;
  }

  /** Copies piece[from..] into the slabs, after what they hold. */
  private copyIn(piece: Buffer, from: number): void {
    const n = piece.length;
    const size = this.pool.slabBytes;
    this.slabBytes += n - from;
    while (from < n) {
      if (this.tail === size || this.slabs.length === this.first) {
        this.slabs.push(this.pool.take());
        this.tail = 0;
      }
      const k = Math.min(size - this.tail, n - from);
      piece.copy(this.slabs[this.slabs.length - 1], this.tail, from, from + k);
      this.tail += k;
      from += k;
    }
  }

  /** Drops the oldest `n` of the slabs' bytes, n < slabBytes or all of them. */
  private dropSlabBytes(n: number): void {
    if (n === this.slabBytes) {
      for (let i = this.first; i < this.slabs.length; i++) this.pool.give(this.slabs[i]);
      this.slabs.length = 0;
      this.first = 0;
      this.head = 0;
      this.tail = 0;
      this.slabBytes = 0;
      return;
    }
    const size = this.pool.slabBytes;
    this.slabBytes -= n;
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
}
