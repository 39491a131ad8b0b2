/**
 * HTTP/2 PING keepalive of the node:http2 transport: the client pings only
 * while streams are open and never more often than every 10 s; a peer that
 * stops answering is detected; the server never punishes a pinging client.
 * The server's own PINGs (liveness.ts) find a silent client. (Slow by
 * nature: the client's minimum interval is 10 s.)
 */
import test from 'ava';
import fs from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import { createH2Channel, createH2Server } from '../../src/transport/h2/index.js';
import { GrpcStatus, GrpcStatusError, type IncomingStream } from '../../src/transport/transport.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT } from '../../src/wire/metadata.js';
import { listenUnix, tempDir } from '../helpers/grpc-js-peer.js';
import { waitFor } from '../helpers/memory-stream.js';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A Unix-socket relay to `target` that can be turned into a black hole (nothing passes, nothing closes). */
async function blackHoleProxy(dir: string, target: string): Promise<{ target: string; blackHole(): void; close(): Promise<void> }> {
  let blackHole = false;
  const pairs: net.Socket[] = [];
  const file = path.join(dir, 'proxy.sock');
  const proxy = net.createServer((down) => {
    const up = net.connect(target.slice('unix://'.length));
    pairs.push(down, up);
    down.on('error', () => {});
    up.on('error', () => {});
    down.on('data', (c: Buffer) => blackHole || up.write(c));
    up.on('data', (c: Buffer) => blackHole || down.write(c));
  });
  await new Promise<void>((r) => proxy.listen(file, r));
  return {
    target: `unix://${file}`,
    blackHole: () => void (blackHole = true),
    close: () =>
      new Promise<void>((r) => {
        for (const p of pairs) p.destroy();
        proxy.close(() => r());
      }),
  };
}

test('client pings every interval while a stream is open, and not when idle', async (t) => {
  const dir = tempDir();
  const file = path.join(dir, 's.sock');
  const pings: number[] = [];
  const server = http2.createServer();
  server.on('session', (s) => s.on('ping', () => pings.push(Date.now())));
  server.on('stream', (stream) => {
    stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
    stream.on('end', () => stream.end());
    stream.resume();
  });
  await new Promise<void>((r) => server.listen(file, r));
  // Asking for 1 s gets the 10 s floor.
  const ch = createH2Channel({ target: `unix://${file}`, keepaliveIntervalMs: 1000 });
  // The interval counts from the stream's opening, which is no earlier than this call (a loaded event loop may resolve it late).
  const opened = Date.now();
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  await sleep(10_600);
  t.is(pings.length, 1, `pings at ${pings.map((p) => p - opened).join(', ')} ms`);
  t.true(pings[0] - opened >= 9_900);
  st.end();
  await new Promise<void>((r) => st.once('close', () => r()));
  await sleep(10_300);
  t.is(pings.length, 1, 'no pings on an idle connection');
  ch.close();
  await new Promise<void>((r) => server.close(() => r()));
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a peer that stops answering pings is detected; the stream ends with UNAVAILABLE', async (t) => {
  const dir = tempDir();
  const h2server = createH2Server(
    {
      agentConnect: (inc) => {
        const st = inc.accept({});
        st.on('packet', (p) => st.send(p));
      },
    },
    { maxReceiveMessageBytes: 1 << 20 },
  );
  const real = await listenUnix(dir, (s) => h2server.injectConnection(s));
  const proxy = await blackHoleProxy(dir, real.target);
  const ch = createH2Channel({ target: proxy.target, keepaliveIntervalMs: 10_000, keepaliveTimeoutMs: 1000 });
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  const back = new Promise<Packet>((r) => st.once('packet', r));
  st.send({ type: PacketType.DRAIN });
  t.is((await back).type, PacketType.DRAIN);
  proxy.blackHole();
  const started = Date.now();
  const err = await new Promise<Error | undefined>((r) => st.once('close', r));
  const took = Date.now() - started;
  t.true(err instanceof GrpcStatusError);
  t.is((err as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.true(took > 9_000 && took < 13_000, `detected after ${took} ms`);
  ch.close();
  await proxy.close();
  await h2server.close(100);
  await real.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('the server tolerates frequent pings, with and without open streams', async (t) => {
  const dir = tempDir();
  const server = createH2Server(
    {
      agentConnect: (inc) => {
        const st = inc.accept({});
        st.on('packet', (p) => st.send(p));
      },
    },
    { maxReceiveMessageBytes: 1 << 20 },
  );
  const l = await listenUnix(dir, (s) => server.injectConnection(s));
  const session = http2.connect('http://localhost', { createConnection: () => net.connect(l.target.slice('unix://'.length)) });
  let goaway = false;
  session.on('goaway', () => (goaway = true));
  session.on('error', () => {});
  await new Promise<void>((r) => session.once('connect', () => r()));
  const ping = (): Promise<boolean> => new Promise((r) => session.ping((err) => r(!err)));
  for (let i = 0; i < 20; i++) t.true(await ping()); // idle
  const req = session.request({ ':method': 'POST', ':path': AGENT_SERVICE_CONNECT, 'content-type': 'application/grpc', te: 'trailers' });
  await new Promise((r) => req.once('response', r));
  for (let i = 0; i < 50; i++) {
    t.true(await ping());
    await sleep(5);
  }
  t.false(goaway);
  t.false(session.destroyed);
  req.close();
  session.close();
  await server.close(100);
  await l.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('server liveness: a live client answers probes; a silent one goes quiet, then its stream ends with the PING timeout as the reason', async (t) => {
  const dir = tempDir();
  const timeouts: string[] = [];
  const incoming: IncomingStream[] = [];
  const h2server = createH2Server(
    {
      agentConnect: (inc) => {
        incoming.push(inc);
        const st = inc.accept({});
        st.on('packet', (p) => st.send(p));
      },
    },
    {
      maxReceiveMessageBytes: 1 << 20,
      keepalive: { intervalMs: 1000, timeoutMs: 3000, onTimeout: (_peer, reason) => timeouts.push(reason) },
    },
  );
  const real = await listenUnix(dir, (s) => h2server.injectConnection(s));
  const proxy = await blackHoleProxy(dir, real.target);
  const ch = createH2Channel({ target: proxy.target });
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  const liveness = incoming[0].liveness!;
  t.true(await liveness.probe(), 'a live client answers');
  await sleep(2500);
  t.false(liveness.quiet, 'periodic PINGs are answered');
  proxy.blackHole();
  const stalledAt = Date.now();
  await new Promise<void>((r) => liveness.on('quiet', r));
  const quietMs = Date.now() - stalledAt;
  t.false(await liveness.probe(500), 'a silent client does not answer');
  const closed = new Promise<Error | undefined>((r) => st.once('close', r));
  await waitFor(() => timeouts.length === 1, 'the PING timeout', 6000);
  t.log(`quiet after ${quietMs} ms, dead after ${Date.now() - stalledAt} ms (1 s / 3 s)`);
  t.is(timeouts[0], 'no answer to an HTTP/2 PING within 3000 ms');
  // The client learns only when the relay lets go (it has no keepalive running here).
  await proxy.close();
  await closed;
  ch.close();
  await h2server.close(100);
  await real.close();
  fs.rmSync(dir, { recursive: true, force: true });
});
