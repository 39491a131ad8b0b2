/** The memory reclaimer's rule: trim on every check, a major GC only RECLAIM_GROWTH_BYTES above the floor (src/common/memory-reclaimer.ts). */
import test from 'ava';
import { MemoryReclaimer, RECLAIM_GROWTH_BYTES, type Reclaim } from '../../src/common/memory-reclaimer.js';

const MiB = 1024 * 1024;

/** A reclaimer over a fake RSS: `gc` and `trim` take what the test says they free. */
function fake(start: number, frees: { gc: number; trim: number }) {
  const calls: string[] = [];
  const reclaims: Reclaim[] = [];
  let rss = start;
  const reclaimer = new MemoryReclaimer({
    checkMs: 3_600_000,
    rss: () => rss,
    gc: (o) => {
      calls.push(`gc ${o.type}`);
      rss -= frees.gc;
    },
    trim: () => {
      calls.push('trim');
      rss -= frees.trim;
    },
    onReclaim: (r) => reclaims.push(r),
  });
  return { reclaimer, calls, reclaims, grow: (bytes: number) => (rss += bytes), rss: () => rss };
}

test('each check trims; a major GC runs only once RSS stands the growth bound above its floor', (t) => {
  const f = fake(100 * MiB, { gc: 4 * MiB, trim: 1 * MiB });
  f.reclaimer.start();
  f.grow(RECLAIM_GROWTH_BYTES - 2 * MiB);
  const small = f.reclaimer.check();
  t.deepEqual(f.calls, ['trim']);
  t.like(small, { collected: false, before: 106 * MiB, after: 105 * MiB });
  // The floor is still 100 MiB: 8 more MiB above it means a collection.
  f.grow(3 * MiB);
  const big = f.reclaimer.check();
  t.deepEqual(f.calls, ['trim', 'gc major', 'trim']);
  t.like(big, { collected: true, before: 108 * MiB, after: 103 * MiB });
  // The floor is now what the collection left (103 MiB): 7 MiB above it is not enough.
  f.grow(7 * MiB);
  t.like(f.reclaimer.check(), { collected: false });
  t.is(f.calls.filter((c) => c.startsWith('gc')).length, 1);
  t.is(f.reclaims.length, 3);
  f.reclaimer.stop();
});

test('a check that gives nothing back and collects nothing reports nothing', (t) => {
  const f = fake(100 * MiB, { gc: 0, trim: 0 });
  f.reclaimer.start();
  t.is(f.reclaimer.check(), undefined);
  t.deepEqual(f.reclaims, []);
  f.reclaimer.stop();
});

test('the floor follows RSS down, so growth is measured from the lowest point', (t) => {
  const f = fake(120 * MiB, { gc: 0, trim: 0 });
  f.reclaimer.start();
  f.grow(-20 * MiB);
  f.reclaimer.check();
  f.grow(RECLAIM_GROWTH_BYTES);
  t.like(f.reclaimer.check(), { collected: true });
  f.reclaimer.stop();
});

test('stopped, or without gc and malloc_trim, it does nothing', (t) => {
  const f = fake(100 * MiB, { gc: 1 * MiB, trim: 1 * MiB });
  t.is(f.reclaimer.check(), undefined, 'not started');
  f.reclaimer.start();
  f.reclaimer.stop();
  t.is(f.reclaimer.check(), undefined, 'stopped');
  t.deepEqual(f.calls, []);
  const none = new MemoryReclaimer({ gc: null, trim: null, rss: () => 0 });
  t.false(none.available);
  none.start();
  t.is(none.check(), undefined);
});

test('without gc (KANAL_GC_PACING=0) it still trims', (t) => {
  let rss = 200 * MiB;
  const r = new MemoryReclaimer({ checkMs: 3_600_000, gc: null, trim: () => (rss -= MiB), rss: () => rss });
  r.start();
  rss += 50 * MiB;
  t.like(r.check(), { collected: false, before: 250 * MiB, after: 249 * MiB });
  r.stop();
});
