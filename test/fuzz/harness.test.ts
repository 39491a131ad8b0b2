/**
 * The fuzzer itself (test/fuzz/engine.ts) can fail a run: with deliberately
 * broken targets (fixtures/broken-targets.ts) it finds a bug that only
 * coverage guidance reaches in the time given, stops a hanging input, catches
 * a runaway allocation, and names the target and the input in hex.
 */
import test from 'ava';
import { describeFailure, runFuzz } from './engine.js';

const BROKEN = new URL('./fixtures/broken-targets.js', import.meta.url).href;

test('finds a failure behind four byte comparisons, guided by coverage, and reports target and input', async (t) => {
  const r = await runFuzz({ module: BROKEN, target: 'magic', corpusDirs: [], timeMs: 60_000, seed: 1 });
  if (r.failure === undefined) return t.fail(`not found in ${r.runs} runs`);
  t.is(r.failure.kind, 'property');
  t.is(Buffer.from(r.failure.input.subarray(0, 4)).toString('latin1'), 'FUZZ');
  const report = describeFailure('magic', r.failure);
  t.regex(report, /^fuzz target magic: property: RangeError: deliberate/);
  t.regex(report, /input \(\d+ bytes, hex\): 46555a5a/);
  t.log(`found after ${r.runs} runs, ${r.elapsedMs} ms`);
});

test('stops an input that hangs and reports it', async (t) => {
  // hangMs: well above what one honest input takes on a loaded machine (an empty input once took over 1 s there).
  const r = await runFuzz({ module: BROKEN, target: 'hang', corpusDirs: [], timeMs: 60_000, hangMs: 5000, seed: 2 });
  t.is(r.failure?.kind, 'hang');
  t.is(r.failure?.input[0], 0x42);
});

test('reports an input that makes the parser allocate far beyond its size', async (t) => {
  const r = await runFuzz({ module: BROKEN, target: 'allocation', corpusDirs: [], timeMs: 60_000, seed: 3 });
  t.is(r.failure?.kind, 'allocation');
  t.is(r.failure?.input[0], 0x07);
});

test('a target that keeps its properties passes its run', async (t) => {
  const r = await runFuzz({ module: BROKEN, target: 'clean', corpusDirs: [], timeMs: 300, seed: 4 });
  t.is(r.failure, undefined);
  t.true(r.runs > 0);
});
