/**
 * `npm run demo` cleans up when it is interrupted: Ctrl-C (SIGINT to its
 * process group, as a terminal sends it) or a SIGTERM to the demo alone stops
 * its server and agent and removes its temp dir, CA key included.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { REPO } from '../helpers/doc-blocks.js';

const DEMO = path.join(REPO, 'dist', 'kit', 'demo', 'main.js');
const LIMIT_MS = 60_000;

interface DemoRun {
  pid: number;
  /** Resolves with the output once it matches; rejects when the demo ends first. */
  waitFor: (pattern: RegExp) => Promise<string>;
  ended: Promise<{ code: number | null; output: string }>;
}

/** `node dist/kit/demo/main.js --keep` in a process group of its own, killed with the group by the scope or after the limit. */
function startDemo(scope: Scope): DemoRun {
  const child = spawn(process.execPath, [DEMO, '--keep'], { detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
  const pid = child.pid!;
  const killGroup = (): void => {
    try {
      process.kill(-pid, 'SIGKILL');
    } catch {
      // gone
    }
  };
  const limit = setTimeout(killGroup, LIMIT_MS);
  scope.teardown(() => {
    clearTimeout(limit);
    killGroup();
  });
  let output = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => (output += d));
  child.stderr.setEncoding('utf8').on('data', (d: string) => (output += d));
  const ended = new Promise<{ code: number | null; output: string }>((resolve) =>
    child.on('close', (code) => {
      clearTimeout(limit);
      resolve({ code, output });
    }),
  );
  const waitFor = (pattern: RegExp): Promise<string> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        if (pattern.test(output)) {
          child.stdout.off('data', check);
          resolve(output);
        }
      };
      child.stdout.on('data', check);
      check();
      void ended.then(() => reject(new Error(`the demo ended before ${String(pattern)}:\n${output}`)));
    });
  return { pid, waitFor, ended };
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

for (const how of ['SIGINT to the process group (Ctrl-C)', 'SIGTERM to the demo alone'] as const) {
  test(`the demo interrupted by ${how} stops its server and agent and removes its temp dir with the CA key`, async (t) => {
    const demo = startDemo(t);
    const output = await demo.waitFor(/kept running until Ctrl-C/);
    const dir = /working in (\S+)/.exec(output)?.[1];
    const pids = /server \(pid (\d+)\) and agent \(pid (\d+)\) up/.exec(output);
    if (dir === undefined || pids === null) return t.fail(`no "working in" or pid line:\n${output}`);
    t.regex(output, /all demo steps behaved as expected/);
    t.true(fs.existsSync(path.join(dir, 'ca.key')), 'the CA key is there while the demo runs');
    const children = [Number(pids[1]), Number(pids[2])];
    t.true(children.every(alive));

    if (how === 'SIGTERM to the demo alone') process.kill(demo.pid, 'SIGTERM');
    else process.kill(-demo.pid, 'SIGINT');
    const { code, output: all } = await demo.ended;
    t.is(code, how === 'SIGTERM to the demo alone' ? 143 : 130, all);
    t.false(fs.existsSync(dir), `${dir} removed`);
    t.deepEqual(
      children.filter((p) => alive(p)),
      [],
      'server and agent have ended',
    );
  });
}
