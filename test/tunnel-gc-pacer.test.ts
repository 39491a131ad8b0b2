/**
 * GC pacing: bytes moved through tunnelled connections schedule minor GCs,
 * so the per-read ArrayBuffers are freed by scavenges instead of piling up
 * into external-memory-pressure mark-compacts. The process's own global
 * must not gain `gc`.
 */
import test from 'ava';
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { GC_PACE_BYTES, noteBytesMoved } from '../src/tunnel/gc-pacer.js';

test('a minor GC follows every GC_PACE_BYTES moved, without exposing gc globally', async (t) => {
  let minor = 0;
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const detail = (e as unknown as { detail?: { kind?: number } }).detail;
      if (detail?.kind === constants.NODE_PERFORMANCE_GC_MINOR) minor++;
    }
  });
  obs.observe({ entryTypes: ['gc'] });
  try {
    for (let round = 0; round < 3; round++) {
      for (let moved = 0; moved < GC_PACE_BYTES; moved += 64 * 1024) noteBytesMoved(64 * 1024);
      await nextTurn();
      await nextTurn();
    }
    // GC entries are delivered asynchronously.
    for (let i = 0; i < 50 && minor < 3; i++) await new Promise((r) => setTimeout(r, 10));
    t.true(minor >= 3, `expected at least 3 minor GCs, saw ${minor}`);
    t.is((globalThis as { gc?: unknown }).gc, undefined);
  } finally {
    obs.disconnect();
  }
});
