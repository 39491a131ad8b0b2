/**
 * The frontend's Unix socket is bound, then given its mode and group by path
 * (src/server/frontends/unix-socket.ts), so its directory must keep other
 * users from swapping the socket for a link in between
 * (src/common/owned-files.ts): a directory every user may write without the
 * sticky bit, one another user owns, or a path through another user's link
 * is refused naming --uds-name; a sticky one like /tmp is accepted.
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { listenUnix, UnixSocketError } from '../../src/server/frontends/unix-socket.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';

async function refused(t: import('ava').ExecutionContext, file: string): Promise<string> {
  const server = net.createServer();
  t.teardown(() => void server.close());
  const err = await t.throwsAsync(listenUnix(server, { path: file, deleteExisting: true }), { instanceOf: UnixSocketError });
  t.false(server.listening, 'nothing bound');
  return err?.message ?? '';
}

test('a socket directory others may write without the sticky bit is refused naming --uds-name; a sticky one is accepted', async (t) => {
  const open = scopedTempDir(t, 'kanal-uds-open-');
  fs.chmodSync(open, 0o777);
  const file = path.join(open, 'kanal.sock');
  t.regex(await refused(t, file), new RegExp(`^--uds-name ${file}: ${open} is writable by every user without the sticky bit`));
  t.false(fs.existsSync(file));

  const sticky = scopedTempDir(t, 'kanal-uds-sticky-');
  fs.chmodSync(sticky, 0o1777);
  const server = net.createServer();
  const bound = await listenUnix(server, { path: path.join(sticky, 'kanal.sock'), deleteExisting: true });
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  t.true(fs.lstatSync(bound.path).isSocket());
});

test("a socket directory another user owns, or reached through another user's link, is refused", async (t) => {
  if (process.geteuid?.() !== 0) {
    t.log('skipped: needs root to make files of nobody');
    t.pass();
    return;
  }
  const base = scopedTempDir(t, 'kanal-uds-');
  const theirs = path.join(base, 'theirs');
  fs.mkdirSync(theirs);
  fs.chownSync(theirs, 65534, 65534);
  t.regex(await refused(t, path.join(theirs, 'kanal.sock')), /theirs is owned by uid 65534/);

  const shared = scopedTempDir(t, 'kanal-uds-shared-');
  fs.chmodSync(shared, 0o1777);
  const target = scopedTempDir(t, 'kanal-uds-target-');
  const link = path.join(shared, 'run');
  execFileSync('setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', '--', 'ln', '-s', target, link]);
  t.regex(await refused(t, path.join(link, 'kanal.sock')), /run is a symbolic link owned by uid 65534/);
  t.deepEqual(fs.readdirSync(target), [], 'nothing made where the link points');
});
