/**
 * The bytes a sender keeps for a resend (src/tunnel/resend-buffer.ts) and
 * the slabs they live in (src/tunnel/slab-pool.ts): byte-exact across slab
 * boundaries, partial and whole acknowledgements, release, the pool's
 * bounds, and a count it does not hold refused.
 */
import test from 'ava';
import type { PacedScavenges } from '../../src/tunnel/gc-pacer.js';
import { ResendBuffer } from '../../src/tunnel/resend-buffer.js';
import { SlabPool } from '../../src/tunnel/slab-pool.js';

/** Without paced GCs: every piece is copied as it comes. */
const UNPACED: PacedScavenges = { active: false, beforeNext: () => undefined, cancel: () => undefined };

/** Paced GCs the test runs by hand: scavenge() calls what registered, once. */
function manualScavenges(): PacedScavenges & { scavenge(): void; waiting: number } {
  const due = new Set<() => void>();
  return {
    active: true,
    beforeNext: (fn) => void due.add(fn),
    cancel: (fn) => void due.delete(fn),
    scavenge() {
      const fns = [...due];
      due.clear();
      for (const fn of fns) fn();
    },
    get waiting() {
      return due.size;
    },
  };
}

/** A pool of tiny slabs, so that every test crosses boundaries; no timer fires during a test (trimUnused is called by hand). */
function tinyPool(slabBytes = 8, maxFreeSlabs = 64): SlabPool {
  return new SlabPool({ slabBytes, maxFreeSlabs, trimEveryMs: 3_600_000 });
}

/** Bytes 0, 1, 2, ... from `start` (mod 251, so that a shift by a slab shows). */
function bytesFrom(start: number, n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (start + i) % 251;
  return b;
}

/** Deterministic PRNG (mulberry32): the same sequence every run. */
function prng(seed: number): (n: number) => number {
  let a = seed >>> 0;
  return (n) => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return Math.floor((((x ^ (x >>> 14)) >>> 0) / 4294967296) * n);
  };
}

test('pieces across slab boundaries come back byte-exact, oldest first, and a partial drop lands mid-slab', (t) => {
  const pool = tinyPool();
  const buf = new ResendBuffer(pool, UNPACED);
  buf.append(bytesFrom(0, 5));
  buf.append(bytesFrom(5, 5)); // crosses into a second slab
  buf.append(bytesFrom(10, 17)); // fills it and two more, and starts a fourth
  t.is(buf.length, 27);
  t.is(buf.slabCount, 4);
  t.is(pool.inUse, 4);
  t.deepEqual(buf.copy(), bytesFrom(0, 27));
  buf.drop(3);
  t.deepEqual(buf.copy(), bytesFrom(3, 24));
  t.is(buf.slabCount, 4, 'the first slab still holds bytes');
  buf.drop(5); // exactly to the end of the first slab
  t.is(buf.slabCount, 3);
  t.is(pool.inUse, 3);
  t.is(pool.idle, 1, 'the slab went back to the pool');
  t.deepEqual(buf.copy(), bytesFrom(8, 19));
  buf.drop(9);
  t.deepEqual(buf.copy(), bytesFrom(17, 10));
  t.is(buf.slabCount, 2);
});

test('an acknowledgement of everything gives every slab back; what comes next starts afresh in a reused slab', (t) => {
  const pool = tinyPool();
  const buf = new ResendBuffer(pool, UNPACED);
  buf.append(bytesFrom(0, 20));
  buf.drop(20);
  t.is(buf.length, 0);
  t.is(buf.slabCount, 0, 'an idle buffer holds no slab');
  t.is(pool.inUse, 0);
  t.is(pool.idle, 3);
  buf.append(bytesFrom(100, 3));
  t.is(pool.idle, 2, 'a free slab was taken, none allocated');
  t.deepEqual(buf.copy(), bytesFrom(100, 3));
  t.is(buf.copy().length, 3);
  buf.drop(0);
  t.is(buf.length, 3, 'dropping nothing keeps everything');
});

test('a count it does not hold is refused and changes nothing', (t) => {
  const pool = tinyPool();
  const buf = new ResendBuffer(pool, UNPACED);
  buf.append(bytesFrom(0, 10));
  for (const n of [-1, 11, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) t.throws(() => buf.drop(n), { instanceOf: RangeError }, String(n));
  t.is(buf.length, 10);
  t.deepEqual(buf.copy(), bytesFrom(0, 10));
  t.throws(() => buf.copyTo(Buffer.alloc(9)), { instanceOf: RangeError });
  t.throws(() => buf.copyTo(Buffer.alloc(10), 1), { instanceOf: RangeError });
  t.is(buf.copyTo(Buffer.alloc(12), 2), 10);
  t.is(pool.inUse, 2);
});

test('the kept bytes are a copy: the piece handed in may be overwritten at once', (t) => {
  const buf = new ResendBuffer(tinyPool(), UNPACED);
  const piece = bytesFrom(0, 12);
  buf.append(piece);
  piece.fill(0xee);
  t.deepEqual(buf.copy(), bytesFrom(0, 12));
  const out = buf.copy();
  buf.release();
  t.deepEqual(out, bytesFrom(0, 12), 'a copy taken before the release stays intact');
});

test('release gives back every slab, whatever was dropped before; a released buffer is empty and usable', (t) => {
  const pool = tinyPool();
  const buf = new ResendBuffer(pool, UNPACED);
  buf.append(bytesFrom(0, 30));
  buf.drop(11);
  buf.release();
  t.is(buf.length, 0);
  t.is(buf.slabCount, 0);
  t.is(pool.inUse, 0);
  buf.release();
  t.is(pool.inUse, 0, 'twice is harmless');
  buf.append(bytesFrom(7, 9));
  t.deepEqual(buf.copy(), bytesFrom(7, 9));
});

for (const paced of [false, true])
  test(`random appends, drops and scavenges against a model (${paced ? 'paced' : 'unpaced'}): byte-exact, at most ceil(length / slab) + 1 slabs, the pool counts what is held`, (t) => {
    const slab = 16;
    const pool = tinyPool(slab, 8);
    const random = prng(42);
    const gcs = manualScavenges();
    const scavenges = paced ? gcs : UNPACED;
    const buffers = [new ResendBuffer(pool, scavenges), new ResendBuffer(pool, scavenges)];
    const model = [0, 0].map(() => ({ from: 0, to: 0 }));
    for (let step = 0; step < 5000; step++) {
      const i = random(2);
      const buf = buffers[i];
      const m = model[i];
      const op = random(11);
      if (op === 10) {
        gcs.scavenge();
        for (const b of buffers)
          if (b.slabCount < Math.ceil(b.length / slab)) t.fail(`step ${step}: bytes left out of the slabs by a scavenge`);
      } else if (op < 5) {
        const n = random(3 * slab + 2);
        buf.append(bytesFrom(m.to, n));
        m.to += n;
      } else if (op < 9) {
        const n = random(m.to - m.from + 1);
        buf.drop(n);
        m.from += n;
      } else {
        buf.release();
        m.from = m.to;
      }
      t.is(buf.length, m.to - m.from);
      if (buf.slabCount > Math.ceil(buf.length / slab) + 1) t.fail(`step ${step}: ${buf.slabCount} slabs for ${buf.length} bytes`);
      if (buf.length === 0 && buf.slabCount !== 0) t.fail(`step ${step}: empty but holds ${buf.slabCount} slabs`);
      if (pool.inUse !== buffers[0].slabCount + buffers[1].slabCount) t.fail(`step ${step}: pool counts ${pool.inUse} in use`);
      if (step % 97 === 0 && !buf.copy().equals(bytesFrom(m.from, m.to - m.from))) t.fail(`step ${step}: bytes differ`);
    }
    for (const [i, buf] of buffers.entries()) t.deepEqual(buf.copy(), bytesFrom(model[i].from, model[i].to - model[i].from));
    t.true(pool.idle <= 8, 'the free list stays within its bound');
  });

test('the pool keeps at most maxFreeSlabs free; trimming drops those no take() needed since the last trim', (t) => {
  const pool = tinyPool(8, 4);
  const slabs = Array.from({ length: 6 }, () => pool.take());
  t.is(pool.inUse, 6);
  for (const s of slabs) pool.give(s);
  t.is(pool.inUse, 0);
  t.is(pool.idle, 4, 'two beyond the bound were left to the GC');
  pool.trimUnused();
  t.is(pool.idle, 3, 'only the slab free since the interval began (the first given back) was unused all along');
  // An interval in which the sends needed two of the three: one was unused the whole time.
  const a = pool.take();
  const b = pool.take();
  pool.give(a);
  pool.give(b);
  pool.trimUnused();
  t.is(pool.idle, 2);
  pool.trimUnused();
  t.is(pool.idle, 0, 'an interval without sends drops the rest');
  t.is(pool.take().length, 8, 'an empty pool allocates');
  pool.drain();
});

test('paced: a piece is kept as it is until the next scavenge, then copied into slabs and let go; only what is unacknowledged then is copied', (t) => {
  const pool = tinyPool();
  const gcs = manualScavenges();
  const buf = new ResendBuffer(pool, gcs);
  const first = bytesFrom(0, 20);
  buf.append(first);
  buf.append(bytesFrom(20, 5));
  t.is(buf.length, 25);
  t.is(buf.slabCount, 0, 'nothing copied before the scavenge');
  t.is(gcs.waiting, 1, 'one registration per buffer');
  buf.drop(13); // acknowledged before the scavenge: never copied
  t.deepEqual(buf.copy(), bytesFrom(13, 12));
  gcs.scavenge();
  t.is(buf.slabCount, 2, '12 bytes in 8-byte slabs');
  first.fill(0); // the read buffer may go now: the bytes are copies
  t.deepEqual(buf.copy(), bytesFrom(13, 12));
  buf.append(bytesFrom(25, 6)); // newer than the slabs' bytes
  t.is(gcs.waiting, 1, 'registered again for the next scavenge');
  t.deepEqual(buf.copy(), bytesFrom(13, 18), 'slabs first, then the young pieces');
  buf.drop(14); // across the slabs into the young piece
  t.deepEqual(buf.copy(), bytesFrom(27, 4));
  t.is(buf.slabCount, 0);
  t.is(pool.inUse, 0);
  gcs.scavenge();
  t.deepEqual(buf.copy(), bytesFrom(27, 4));
  buf.drop(4);
  t.is(pool.inUse, 0, 'all acknowledged: nothing held');
  buf.append(bytesFrom(0, 3));
  t.is(gcs.waiting, 1);
  buf.release();
  t.is(gcs.waiting, 0, 'a released buffer waits for no scavenge: a closed connection does not linger in the pacer');
  buf.append(bytesFrom(3, 2));
  buf.drop(2);
  t.is(gcs.waiting, 0, 'nor does one acknowledged in full');
  gcs.scavenge();
  t.is(buf.length, 0);
  t.is(pool.inUse, 0);
});
