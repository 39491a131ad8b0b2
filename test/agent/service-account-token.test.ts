/**
 * The agent's service account token source: the file is read afresh
 * for every connect, so a rotated projected token is the one sent; a missing,
 * empty, oversized or garbled file is an error naming the file, never an
 * anonymous dial.
 */
import test from 'ava';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { MAX_TOKEN_BYTES, ServiceAccountTokenError, ServiceAccountTokenSource } from '../../src/agent/service-account-token.js';

async function tempDir(t: { teardown(fn: () => Promise<void>): void }): Promise<string> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'kanal-satoken-'));
  t.teardown(() => fs.rm(dir, { recursive: true, force: true }));
  return dir;
}

test('each read returns the file as it is now: a token rotated between connects is the one sent', async (t) => {
  const dir = await tempDir(t);
  const file = path.join(dir, 'token');
  await fs.writeFile(file, 'eyJhbGciOi.first.sig\n');
  const source = new ServiceAccountTokenSource(file);
  t.is(await source.authorization(), 'Bearer eyJhbGciOi.first.sig', 'surrounding whitespace (a trailing newline) is not part of the token');
  t.is(source.readSync(), 'eyJhbGciOi.first.sig');

  // The kubelet rotates projected tokens by swapping a symlinked directory: a new file, renamed in.
  await fs.writeFile(path.join(dir, 'token.new'), 'eyJhbGciOi.second.sig');
  await fs.rename(path.join(dir, 'token.new'), file);
  t.is(await source.read(), 'eyJhbGciOi.second.sig');
  await fs.writeFile(file, 'eyJhbGciOi.third.sig');
  t.is(await source.read(), 'eyJhbGciOi.third.sig');
  t.is(source.readSync(), 'eyJhbGciOi.third.sig');
});

test('a missing, empty, oversized or garbled token file is an error naming the file and the flag', async (t) => {
  const dir = await tempDir(t);
  const file = path.join(dir, 'token');
  const source = new ServiceAccountTokenSource(file);
  await t.throwsAsync(source.read(), {
    instanceOf: ServiceAccountTokenError,
    message: `service account token file ${file} (--service-account-token-path) does not exist (is the projected service account token volume mounted?)`,
  });
  t.throws(() => source.readSync(), { instanceOf: ServiceAccountTokenError, message: /does not exist/ });
  await fs.writeFile(file, ' \n\t');
  await t.throwsAsync(source.authorization(), {
    message: `service account token file ${file} (--service-account-token-path) is empty; refusing to dial without a token`,
  });
  t.throws(() => source.readSync(), { message: /is empty; refusing to dial without a token/ });
  await fs.writeFile(file, 'x'.repeat(MAX_TOKEN_BYTES + 1));
  await t.throwsAsync(source.read(), { message: /is larger than 16384 bytes: not a token/ });
  t.throws(() => source.readSync(), { message: /is larger than 16384 bytes/ });
  await fs.writeFile(file, 'x'.repeat(MAX_TOKEN_BYTES));
  t.is((await source.read()).length, MAX_TOKEN_BYTES, 'exactly the bound is accepted');
  await fs.writeFile(file, 'two words');
  await t.throwsAsync(source.read(), { message: /contains whitespace or non-ASCII characters inside the token/ });
  await fs.writeFile(file, 'tökén');
  await t.throwsAsync(source.read(), { message: /non-ASCII/ });
  await fs.chmod(file, 0o000);
  if (process.getuid?.() !== 0) await t.throwsAsync(source.read(), { message: /cannot be read: EACCES/ });
  await t.throwsAsync(new ServiceAccountTokenSource(dir).read(), { message: /cannot be read: EISDIR/ });
  t.throws(() => new ServiceAccountTokenSource(dir).readSync(), { message: /cannot be read: EISDIR/ });
  t.throws(() => new ServiceAccountTokenSource(''), { message: '--service-account-token-path must not be empty' });
});
