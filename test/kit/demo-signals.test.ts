/**
 * `npm run demo` cleans up when it is interrupted: Ctrl-C (SIGINT to its
 * process group, as a terminal sends it) or a SIGTERM to the demo alone stops
 * its server and agent and removes its temp dir, CA key included.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { REPO } from '../helpers/doc-blocks.js';
import { alive, startInGroup, type GroupRun } from '../helpers/process-group.js';

const DEMO = path.join(REPO, 'dist', 'kit', 'demo', 'main.js');
const LIMIT_MS = 60_000;

/** `node dist/kit/demo/main.js --keep` in a process group of its own, killed with the group by the scope or after the limit. */
function startDemo(scope: Scope): GroupRun {
  return startInGroup(scope, process.execPath, [DEMO, '--keep'], { limitMs: LIMIT_MS, what: 'the demo' });
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
