/**
 * The short fuzzing run of `npm test` (docs/fuzzing.md): every target replays
 * its committed corpus, then fuzzes for a few seconds with coverage guidance.
 * A failure names the target and the input in hex; the long run is
 * `npm run fuzz`. KANAL_FUZZ_SECONDS sets the seconds per target (default 3).
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { describeFailure, runFuzz, type FuzzTarget } from './engine.js';
import { CORPUS, ROOT, TARGETS_MODULE } from './paths.js';

const SECONDS = Number(process.env.KANAL_FUZZ_SECONDS ?? 3);
const { targets } = (await import(TARGETS_MODULE)) as { targets: readonly FuzzTarget[] };

// A covered path that names no compiled file would leave a target without coverage guidance, silently.
test('every file a target covers exists in the build', (t) => {
  for (const target of targets) {
    for (const file of target.covers)
      t.true(fs.existsSync(path.join(ROOT, 'dist', file)), `${target.name} covers ${file}, which the build does not have`);
  }
});

for (const target of targets) {
  // Serial: each target has a worker thread of its own, and the machine has two cores.
  test.serial(`fuzz ${target.name}`, async (t) => {
    const seed = (Math.random() * 2 ** 32) >>> 0;
    const r = await runFuzz({
      module: TARGETS_MODULE,
      target: target.name,
      corpusDirs: [path.join(CORPUS, target.name)],
      timeMs: SECONDS * 1000,
      seed,
      hangMs: 10_000,
    });
    t.log(
      `${r.runs} runs in ${r.elapsedMs} ms from ${r.seeds} seeds (seed ${seed}); corpus ${r.corpusSize}, ${r.features} coverage features`,
    );
    if (r.failure)
      return t.fail(`${describeFailure(target.name, r.failure)}\nrepeat with: npm run fuzz -- --target ${target.name} --seed ${seed}`);
    t.true(r.seeds > 0, `no seed corpus in ${path.join(CORPUS, target.name)}`);
  });
}
