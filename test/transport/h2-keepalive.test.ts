/**
 * HTTP/2 PING keepalive of the node:http2 transport: the client pings only
 * while streams are open, never more often than every second, and a server
 * not known to accept that (upstream's grpc-go policy) no more often than
 * every 35 s; a peer that stops answering (and sends nothing else) is
 * detected; the server never punishes a pinging client. The server's own
 * PINGs (liveness.ts) find a silent client.
 */
import test from 'ava';
import fs from 'node:fs';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import { EventEmitter } from 'node:events';
import type { ClientHttp2Session } from 'node:http2';
import { createH2Channel, createH2Server } from '../../src/transport/h2/index.js';
import { SessionPinger } from '../../src/transport/h2/session-pinger.js';
import { GrpcStatus, GrpcStatusError, POLICED_PING_INTERVAL_MS, type IncomingStream } from '../../src/transport/transport.js';
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

/** A plain HTTP/2 server on a Unix socket answering every call with an open stream (and x-frequent-pings); counts the PINGs it receives. */
async function pingCountingServer(dir: string): Promise<{ file: string; pings: number[]; close(): Promise<void> }> {
  const file = path.join(dir, 's.sock');
  const pings: number[] = [];
  const server = http2.createServer();
  server.on('session', (s) => s.on('ping', () => pings.push(Date.now())));
  server.on('stream', (stream) => {
    stream.respond({ ':status': 200, 'content-type': 'application/grpc', 'x-frequent-pings': 'welcome' }, { waitForTrailers: true });
    stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
    stream.on('end', () => stream.end());
    stream.resume();
  });
  await new Promise<void>((r) => server.listen(file, r));
  return { file, pings, close: () => new Promise<void>((r) => server.close(() => r())) };
}

test('client pings every interval while a stream is open, and not when idle', async (t) => {
  const dir = tempDir();
  const server = await pingCountingServer(dir);
  // Asking for 500 ms gets the 1 s floor (liveness.ts, MIN_KEEPALIVE_INTERVAL_MS).
  const ch = createH2Channel({ target: `unix://${server.file}`, keepalive: { intervalMs: 500, timeoutMs: 20_000 } });
  // The interval counts from the session's start, which is no earlier than this call (a loaded event loop may resolve it late).
  const opened = Date.now();
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  await sleep(3500);
  const gaps = server.pings.map((p, i) => p - (i === 0 ? opened : server.pings[i - 1]));
  t.true(server.pings.length >= 2 && server.pings.length <= 3, `pings after ${gaps.join(', ')} ms`);
  t.true(
    gaps.every((g) => g >= 900),
    `pings after ${gaps.join(', ')} ms`,
  );
  st.end();
  await new Promise<void>((r) => st.once('close', () => r()));
  const before = server.pings.length;
  await sleep(2500);
  t.is(server.pings.length, before, 'no pings on an idle connection');
  ch.close();
  await server.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

test('a server that does not say it accepts frequent PINGs gets them at the policed spacing; one that does, at the interval', async (t) => {
  const dir = tempDir();
  const server = await pingCountingServer(dir);
  const policed = createH2Channel({
    target: `unix://${server.file}`,
    keepalive: { intervalMs: 1000, timeoutMs: 20_000, acceptsFrequentPings: (md) => md.has('kanal-features') },
  });
  const st1 = await policed.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  await sleep(2500);
  t.is(server.pings.length, 0, `at most one PING per ${POLICED_PING_INTERVAL_MS} ms to a server with grpc-go's policy`);
  st1.destroy();
  policed.close();
  const relaxed = createH2Channel({
    target: `unix://${server.file}`,
    keepalive: { intervalMs: 1000, timeoutMs: 20_000, acceptsFrequentPings: (md) => md.has('x-frequent-pings') },
  });
  const st2 = await relaxed.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  await sleep(2500);
  t.true(server.pings.length >= 1, 'PINGs at the interval once the response says so');
  st2.destroy();
  relaxed.close();
  await server.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** A stand-in session for SessionPinger: PINGs are never answered; `bytes` is what the connection received. */
function silentSession(): { session: ClientHttp2Session; pings: () => number } {
  let pings = 0;
  const fake = Object.assign(new EventEmitter(), {
    destroyed: false,
    ping: (): boolean => {
      pings++;
      return true;
    },
  });
  return { session: fake as unknown as ClientHttp2Session, pings: () => pings };
}

test('SessionPinger: bytes received after a PING count as its answer; silence past the timeout is death', async (t) => {
  let bytes = 0;
  const dead: string[] = [];
  const { session, pings } = silentSession();
  const pinger = new SessionPinger(session, {
    keepalive: { intervalMs: 1000, timeoutMs: 600 },
    bytesRead: () => bytes,
    streams: () => 1,
    onDead: (reason) => dead.push(reason),
  });
  // Data keeps arriving (a PING's ACK queued behind it): alive, however late the ACK.
  const flowing = setInterval(() => (bytes += 1000), 100);
  await sleep(3300);
  clearInterval(flowing);
  t.deepEqual(dead, []);
  t.true(pings() >= 2, `${pings()} PINGs`);
  // Then nothing: dead within an interval and a timeout.
  await waitFor(() => dead.length === 1, 'silence noticed', 2500);
  t.is(dead[0], 'no answer to an HTTP/2 PING within 600 ms');
  pinger.stop();
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
  const ch = createH2Channel({ target: proxy.target, keepalive: { intervalMs: 1000, timeoutMs: 1000 } });
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
  t.regex(err?.message ?? '', /no answer to an HTTP\/2 PING within 1000 ms/);
  // The message names the PING timeout as the cause; not before one timeout has passed (load only delays it).
  t.true(took > 900, `detected after ${took} ms`);
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
