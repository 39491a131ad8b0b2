#!/usr/bin/env node
// Runs the ava suite with the TAP reporter, streams its output, and ends with exactly one
// summary line: `N passed, M failed` (`, K skipped` appended when K > 0; todo counts as skipped).
// Extra arguments go to ava: `npm test -- dist/test/kit/pki.test.js`.
// Compiled tests whose source is gone (a test moved or deleted; tsc never removes outputs) are
// deleted first, so the suite runs each test once.
// Exit status is non-zero when a test failed or ava itself failed (crash, no tests, bad args).
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const avaDir = join(root, 'node_modules', 'ava');

/** ava's command-line entry, as its package.json names it (ava 7: cli.mjs; ava 8: cli.js). */
function avaEntry() {
  try {
    const { bin } = JSON.parse(readFileSync(join(avaDir, 'package.json'), 'utf8'));
    const rel = typeof bin === 'string' ? bin : bin?.ava;
    return typeof rel === 'string' ? join(avaDir, rel) : join(avaDir, 'entrypoints', 'cli.js');
  } catch {
    return join(avaDir, 'entrypoints', 'cli.js');
  }
}
const avaCli = avaEntry();

let passed = 0;
let failed = 0;
let skipped = 0;
let bailedOut = false;

function summarize(extraFailure) {
  if (extraFailure) {
    process.stdout.write(`# ${extraFailure}\n`);
    if (failed === 0) failed = 1; // keep the summary consistent with the exit status
  }
  process.stdout.write(`${passed} passed, ${failed} failed${skipped > 0 ? `, ${skipped} skipped` : ''}\n`);
}

if (!existsSync(avaCli)) {
  summarize(`ava not found at ${avaCli} (run npm ci)`);
  process.exit(1);
}

/** Deletes dist/test/**\/X.test.js (and its .map) when test/**\/X.test.ts does not exist. */
function removeStaleTests(dir) {
  if (!existsSync(dir)) return;
  for (const entry of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.test.js')) continue;
    const compiled = join(entry.parentPath, entry.name);
    const source = join(root, relative(join(root, 'dist'), compiled)).replace(/\.js$/, '.ts');
    if (existsSync(source)) continue;
    rmSync(compiled, { force: true });
    rmSync(`${compiled}.map`, { force: true });
    process.stdout.write(`# removed ${relative(root, compiled)}: its source ${relative(root, source)} is gone\n`);
  }
}
removeStaleTests(join(root, 'dist', 'test'));

// TAP test point: `ok 12 - name # SKIP reason`, `not ok 3 - name # TODO`.
const TEST_POINT = /^(not ok|ok)\b(?:\s+\d+)?(?:\s*-)?\s*(.*)$/;
const DIRECTIVE = /#\s*(SKIP|TODO)\b[^#]*$/i;
// eslint-disable-next-line no-control-regex
const ANSI = /\x1b\[[0-9;]*[A-Za-z]/g;

function parseLine(rawLine) {
  const line = rawLine.replace(ANSI, '');
  if (/^Bail out!/i.test(line)) {
    bailedOut = true;
    return;
  }
  const m = TEST_POINT.exec(line); // column 0 only: YAML diagnostics and t.log lines are indented / commented
  if (!m) return;
  const directive = DIRECTIVE.exec(m[2])?.[1]?.toUpperCase();
  if (directive === 'SKIP' || directive === 'TODO') skipped++;
  else if (m[1] === 'ok') passed++;
  else failed++;
}

// ava in its own process group, so a stuck run can be stopped with everything it started.
const child = spawn(process.execPath, [avaCli, '--tap', ...process.argv.slice(2)], {
  cwd: root,
  stdio: ['inherit', 'pipe', 'inherit'],
  detached: true,
});
const killGroup = (signal) => {
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
};

for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => killGroup(signal));
}

// A worker kept alive by a handle a failed test never closed makes ava wait
// forever after its last result; stop the run after this much silence.
const IDLE_LIMIT_MS = Number(process.env.KANAL_TEST_IDLE_SECONDS ?? 300) * 1000;
let lastOutput = Date.now();
let stalled = false;
const watchdog = setInterval(() => {
  if (Date.now() - lastOutput < IDLE_LIMIT_MS) return;
  stalled = true;
  clearInterval(watchdog);
  process.stdout.write(`# no test output for ${IDLE_LIMIT_MS / 1000} s: stopping ava and every process it started\n`);
  killGroup('SIGTERM');
  setTimeout(() => killGroup('SIGKILL'), 10_000).unref();
}, 5_000);

const lines = createInterface({ input: child.stdout, crlfDelay: Infinity });
lines.on('line', (line) => {
  lastOutput = Date.now();
  process.stdout.write(`${line}\n`);
  parseLine(line);
});

const [code, signal] = await Promise.all([
  new Promise((resolve) => child.on('close', (c, s) => resolve([c, s]))),
  new Promise((resolve) => lines.on('close', resolve)),
]).then(([exit]) => exit);

clearInterval(watchdog);
let problem;
if (stalled) problem = `the run stalled (no output for ${IDLE_LIMIT_MS / 1000} s) and was stopped`;
else if (signal) problem = `ava was killed by ${signal}`;
else if (bailedOut) problem = 'ava bailed out';
else if (code !== 0 && failed === 0) problem = `ava exited with code ${code} without a failing test point`;
else if (code === 0 && passed + failed + skipped === 0) problem = 'no tests ran';

summarize(problem);
process.exitCode = problem !== undefined || failed > 0 || code !== 0 ? 1 : 0;
