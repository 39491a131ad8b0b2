/**
 * closeWhenPeerGone (src/transport/peer-gone-watch.ts): a socket that
 * nothing polls (as Node's HTTP/2 can leave one) is closed once the kernel
 * says its peer is gone; healthy and non-TCP sockets are left alone. Real
 * loopback sockets; `pauseOnConnect` gives a socket Node does not read.
 */
import test from 'ava';
import net from 'node:net';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { closeWhenPeerGone } from '../../src/transport/peer-gone-watch.js';
import { socketFd } from '../../native/socket-buffers.js';
import { TCP_CLOSE, TCP_CLOSE_WAIT, TCP_ESTABLISHED, tcpState } from '../../native/tcp-state.js';
import { errorMessage } from '../../src/common/error-message.js';

const INTERVAL_MS = 100;

interface Pair {
  /** Accepted, never read: libuv does not poll it. */
  unread: net.Socket;
  client: net.Socket;
  close(): void;
}

/** Two accepted connections that Node never reads, and their clients. */
async function unreadPairs(n: number): Promise<Pair[]> {
  const accepted: net.Socket[] = [];
  const server = net.createServer({ pauseOnConnect: true, allowHalfOpen: true }, (s) => accepted.push(s));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const port = (server.address() as net.AddressInfo).port;
  const pairs: Pair[] = [];
  for (let i = 0; i < n; i++) {
    const client = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    client.on('error', () => undefined);
    await new Promise<void>((resolve) => client.once('connect', () => resolve()));
    for (let w = 0; accepted.length <= i && w < 100; w++) await sleep(10);
    const unread = accepted[i];
    unread.on('error', () => undefined);
    pairs.push({ unread, client, close: () => (unread.destroy(), client.destroy()) });
  }
  server.close();
  return pairs;
}

function closedWith(s: net.Socket, timeoutMs: number): Promise<Error | undefined | 'open'> {
  if (s.destroyed) return Promise.resolve(undefined);
  return new Promise((resolve) => {
    let error: Error | undefined;
    s.once('error', (err: Error) => (error = err));
    const timer = setTimeout(() => resolve('open'), timeoutMs);
    s.once('close', () => {
      clearTimeout(timer);
      resolve(error);
    });
  });
}

test('a reset that Node does not see (socket not polled) closes the socket within an interval; unwatched it stays open', async (t) => {
  const [watched, control] = await unreadPairs(2);
  t.teardown(() => (watched.close(), control.close()));
  const reasons: string[] = [];
  closeWhenPeerGone(watched.unread, (r) => reasons.push(r), INTERVAL_MS);
  t.is(tcpState(socketFd(watched.unread)), TCP_ESTABLISHED);

  watched.client.resetAndDestroy();
  control.client.resetAndDestroy();
  const result = await closedWith(watched.unread, 20 * INTERVAL_MS);
  t.true(result instanceof Error, `closed with an error, got ${String(result)}`);
  t.regex(errorMessage(result), /connection reset or closed \(seen in the kernel's TCP state\)/);
  t.deepEqual(reasons, ['connection reset or closed']);

  // The same situation without the watch: Node never finds out.
  t.is(tcpState(socketFd(control.unread)), TCP_CLOSE);
  await sleep(5 * INTERVAL_MS);
  t.false(control.unread.destroyed, 'an unwatched socket stays open although its peer is gone');
});

test('a FIN still unread an interval later closes the socket; a healthy idle one is left alone', async (t) => {
  const [finished, healthy] = await unreadPairs(2);
  t.teardown(() => (finished.close(), healthy.close()));
  const reasons: string[] = [];
  closeWhenPeerGone(finished.unread, (r) => reasons.push(`finished: ${r}`), INTERVAL_MS);
  closeWhenPeerGone(healthy.unread, (r) => reasons.push(`healthy: ${r}`), INTERVAL_MS);

  finished.client.end();
  for (let i = 0; i < 50 && tcpState(socketFd(finished.unread)) !== TCP_CLOSE_WAIT && !finished.unread.destroyed; i++) await sleep(10);
  const result = await closedWith(finished.unread, 20 * INTERVAL_MS);
  t.true(result instanceof Error, `closed with an error, got ${String(result)}`);
  t.regex(errorMessage(result), /peer closed its side/);

  await sleep(5 * INTERVAL_MS);
  t.false(healthy.unread.destroyed, 'an idle connection with a live peer stays open');
  t.is(tcpState(socketFd(healthy.unread)), TCP_ESTABLISHED);
  t.deepEqual(reasons, ['finished: peer closed its side']);
});

test('a Unix socket has no TCP state and is never closed by the watch', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-peer-gone-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 's.sock');
  const accepted: net.Socket[] = [];
  const server = net.createServer((s) => accepted.push(s));
  await new Promise<void>((resolve) => server.listen(file, () => resolve()));
  const client = net.connect(file);
  t.teardown(() => (client.destroy(), accepted.forEach((s) => s.destroy()), server.close()));
  await new Promise<void>((resolve) => client.once('connect', () => resolve()));
  t.is(tcpState(socketFd(client)), -1);
  let gone = false;
  closeWhenPeerGone(client, () => (gone = true), INTERVAL_MS);
  await sleep(5 * INTERVAL_MS);
  t.false(gone);
  t.false(client.destroyed);
});
