/**
 * The long fuzzing run (docs/fuzzing.md):
 *
 *   npm run fuzz -- [--target NAME]... [--time SECONDS] [--seed N] [--save] [--list]
 *
 * Runs each target (all by default) for --time seconds (default 60) from its
 * committed corpus. --save writes inputs that found new coverage into the
 * target's corpus folder (review and prune before committing). A failure is
 * printed with its input in hex and written to the findings folder; the exit
 * status is 1 when any target failed.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeFailure, inputName, runFuzz, type FuzzTarget } from './engine.js';
import { CORPUS, TARGETS_MODULE } from './paths.js';

const USAGE = 'usage: npm run fuzz -- [--target NAME]... [--time SECONDS] [--seed N] [--save] [--list]';

function parseArgs(argv: string[]): { targets: string[]; timeS: number; seed: number | undefined; save: boolean; list: boolean } {
  const out = { targets: [] as string[], timeS: 60, seed: undefined as number | undefined, save: false, list: false };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    const value = (): string => {
      const v = argv[++i];
      if (v === undefined) throw new Error(`${a} needs a value\n${USAGE}`);
      return v;
    };
    if (a === '--target') out.targets.push(value());
    else if (a === '--time') out.timeS = Number(value());
    else if (a === '--seed') out.seed = Number(value());
    else if (a === '--save') out.save = true;
    else if (a === '--list') out.list = true;
    else throw new Error(`unknown argument ${a}\n${USAGE}`);
  }
  if (!(out.timeS > 0)) throw new Error(`--time must be a positive number of seconds\n${USAGE}`);
  if (out.seed !== undefined && !Number.isInteger(out.seed)) throw new Error('--seed must be an integer');
  return out;
}

const args = parseArgs(process.argv.slice(2));
const { targets } = (await import(TARGETS_MODULE)) as { targets: readonly FuzzTarget[] };
if (args.list) {
  for (const t of targets) process.stdout.write(`${t.name}\n  ${t.description}\n`);
  process.exit(0);
}
const known = new Set(targets.map((t) => t.name));
for (const name of args.targets) if (!known.has(name)) throw new Error(`no target ${name}; known: ${[...known].join(', ')}`);
const chosen = args.targets.length > 0 ? args.targets : [...known];
const findings = path.join(os.tmpdir(), 'kanal-fuzz-findings');

let failed = 0;
for (const name of chosen) {
  const seed = args.seed ?? (Math.random() * 2 ** 32) >>> 0;
  const dir = path.join(CORPUS, name);
  process.stdout.write(`# ${name}: ${args.timeS} s, seed ${seed}\n`);
  const r = await runFuzz({
    module: TARGETS_MODULE,
    target: name,
    corpusDirs: [dir],
    timeMs: args.timeS * 1000,
    seed,
    ...(args.save ? { saveDir: dir } : {}),
  });
  const rate = r.elapsedMs > 0 ? Math.round((r.runs * 1000) / r.elapsedMs) : 0;
  process.stdout.write(`  ${r.runs} runs (${rate}/s), ${r.seeds} seeds, corpus ${r.corpusSize}, ${r.features} coverage features\n`);
  if (r.failure) {
    failed++;
    mkdirSync(findings, { recursive: true });
    const file = path.join(findings, `${name}-${r.failure.kind}-${inputName(r.failure.input)}`);
    writeFileSync(file, r.failure.input);
    process.stdout.write(`${describeFailure(name, r.failure)}\n  written to ${file}\n`);
  }
}
process.stdout.write(`${chosen.length - failed} passed, ${failed} failed\n`);
process.exitCode = failed > 0 ? 1 : 0;
