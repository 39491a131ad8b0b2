/**
 * The kit's own failure modes (kit/launch/): a child that exits at start is
 * reported with its log, at once rather than at the timeout; a wait on a log
 * fails as soon as the writer is gone; a failed start leaves no process, no
 * directory and no exit-time registration behind; a readiness wait takes an
 * answer only from the child's own listener; the in-process launcher refuses
 * flags as the CLI does.
 */
import { alive } from '../helpers/process-group.js';
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { CleanupStack, scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { spawnChild } from '../../kit/launch/child.js';
import { killOnExit, removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { freePort, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import { serverFromFlags } from '../../kit/launch/in-process.js';
import { processTree } from '../../kit/launch/listener-holder.js';
import { captureLogger } from '../helpers/memory-stream.js';

const node = (script: string): string[] => [process.execPath, '-e', script];

test('a kanal child that exits at start fails the readiness wait with its exit and its log, before the timeout', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const dir = scopedTempDir(scope, 'kanal-kit-');
  const server = spawnKanal(scope, {
    name: 'no-certs',
    args: ['server', '--uds-name', path.join(dir, 's.sock')],
    logFile: path.join(dir, 'no-certs.log'),
  });
  // A timeout far beyond the test's own: only the exit can end this wait.
  const err = await t.throwsAsync(waitHealthy(server, `http://127.0.0.1:${await freePort()}/healthz`, 600_000));
  t.regex(err.message, /^no-certs exited with 2 before http:\/\/127\.0\.0\.1:\d+\/healthz answered/);
  t.regex(err.message, /the agent port needs a certificate: pass --cluster-cert and --cluster-key/, 'the log tail names what to fix');
  t.deepEqual(await server.exited, { code: 2, signal: null });
});

test('a log wait fails as soon as the process ends without the line, and a line written just before the exit still counts', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const dir = scopedTempDir(scope, 'kanal-kit-');
  const child = spawnChild(scope, {
    name: 'short',
    argv: node(`console.log(JSON.stringify({ level: 'info', msg: 'last words' })); process.exit(3)`),
    logFile: path.join(dir, 'short.log'),
  });
  await child.exited;
  t.like(await child.waitForLog((l) => l.msg === 'last words', 1000, 'the last line'), { level: 'info', msg: 'last words' });
  const err = await t.throwsAsync(child.waitForLog((l) => l.msg === 'never written', 600_000, 'a line never written'));
  t.regex(err.message, /short: a line never written.*the process exited with 3/s);
  t.regex(err.message, /last words/, 'with the log tail');
  const text = await t.throwsAsync(child.waitForLog(/never/, 600_000, 'a text never written'));
  t.regex(text.message, /exited with 3/);
});

test('cleanup after a failed start leaves nothing: the child (even one ignoring SIGTERM) is gone, its directory removed, nothing left for exit', async (t) => {
  t.timeout(60_000);
  const scope = new CleanupStack();
  const dir = scopedTempDir(scope, 'kanal-kit-');
  // Never healthy, and deaf to SIGTERM: the teardown must escalate to SIGKILL.
  const stubborn = spawnChild(scope, {
    name: 'stubborn',
    argv: node(`process.on('SIGTERM', () => console.log('ignoring SIGTERM')); console.log('up'); setInterval(() => undefined, 1000)`),
    logFile: path.join(dir, 'stubborn.log'),
  });
  await stubborn.waitForLog(/up/, 10_000, 'started');
  const err = await t.throwsAsync(waitHealthy(stubborn, `http://127.0.0.1:${await freePort()}/healthz`, 300));
  t.regex(err.message, /^stubborn: http:\/\/127\.0\.0\.1:\d+\/healthz not ready after 300 ms/);
  t.true(killOnExit.has(stubborn.pid) && removeOnExit.has(dir), 'registered for exit while running');

  await scope.run();
  t.deepEqual(await stubborn.exited, { code: null, signal: 'SIGKILL' });
  t.false(alive(stubborn.pid), 'the process is gone');
  t.false(fs.existsSync(dir), 'the directory is removed');
  t.false(killOnExit.has(stubborn.pid), 'no pid left for exit');
  t.false(removeOnExit.has(dir), 'no directory left for exit');
});

/** An HTTP server of this process answering 200 on 127.0.0.1 (a port taken by "another process" as far as a child is concerned). */
async function answering(t: ExecutionContext): Promise<number> {
  const server = http.createServer((_req, res) => res.end('ok'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return (server.address() as net.AddressInfo).port;
}

test("a 200 from another process's listener on the port is not the child's readiness: the wait times out naming that process", async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const dir = scopedTempDir(scope, 'kanal-kit-');
  const port = await answering(t);
  const idle = spawnChild(scope, { name: 'idle', argv: node('setTimeout(() => undefined, 60_000)'), logFile: path.join(dir, 'idle.log') });
  const err = await t.throwsAsync(waitHealthy(idle, `http://127.0.0.1:${port}/healthz`, 1000));
  t.is(
    err.message.split(';')[0],
    `idle: http://127.0.0.1:${port}/healthz not ready after 1000 ms (the port was answered by another process (pid ${process.pid}))`,
  );
  t.true(idle.running(), 'the child itself is fine, only not the one answering');
});

test('a child that loses its port to the process answering there fails the wait with EADDRINUSE, which withPortRetry retries', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const dir = scopedTempDir(scope, 'kanal-kit-');
  const port = await answering(t);
  let attempts = 0;
  const err = await t.throwsAsync(
    withPortRetry(async () => {
      attempts++;
      // Listens on the port this process holds, as a child started on a freePort() another process took meanwhile.
      const loser = spawnChild(scope, {
        name: 'loser',
        argv: node(`require('http').createServer().listen(${port}, '127.0.0.1'); setTimeout(() => undefined, 60_000)`),
        logFile: path.join(dir, 'loser.log'),
      });
      await waitHealthy(loser, `http://127.0.0.1:${port}/healthz`, 600_000);
    }),
  );
  t.regex(err.message, /^loser( exited with 1 before|: http:\S+ was answered by another process).*EADDRINUSE/s);
  t.is(attempts, 3, 'retried as a taken port');
});

test('a child below a wrapper that answers from its own listener is ready', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const dir = scopedTempDir(scope, 'kanal-kit-');
  await withPortRetry(async () => {
    const port = await freePort();
    const wrapped = spawnChild(scope, {
      name: 'wrapped',
      argv: node(
        `require('http').createServer((q, s) => s.end('ok')).listen(${port}, '127.0.0.1'); setTimeout(() => process.exit(0), 60_000)`,
      ),
      // A shell that waits for the program rather than becoming it: the listener is held one level down.
      wrapper: ['/bin/sh', '-c', '"$@"; exit $?', 'wrapper'],
      logFile: path.join(dir, 'wrapped.log'),
    });
    // Before the shell's stop (the scope runs newest first): its SIGTERM would leave the program behind.
    scope.teardown(() => {
      for (const pid of processTree(wrapped.pid).slice(1)) process.kill(pid, 'SIGKILL');
    });
    await waitHealthy(wrapped, `http://127.0.0.1:${port}/healthz`, 10_000);
  });
  t.pass();
});

test('a program that cannot be started throws at once, naming it, and registers nothing', (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const before = killOnExit.size;
  const err = t.throws(() => spawnChild(scope, { name: 'missing', argv: ['/nonexistent/kanal-kit-test'], logFile: '/dev/null' }));
  t.regex(err.message, /could not start missing \(\/nonexistent\/kanal-kit-test\)/);
  t.is(killOnExit.size, before);
});

test("the in-process launcher reads flags as the CLI does: unknown flags and invalid values are refused with the CLI's message", async (t) => {
  const log = captureLogger('silent').log;
  await t.throwsAsync(() => serverFromFlags(['--bogus-flag'], { log }), { message: /Unknown argument: bogus-flag/ });
  await t.throwsAsync(() => serverFromFlags(['--uds-name', '/tmp/x.sock'], { log }), {
    message: 'the agent port needs a certificate: pass --cluster-cert and --cluster-key (or --server-cert and --server-key)',
  });
});
