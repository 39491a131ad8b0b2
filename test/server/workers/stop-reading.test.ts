/**
 * A socket the primary read from, handed to a worker (src/server/workers/
 * stop-reading.ts): a byte that arrives after the hand-off, before the
 * worker's acknowledgement reached the primary, reaches the worker; bytes
 * Node had already buffered come back to the caller. The worker is a real
 * child process over Node's IPC channel, as the primary's workers are.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { spawn, type ChildProcess } from 'node:child_process';
import { stopReading } from '../../../src/server/workers/stop-reading.js';

/** A worker that echoes whatever it reads on each socket handed to it. */
const ECHO_WORKER = `process.on('message', (m, s) => { if (s) s.on('data', (d) => s.write(d)); });`;

function startWorker(): ChildProcess {
  return spawn(process.execPath, ['-e', ECHO_WORKER], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
}

/** Rejects after `ms` naming what did not happen, else settles as `p` does. */
function within<T>(p: Promise<T>, what: string, ms = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** A loopback connection as a listener with pauseOnConnect accepts it (the primary's listeners): client and accepted ends, closed at teardown. */
async function acceptedPair(t: ExecutionContext): Promise<{ client: net.Socket; socket: net.Socket }> {
  const server = net.createServer({ pauseOnConnect: true });
  t.teardown(() => server.close());
  const accepted = new Promise<net.Socket>((resolve) => server.once('connection', resolve));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  t.teardown(() => client.destroy());
  const socket = await within(accepted, 'accepted');
  t.teardown(() => socket.destroy());
  return { client, socket };
}

test('a byte sent right after the hand-off reaches the worker, not the primary', async (t) => {
  const worker = startWorker();
  t.teardown(() => worker.kill('SIGKILL'));
  const { client, socket } = await acceptedPair(t);
  const first = new Promise<void>((resolve) => socket.once('data', () => resolve()));
  socket.resume();
  client.write('first');
  await within(first, 'the primary read the first chunk');
  // As the primary does once it has read a ClientHello; all of it before its event loop runs again.
  t.is(stopReading(socket).length, 0, 'the first chunk went to its listener, nothing stayed buffered');
  worker.send({ type: 'connection' }, socket);
  // In the kernel before the worker can have acknowledged the handle: the primary's handle is still open.
  client.write('second');
  const echoed = await within(
    new Promise<string>((resolve) => client.once('data', (d: Buffer) => resolve(d.toString()))),
    'the worker echoed what came after the hand-off',
  );
  t.is(echoed, 'second');
});

test('bytes already in the socket buffer come back to the caller, in order', async (t) => {
  const { client, socket } = await acceptedPair(t);
  // Paused, not flowing: what arrives stays in the stream's buffer.
  socket.read(0);
  client.write('one ');
  client.write('two');
  await within(
    (async () => {
      for (let i = 0; i < 200 && socket.readableLength < 7; i++) await new Promise((r) => setTimeout(r, 10));
    })(),
    'buffered',
  );
  t.is(stopReading(socket).toString(), 'one two');
  t.is(socket.readableLength, 0);
});
