/**
 * The receive window as bookkeeping alone (src/tunnel/receive-window.ts):
 * credit spent and returned, growth only for bulk traffic whose reader keeps
 * up, within the per-connection cap and the tunnel's budget.
 */
import test from 'ava';
import { GROW_WITHIN_MS, ReceiveWindow, WindowGrowthBudget } from '../../src/tunnel/receive-window.js';

const KiB = 1024;
const sizes = { windowBytes: 64 * KiB, maxWindowBytes: 256 * KiB };

/** A clock the test moves by hand. */
function manualClock(): { now: () => number; advance(ms: number): void } {
  let t = 1000;
  return { now: () => t, advance: (ms) => void (t += ms) };
}

test('credit: nothing is granted until a quarter window was consumed, then exactly what was consumed', (t) => {
  const clock = manualClock();
  const w = new ReceiveWindow(sizes, new WindowGrowthBudget(0), clock.now);
  t.is(w.receive(32 * KiB), 0);
  t.is(w.consumed(32 * KiB), 0, 'nothing consumed yet');
  t.is(w.consumed(16 * KiB + 1), 0, 'just under a quarter window consumed');
  t.is(w.consumed(16 * KiB), 16 * KiB, 'a quarter window consumed: granted');
  t.is(w.consumed(16 * KiB), 0, 'the same bytes are not granted twice');
  t.is(w.consumed(0), 16 * KiB, 'the rest');
  t.is(w.consumed(0), 0, 'never more than was received');
});

test('the window is spent by what the peer sends beyond the last grant; one byte more is an overrun', (t) => {
  const w = new ReceiveWindow(sizes, new WindowGrowthBudget(0), manualClock().now);
  t.is(w.receive(64 * KiB), 0, 'a whole window is allowed');
  t.is(w.receive(1), 64 * KiB + 1, 'one byte beyond it is reported');
  const fresh = new ReceiveWindow(sizes, new WindowGrowthBudget(0), manualClock().now);
  fresh.receive(64 * KiB);
  t.is(fresh.consumed(0), 64 * KiB);
  t.is(fresh.receive(64 * KiB), 0, 'after the grant another window is allowed');
  t.true(fresh.receive(1) > 0);
});

test('growth: a window consumed within the time bound while the reader keeps up doubles, up to the cap and never past it', (t) => {
  const clock = manualClock();
  const budget = new WindowGrowthBudget(1024 * KiB);
  const w = new ReceiveWindow(sizes, budget, clock.now);
  const sizesSeen: number[] = [];
  for (let i = 0; i < 8; i++) {
    const size = w.size;
    w.receive(size);
    clock.advance(GROW_WITHIN_MS / 2);
    const credit = w.consumed(0);
    t.true(credit >= size, 'at least what was consumed');
    t.is(credit - size, w.size - size, 'the extra credit is the growth');
    sizesSeen.push(w.size / KiB);
  }
  t.deepEqual(sizesSeen, [128, 256, 256, 256, 256, 256, 256, 256]);
  t.is(budget.held, 256 * KiB - 64 * KiB, 'the growth is held in the budget');
  w.release();
  t.is(budget.held, 0, 'and returned on release');
  w.release();
  t.is(budget.held, 0, 'once');
});

test('no growth when the window took longer than the bound, or the reader falls behind', (t) => {
  const clock = manualClock();
  const budget = new WindowGrowthBudget(1024 * KiB);
  const slow = new ReceiveWindow(sizes, budget, clock.now);
  slow.receive(64 * KiB);
  clock.advance(GROW_WITHIN_MS + 1);
  t.is(slow.consumed(0), 64 * KiB, 'credit, no growth');
  t.is(slow.size, 64 * KiB);

  const behind = new ReceiveWindow(sizes, budget, clock.now);
  behind.receive(64 * KiB);
  t.is(behind.consumed(40 * KiB), 24 * KiB, 'some consumed, 40 KiB queued');
  behind.receive(24 * KiB);
  clock.advance(1);
  // A whole window consumed in time, but the reader still holds over a quarter window.
  t.is(behind.consumed(20 * KiB), 44 * KiB, 'credit, no growth');
  t.is(behind.size, 64 * KiB, 'a reader that falls behind never grows its window');
  t.is(budget.held, 0);
});

test("growth stops when the tunnel's budget is spent, and resumes once another connection returns its share", (t) => {
  const clock = manualClock();
  const budget = new WindowGrowthBudget(64 * KiB);
  const bulk = (w: ReceiveWindow): void => {
    w.receive(w.size);
    clock.advance(1);
    w.consumed(0);
  };
  const a = new ReceiveWindow(sizes, budget, clock.now);
  const b = new ReceiveWindow(sizes, budget, clock.now);
  bulk(a);
  t.is(a.size, 128 * KiB, 'the first grows by the whole budget');
  bulk(b);
  t.is(b.size, 64 * KiB, 'the budget refuses the second');
  bulk(a);
  t.is(a.size, 128 * KiB, 'and any further growth of the first');
  t.is(budget.held, 64 * KiB, 'never above the limit');
  a.release();
  bulk(b);
  t.is(b.size, 128 * KiB, 'returned growth is available again');
});

test('budget: reserve refuses past the limit without taking anything; release never goes below zero', (t) => {
  const budget = new WindowGrowthBudget(100);
  t.true(budget.reserve(60));
  t.false(budget.reserve(41));
  t.is(budget.held, 60);
  t.true(budget.reserve(40));
  budget.release(30);
  t.is(budget.held, 70);
  budget.release(1000);
  t.is(budget.held, 0, 'never negative');
});

test('a fixed window (maxWindowBytes = windowBytes) never grows and takes nothing from the budget', (t) => {
  const clock = manualClock();
  const budget = new WindowGrowthBudget(1024 * KiB);
  const w = new ReceiveWindow({ windowBytes: 64 * KiB, maxWindowBytes: 64 * KiB }, budget, clock.now);
  for (let i = 0; i < 4; i++) {
    w.receive(64 * KiB);
    clock.advance(1);
    t.is(w.consumed(0), 64 * KiB);
  }
  t.is(w.size, 64 * KiB);
  t.is(budget.held, 0);
});
