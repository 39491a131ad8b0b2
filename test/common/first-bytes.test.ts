/**
 * The one reader of a connection's first bytes (the frontend's sniffing, a
 * worker's first request): `decide` sees every byte so far; a decision puts
 * the bytes back only when asked and only while the socket is open; an end,
 * a close, an error or the deadline settle it; it never rejects and never
 * lets a late error throw.
 */
import test from 'ava';
import { once } from 'node:events';
import { readFirstBytes } from '../../src/common/first-bytes.js';
import { unixSocketPair } from '../helpers/unix-socket-pair.js';

const socketPair = unixSocketPair;

/** Decides once a newline has come: the line. */
const line = (seen: Buffer): string | undefined => {
  const at = seen.indexOf(0x0a);
  return at < 0 ? undefined : seen.toString('latin1', 0, at);
};

test('decides when the bytes do, however they are split; with putBack the next reader gets them all', async (t) => {
  const [server, client] = await socketPair(t);
  const read = readFirstBytes(server, { timeoutMs: 10_000, putBack: true }, line);
  client.write('hel');
  await once(server, 'data');
  client.write('lo\nworld');
  const r = await read;
  t.like(r, { kind: 'decided', verdict: 'hello' });
  if (r.kind === 'decided') t.is(r.bytes.toString(), 'hello\nworld');
  t.true(server.isPaused());
  client.end();
  const back: Buffer[] = [];
  server.on('data', (c: Buffer) => back.push(c));
  server.resume();
  await once(server, 'end');
  t.is(Buffer.concat(back).toString(), 'hello\nworld');
});

test('without putBack nothing is unshifted: the caller decides what goes back', async (t) => {
  const [server, client] = await socketPair(t);
  const read = readFirstBytes(server, { timeoutMs: 10_000 }, line);
  client.end('one\n');
  t.like(await read, { kind: 'decided', verdict: 'one' });
  const back: Buffer[] = [];
  server.on('data', (c: Buffer) => back.push(c));
  server.resume();
  await once(server, 'end');
  t.is(Buffer.concat(back).length, 0);
});

test('an end, a close, a destroyed socket or the deadline settle it, and a later error does not throw', async (t) => {
  const [a, ca] = await socketPair(t);
  const ended = readFirstBytes(a, { timeoutMs: 10_000, putBack: true }, line);
  ca.end('no newline');
  t.deepEqual(await ended, { kind: 'closed' });

  const [b, cb] = await socketPair(t);
  const gone = readFirstBytes(b, { timeoutMs: 10_000, putBack: true }, line);
  cb.destroy();
  t.deepEqual(await gone, { kind: 'closed' });

  const [c] = await socketPair(t);
  c.destroy();
  t.deepEqual(await readFirstBytes(c, { timeoutMs: 10_000 }, line), { kind: 'closed' });

  const [d] = await socketPair(t);
  t.deepEqual(await readFirstBytes(d, { timeoutMs: 50 }, line), { kind: 'timeout' });
  // Its next owner has not listened yet: an error now must not end the process.
  const closed = new Promise((resolve) => d.once('close', resolve));
  d.destroy(new Error('late failure'));
  await closed;
  // An uncaught one would have failed the whole file.
  t.is(d.errored?.message, 'late failure');
});
