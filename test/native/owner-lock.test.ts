/**
 * The owner lock: one live holder per resource, a second
 * taker is told who holds it, and the kernel frees it when the holder dies,
 * even by SIGKILL. Abstract Unix sockets only: nothing on disk, no network
 * change.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { acquireOwnerLock, OwnerLockHeldError } from '../../native/owner-lock.js';
import { killOnExit } from '../../kit/launch/exit-cleanup.js';

const LOCK_MODULE = fileURLToPath(new URL('../../native/owner-lock.js', import.meta.url));

const resource = (): string => `test ${randomBytes(6).toString('hex')}`;

test('a second taker gets OwnerLockHeldError naming the holder; after release the lock is free', async (t) => {
  const r = resource();
  const first = await acquireOwnerLock(r, { pid: process.pid, agentID: 'node-1' });
  const err = await t.throwsAsync(acquireOwnerLock(r, { pid: process.pid, agentID: 'node-2' }), { instanceOf: OwnerLockHeldError });
  t.deepEqual(err?.owner, { pid: process.pid, agentID: 'node-1' });
  t.is(err?.message, `${r} is in use by another running kanal agent (pid ${process.pid}, agent ID node-1) in this network namespace`);
  await first.release();
  const again = await acquireOwnerLock(r, { pid: process.pid });
  await again.release();
});

test('a holder killed with SIGKILL frees the lock', async (t) => {
  const r = resource();
  const script = `import { acquireOwnerLock } from ${JSON.stringify(LOCK_MODULE)};\nawait acquireOwnerLock(${JSON.stringify(r)}, { pid: process.pid, agentID: 'doomed' });\nprocess.stdout.write('held\\n');\nsetInterval(() => undefined, 1000);\n`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  killOnExit.add(child.pid!);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  t.teardown(async () => {
    child.kill('SIGKILL');
    await exited;
    killOnExit.delete(child.pid!);
  });
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('child never took the lock')), 20_000);
    child.stdout.on('data', (c: Buffer) => {
      if (c.toString().includes('held')) {
        clearTimeout(timer);
        resolve();
      }
    });
  });
  const held = await t.throwsAsync(acquireOwnerLock(r, { pid: process.pid }), { instanceOf: OwnerLockHeldError });
  t.is(held?.owner?.agentID, 'doomed');
  t.is(held?.owner?.pid, child.pid);
  child.kill('SIGKILL');
  await exited;
  const mine = await acquireOwnerLock(r, { pid: process.pid });
  await mine.release();
  t.pass();
});
