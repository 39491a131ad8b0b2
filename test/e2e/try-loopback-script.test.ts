/**
 * scripts/try-loopback.sh, the README's "by hand" walk-through, runs as a
 * script: both directions answer, and what it started and the temp dir it made
 * (with its CA key) are gone when it exits, also when Ctrl-C ends it (SIGINT
 * to its process group, as a terminal sends it); with KEEP=1 the `kanal status`
 * commands it prints answer; a server that cannot start is named as the cause.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { freePort } from '../../kit/launch/kanal-cli.js';
import { run } from '../../kit/launch/run-to-end.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { REPO } from '../helpers/doc-blocks.js';
import { alive, startInGroup, type GroupRun } from '../helpers/process-group.js';

const SCRIPT = path.join(REPO, 'scripts', 'try-loopback.sh');
const LIMIT_MS = 60_000;

/** The script in a process group of its own with free ports; the scope kills the group. */
async function startScript(scope: Scope, env: NodeJS.ProcessEnv = {}): Promise<GroupRun> {
  const ports = {
    AGENT_PORT: await freePort(),
    SERVER_HEALTH: await freePort(),
    AGENT_HEALTH: await freePort(),
    WEB_PORT: await freePort(),
    KAS_PORT: await freePort('127.0.0.2'),
    SERVER_ADMIN: await freePort(),
    AGENT_ADMIN: await freePort(),
  };
  const portEnv = Object.fromEntries(Object.entries(ports).map(([k, v]) => [k, String(v)]));
  return startInGroup(scope, SCRIPT, [], { env: { ...portEnv, ...env }, limitMs: LIMIT_MS, what: 'the script' });
}

/** The temp dir and the pids the script reported. */
function whatItMade(output: string): { dir: string; pids: number[] } {
  const dir = /working in (\S+)/.exec(output)?.[1];
  const pids = /pids ([\d ]+)/.exec(output)?.[1];
  if (dir === undefined || pids === undefined) throw new Error(`no "working in" or "pids" line:\n${output}`);
  return { dir, pids: pids.trim().split(' ').map(Number) };
}

test('the loopback walk-through runs as a script: both directions answer, and it leaves no process and no directory', async (t) => {
  const run = await startScript(t);
  const { code } = await run.ended;
  const output = run.output();
  t.is(code, 0, output);
  t.regex(output, /200 Connection Established[\s\S]*hello from \/cp-to-node/);
  t.regex(output, /node -> control plane:\n {2}hello from \/node-to-cp/);
  const { dir, pids } = whatItMade(output);
  t.is(pids.length, 3, 'web server, server, agent');
  t.false(fs.existsSync(dir), `${dir} removed`);
  t.deepEqual(
    pids.filter((p) => alive(p)),
    [],
    'every process it started has ended',
  );
});

test('with KEEP=1 the kanal status commands it prints answer; Ctrl-C ends it at once and it still removes its directory (with the CA key) and stops what it started', async (t) => {
  const script = await startScript(t, { KEEP: '1' });
  await script.waitFor(/until Ctrl-C/);
  const { dir, pids } = whatItMade(script.output());
  t.true(fs.existsSync(path.join(dir, 'ca.key')), 'the CA key is there while it runs');
  const commands = [...script.output().matchAll(/^ {2}(\S+.* status --admin-address \S+)$/gm)].map((m) => m[1]);
  t.is(commands.length, 2, script.output());
  for (const [command, what] of commands.map((c, i) => [c, i === 0 ? /^Kanal server / : /^Kanal agent node-1 /] as const)) {
    const words = command.split(' ');
    const status = await run(words[0], words.slice(1), { timeoutMs: 20_000 });
    t.is(status.code, 0, `${command}: ${status.stderr}`);
    t.regex(status.stdout, what);
  }
  process.kill(-script.pid, 'SIGINT');
  const { code } = await script.ended;
  t.is(code, 130, script.output());
  t.false(fs.existsSync(dir), `${dir} removed`);
  t.deepEqual(
    pids.filter((p) => alive(p)),
    [],
    'every process it started has ended',
  );
});

test('a server that cannot start is said to have exited, with its log, not as an agent that is not ready', async (t) => {
  // The agent port taken: the server exits at once with a listen error.
  const taken = net.createServer();
  await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve));
  t.teardown(() => taken.close());
  const port = (taken.address() as net.AddressInfo).port;
  const script = await startScript(t, { AGENT_PORT: String(port) });
  const { code, output } = await script.ended;
  t.is(code, 1, output);
  t.regex(
    output,
    /the server exited \(code 1\); the end of server\.log:[\s\S]*cannot listen on 127\.0\.0\.1:\d+ \(--agent-bind-address, --agent-port\)/,
  );
  t.notRegex(output, /not ready after/);
  const { dir } = whatItMade(output);
  t.false(fs.existsSync(dir), `${dir} removed`);
});
