/**
 * Which Node.js runs Kanal: versions below the supported floor are refused
 * before any dependency loads, by the real `kanal` entry run on the system's
 * own older Node when the machine has one (Debian's, /usr/bin/node).
 */
import test from 'ava';
import path from 'node:path';
import fs from 'node:fs';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { runtimeProblem, runtimeWarning, SUPPORTED_NODE } from '../../src/cli/runtime.js';
import { RUNTIME_FLAGS } from '../../src/cli/runtime-flags.js';

const MAIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', 'src', 'cli', 'main.js');

test('runtimeProblem: below 22.19 is refused naming the version needed; 22.19+, 24 and 26 run', (t) => {
  for (const old of ['20.20.2', '18.20.0', '22.18.9', '21.7.3', 'garbage']) {
    const problem = runtimeProblem(old);
    t.truthy(problem, old);
    t.true(problem?.includes(`Node.js ${old} cannot run Kanal`), old);
    t.true(problem?.includes(`needs Node.js ${SUPPORTED_NODE} or later`), old);
  }
  for (const ok of ['22.19.0', '22.23.1', '24.21.0', '26.10.0', '27.0.0']) t.is(runtimeProblem(ok), undefined, ok);
});

test('runtimeWarning: only the server on Node 24 hears about its leaked client certificates', (t) => {
  t.regex(runtimeWarning('24.21.0', 'server') ?? '', /Node\.js 24\.21\.0 keeps about 2\.7 KiB .*\(docs\/memory\.md/);
  t.is(runtimeWarning('24.21.0', 'agent'), undefined);
  t.is(runtimeWarning('26.10.0', 'server'), undefined);
  t.is(runtimeWarning('22.23.0', 'server'), undefined);
});

test('kanal on an unsupported Node.js exits 1 with the message, before loading anything that would crash', async (t) => {
  const system = ['/usr/bin/node', '/usr/local/bin/node'].find((p) => fs.existsSync(p) && p !== process.execPath);
  if (!system) return t.pass('no second Node.js on this machine; skipped');
  const version = await new Promise<string>((resolve) =>
    execFile(system, ['-p', 'process.versions.node'], (_e, out) => resolve(out.trim())),
  );
  if (runtimeProblem(version) === undefined) return t.pass(`${system} is Node.js ${version}, which is supported; skipped`);
  const r = await new Promise<{ code: number | null; stderr: string; stdout: string }>((resolve) =>
    execFile(system, [MAIN, 'server', '--help'], { timeout: 20_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr }),
    ),
  );
  t.is(r.code, 1);
  t.is(r.stdout, '');
  t.is(r.stderr, `kanal: ${runtimeProblem(version)}\n`);
});

test("the npm form's shebang runs node with RUNTIME_FLAGS, as the executable and the launchers do", (t) => {
  const shebang = fs.readFileSync(MAIN, 'utf8').split('\n')[0];
  t.is(shebang, `#!/usr/bin/env -S node ${RUNTIME_FLAGS.join(' ')}`);
});
