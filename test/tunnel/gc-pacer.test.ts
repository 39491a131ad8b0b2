/**
 * GC pacing: bytes moved through tunnelled connections schedule minor GCs,
 * so the per-read ArrayBuffers are freed by scavenges instead of piling up
 * into external-memory-pressure mark-compacts. The process's own global
 * must not gain `gc`.
 */
import test from 'ava';
import { execFile } from 'node:child_process';
import { PerformanceObserver, constants } from 'node:perf_hooks';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { enableGcPacing, GC_PACE_BYTES, HEAP_GROWING_PERCENT, noteBytesMoved, pacedScavenges } from '../../src/tunnel/gc-pacer.js';

const PACER_URL = new URL('../../src/tunnel/gc-pacer.js', import.meta.url).href;

/**
 * Runs a fresh node that (optionally) moves GC_PACE_BYTES through the pacer,
 * then forces a mark-compact, and returns the growing factor V8's own trace
 * reports for the old-generation limit it computed last.
 */
function factorAfter(env: NodeJS.ProcessEnv, opts: { enable: boolean; move: boolean }): Promise<string> {
  const script = [
    `import { enableGcPacing, GC_PACE_BYTES, noteBytesMoved } from ${JSON.stringify(PACER_URL)};`,
    opts.enable ? 'enableGcPacing();' : '',
    opts.move ? 'noteBytesMoved(GC_PACE_BYTES);' : '',
    'const garbage = []; for (let i = 0; i < 100000; i++) garbage.push({ i });',
    'globalThis.gc();',
  ].join('\n');
  const args = ['--expose-gc', '--trace-gc-verbose', '--input-type=module', '-e', script];
  return new Promise((resolve, reject) => {
    execFile(process.execPath, args, { env, timeout: 20_000, maxBuffer: 16 * 1024 * 1024 }, (err, stdout) => {
      if (err) {
        // ExecFileException is an Error, though its declared type (an Omit<>) no longer says so.
        const failure: Error = err;
        return reject(failure);
      }
      // V8 11 (Node 20) prints "[HeapController] Limit: ... (factor)"; V8 13 and later (Node 24, 26) "[HeapController] factor F based on ...".
      const found = [...stdout.matchAll(/\[HeapController\] (?:Limit: .*\((\d+\.\d)\)|factor (\d+\.\d) )/g)];
      const factors = found.map((m) => m[1] ?? m[2]).filter((f) => f !== undefined);
      if (factors.length === 0) return reject(new Error(`no old-generation limit in V8's trace:\n${stdout.slice(-2000)}`));
      resolve(factors[factors.length - 1]);
    });
  });
}

/** GC kinds that free young buffers: a scavenge, or a full mark-compact. */
const COLLECTIONS = new Set<number>([constants.NODE_PERFORMANCE_GC_MINOR, constants.NODE_PERFORMANCE_GC_MAJOR]);

test('a collection follows every GC_PACE_BYTES moved, after what asked to run before it, without exposing gc globally', async (t) => {
  let collected = 0;
  /** Runs before each paced collection it is registered for: once per round however often it registers. */
  let hooked = 0;
  const hook = (): void => void hooked++;
  /** Called on the next requested collection: the round waits for the event, not for a time. */
  let onCollected: (() => void) | undefined;
  const obs = new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      const detail = (e as unknown as { detail?: { kind?: number; flags?: number } }).detail;
      // Only collections someone asked for (gc(): FORCED), so V8's own do not stand in for the pacer's.
      if (((detail?.flags ?? 0) & constants.NODE_PERFORMANCE_GC_FLAGS_FORCED) === 0) continue;
      // While V8 is marking incrementally (a busy process: here the other test's children's output), it
      // answers the pacer's minor request with a mark-compact instead: that frees the buffers too.
      if (COLLECTIONS.has(detail?.kind ?? -1)) collected++;
    }
    onCollected?.();
  });
  obs.observe({ entryTypes: ['gc'] });
  try {
    t.false(pacedScavenges.active, 'nothing is paced before enableGcPacing');
    enableGcPacing();
    t.true(pacedScavenges.active);
    for (let round = 1; round <= 3; round++) {
      const before = collected;
      pacedScavenges.beforeNext(hook);
      pacedScavenges.beforeNext(hook);
      for (let moved = 0; moved < GC_PACE_BYTES; moved += 64 * 1024) noteBytesMoved(64 * 1024);
      await nextTurn();
      await nextTurn();
      // GC entries are delivered asynchronously, seconds late on a busy machine: each round's is
      // awaited before the next round asks again, so two requests never meet in one collection.
      // The wait ends with the entry; its bound (60 s) only keeps a broken pacer from hanging the file.
      if (collected === before) {
        let timer: NodeJS.Timeout | undefined;
        await new Promise<void>((resolve) => {
          onCollected = () => collected > before && resolve();
          timer = setTimeout(resolve, 60_000);
        });
        clearTimeout(timer);
        onCollected = undefined;
      }
      t.true(collected > before, `round ${round}: no collection within 60 s after GC_PACE_BYTES moved (${collected} so far)`);
      t.is(hooked, round, 'the hook ran once, before the collection it was registered for');
    }
    t.is((globalThis as { gc?: unknown }).gc, undefined);
  } finally {
    obs.disconnect();
  }
});

test("from enabling pacing on, moved data or not, the old generation grows by the pinned factor, not the one V8 picks (KANAL_GC_PACING=0, or never enabling it, keeps V8's)", async (t) => {
  const pinned = (1 + HEAP_GROWING_PERCENT / 100).toFixed(1);
  const on = { ...process.env, KANAL_GC_PACING: '' };
  t.is(await factorAfter(on, { enable: true, move: true }), pinned);
  // Churn of short connections moves little data: the factor must hold before the first GC_PACE_BYTES.
  t.is(await factorAfter(on, { enable: true, move: false }), pinned);
  // A fresh V8 with no GC history picks its maximum (4.0 on this machine's heap size).
  t.not(await factorAfter({ ...process.env, KANAL_GC_PACING: '0' }, { enable: true, move: true }), pinned);
  // A process that never enables pacing (a library user) keeps V8's own factor.
  t.not(await factorAfter(on, { enable: false, move: true }), pinned);
});
