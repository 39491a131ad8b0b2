/**
 * The tenants file's watch (src/server/tenants/tenants-watch.ts) compares the
 * file with the text last loaded, not with a read of its own: a change made
 * between the load at start and the watch's start is reloaded, a touch
 * without a change reloads nothing, and a change after the watch started is
 * reloaded once.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { readTenantsFile } from '../../src/server/config/tenants-file.js';
import { watchTenantsFile, SETTLE_MS } from '../../src/server/tenants/tenants-watch.js';
import { captureLogger } from '../helpers/memory-stream.js';

const DOC = (n: number): string => `apiVersion: kanal.dev/v1alpha1\nkind: TenantsConfig\ntenants: [] # ${n}\n`;

function tempFile(t: import('ava').ExecutionContext, text: string): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-watch-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'tenants.yaml');
  fs.writeFileSync(file, text);
  return file;
}

/** Resolves on the next reload, or with 'none' after `quietMs` without one (a bound, not a timing assertion). */
function nextReload(reloads: (() => void)[], quietMs: number): Promise<'reloaded' | 'none'> {
  return new Promise((resolve) => {
    const waiter = (): void => {
      clearTimeout(timer);
      resolve('reloaded');
    };
    const timer = setTimeout(() => {
      reloads.splice(reloads.indexOf(waiter), 1);
      resolve('none');
    }, quietMs);
    reloads.push(waiter);
  });
}

test('a change made after the load and before the watch started is reloaded', async (t) => {
  const file = tempFile(t, DOC(1));
  const loaded = readTenantsFile(file);
  t.deepEqual(loaded.mistakes, []);
  // Changed between the load and the watch's start: a watch that took its own reading as the baseline never reloads it.
  fs.writeFileSync(file, DOC(2));
  const waiters: (() => void)[] = [];
  const watch = watchTenantsFile(file, loaded.digest, () => waiters.shift()?.(), captureLogger().log);
  t.teardown(() => watch.close());
  const reloaded = nextReload(waiters, 30_000);
  // Any event in the directory makes the watch compare.
  fs.writeFileSync(path.join(path.dirname(file), 'other'), 'x');
  t.is(await reloaded, 'reloaded');
});

test('a touch without a change reloads nothing; a change after the start is reloaded', async (t) => {
  const file = tempFile(t, DOC(1));
  const loaded = readTenantsFile(file);
  const waiters: (() => void)[] = [];
  let reloads = 0;
  const watch = watchTenantsFile(
    file,
    loaded.digest,
    () => {
      reloads++;
      waiters.shift()?.();
    },
    captureLogger().log,
  );
  t.teardown(() => watch.close());
  fs.utimesSync(file, new Date(), new Date());
  fs.writeFileSync(file, DOC(1));
  t.is(await nextReload(waiters, 4 * SETTLE_MS), 'none');
  const reloaded = nextReload(waiters, 30_000);
  fs.writeFileSync(file, DOC(3));
  t.is(await reloaded, 'reloaded');
  t.is(reloads, 1);
});
