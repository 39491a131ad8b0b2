/**
 * A connection handed from one worker to another over a Unix socket
 * (src/server/workers/handoff.ts), through its two functions: the handoff
 * line arrives whole, bytes the first worker had already read are replayed
 * before later ones, bytes flow both ways, either end closing closes the
 * other, a missing worker or a malformed line closes the connection and is
 * logged.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { forward, listenForHandoffs, type Handoff } from '../../../src/server/workers/handoff.js';
import { scopedTempDir } from '../../../kit/launch/cleanup-scope.js';
import { captureLogger } from '../../helpers/memory-stream.js';

/** Rejects after `ms` naming the step, else settles as `p` does. */
function step<T>(p: Promise<T>, what: string, ms = 10_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** Resolves once `s` has received `n` bytes, with them. */
function readBytes(s: net.Socket, n: number): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const onData = (c: Buffer): void => {
      chunks.push(c);
      got += c.length;
      if (got >= n) {
        s.off('data', onData);
        resolve(Buffer.concat(chunks));
      }
    };
    s.on('data', onData);
    s.once('close', () => reject(new Error(`closed after ${got} of ${n} bytes`)));
  });
}

const closed = (s: net.Socket): Promise<void> => new Promise((r) => (s.closed ? r() : s.once('close', () => r())));

/** A connected pair of sockets: `client` (the agent or kube-apiserver) and `accepted` (the first worker's end). */
async function connection(t: ExecutionContext, dir: string): Promise<{ client: net.Socket; accepted: net.Socket }> {
  const file = path.join(dir, `front-${Math.random().toString(36).slice(2)}.sock`);
  let onAccept!: (s: net.Socket) => void;
  const acceptedP = new Promise<net.Socket>((r) => (onAccept = r));
  const server = net.createServer({ allowHalfOpen: true }, onAccept);
  await new Promise<void>((r) => server.listen(file, r));
  const client = net.connect(file);
  client.on('error', () => {});
  const accepted = await step(acceptedP, 'the first worker accepts');
  server.close();
  t.teardown(() => {
    client.destroy();
    accepted.destroy();
  });
  return { client, accepted };
}

interface Receiver {
  path: string;
  taken: Promise<{ socket: net.Socket; handoff: Handoff }>;
  count: () => number;
}

async function receiver(t: ExecutionContext, dir: string, log = captureLogger().log): Promise<Receiver> {
  const file = path.join(dir, 'worker-1.sock');
  let n = 0;
  let onTake!: (v: { socket: net.Socket; handoff: Handoff }) => void;
  const taken = new Promise<{ socket: net.Socket; handoff: Handoff }>((r) => (onTake = r));
  const listener = await listenForHandoffs(
    file,
    (socket, handoff) => {
      n++;
      onTake({ socket, handoff });
    },
    log,
  );
  t.teardown(() => listener.close());
  return { path: file, taken, count: () => n };
}

const AGENT: Handoff = {
  kind: 'agent',
  tenant: 'beta',
  credential: { key: 'x509\nCN=beta-agents\n\nCN=node-1', subject: 'CN=node-1 (issuer CN=beta-agents)' },
  peer: '127.0.0.1:40000',
};

test('forward: the handoff line arrives whole, bytes already read come first, then the rest, both ways', async (t) => {
  const dir = scopedTempDir(t, 'kanal-handoff-');
  const worker = await receiver(t, dir);
  const { client, accepted } = await connection(t, dir);

  // The first worker read the start of the connection (to decide whose it is) and put it back.
  client.write('PRI * HTTP/2.0 early bytes|');
  const early = await step(readBytes(accepted, 'PRI * HTTP/2.0 early bytes|'.length), 'the first worker reads the early bytes');
  accepted.pause();
  accepted.unshift(early);
  const log = captureLogger();
  forward(accepted, worker.path, AGENT, log.log);

  const { socket, handoff } = await step(worker.taken, 'the receiving worker takes the connection');
  t.deepEqual(handoff, AGENT);
  socket.resume();
  client.write('later bytes');
  const got = await step(readBytes(socket, 'PRI * HTTP/2.0 early bytes|later bytes'.length), 'the receiving worker reads every byte');
  t.is(got.toString(), 'PRI * HTTP/2.0 early bytes|later bytes', 'the early bytes, replayed, then the later ones');

  socket.write('answer');
  t.is((await step(readBytes(client, 6), 'the answer reaches the client')).toString(), 'answer');
  t.is(worker.count(), 1);
  t.deepEqual(log.lines, [], 'nothing logged on a relay that works');

  // The client goes: the relay ends, and the receiving worker (half-open, as a transport wants it) reads its end;
  // the receiving worker closing then closes the first worker's socket.
  client.destroy();
  await step(
    new Promise<void>((r) => (socket.readableEnded ? r() : socket.once('end', () => r()))),
    "the receiving worker's socket reads the end after the client's",
  );
  socket.destroy();
  await step(closed(accepted), "the first worker's socket closes after the receiving worker's");
});

test('forward: the receiving worker closing closes the client', async (t) => {
  const dir = scopedTempDir(t, 'kanal-handoff-');
  const worker = await receiver(t, dir);
  const { client, accepted } = await connection(t, dir);
  forward(accepted, worker.path, { kind: 'frontend', tenant: 'alpha', peer: 'unix' }, captureLogger().log);
  const { socket, handoff } = await step(worker.taken, 'the receiving worker takes the connection');
  t.deepEqual(handoff, { kind: 'frontend', tenant: 'alpha', peer: 'unix' });
  socket.destroy();
  await step(closed(client), 'the client is closed after the receiving worker closed');
});

test('forward to a worker that is not there: the client is closed and the failure logged with its tenant', async (t) => {
  const dir = scopedTempDir(t, 'kanal-handoff-');
  const { client, accepted } = await connection(t, dir);
  const log = captureLogger();
  forward(accepted, path.join(dir, 'worker-gone.sock'), AGENT, log.log);
  await step(closed(client), 'the client is closed');
  const [line] = log.matching("relaying a connection to its tenant's worker failed");
  t.truthy(line, JSON.stringify(log.lines));
  t.is(line.tenant, 'beta');
  t.is(line.peer, '127.0.0.1:40000');
  t.regex(String(line.err), /ENOENT/);
});

test('listenForHandoffs: the line and the first bytes in one write; a token-placed agent keeps byToken', async (t) => {
  const dir = scopedTempDir(t, 'kanal-handoff-');
  const worker = await receiver(t, dir);
  const raw = net.connect(worker.path);
  t.teardown(() => void raw.destroy());
  const line: Handoff = { kind: 'agent', tenant: 'gamma', peer: '[::1]:5', byToken: true };
  raw.write(`${JSON.stringify(line)}\nfirst bytes`);
  const { socket, handoff } = await step(worker.taken, 'the connection is taken');
  t.deepEqual(handoff, line);
  socket.resume();
  t.is((await step(readBytes(socket, 11), 'the bytes after the line')).toString(), 'first bytes', 'the line consumed, nothing more');
});

for (const [what, bytes] of [
  ['not JSON', 'not json\n'],
  ['an unknown kind', `${JSON.stringify({ kind: 'tunnel', tenant: 'a', peer: 'p' })}\n`],
  ['no tenant', `${JSON.stringify({ kind: 'agent', peer: 'p' })}\n`],
  ['byToken with a certificate', `${JSON.stringify({ ...AGENT, byToken: true })}\n`],
  ['byToken on a frontend', `${JSON.stringify({ kind: 'frontend', tenant: 'a', peer: 'p', byToken: true })}\n`],
  ['a line longer than 8 KiB without its end', 'x'.repeat(9 * 1024)],
] as const) {
  test(`listenForHandoffs: a connection with ${what} is closed, never taken`, async (t) => {
    const dir = scopedTempDir(t, 'kanal-handoff-');
    const log = captureLogger();
    const worker = await receiver(t, dir, log.log);
    const raw = net.connect(worker.path);
    raw.on('error', () => {});
    t.teardown(() => void raw.destroy());
    raw.write(bytes);
    await step(closed(raw), 'the receiving worker closes the connection');
    t.is(worker.count(), 0);
    if (bytes.endsWith('\n')) t.is(log.matching('without a valid handoff line').length, 1, 'logged once');
  });
}

test("listenForHandoffs: a dead worker's socket file is replaced", async (t) => {
  const dir = scopedTempDir(t, 'kanal-handoff-');
  fs.writeFileSync(path.join(dir, 'worker-1.sock'), 'left behind');
  const worker = await receiver(t, dir);
  t.true(fs.statSync(worker.path).isSocket());
});
