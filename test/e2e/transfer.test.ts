/**
 * Bulk and concurrent traffic through the real CLI, control plane -> node:
 * 64 MiB each way with sha256 integrity, and 200 concurrent connections
 * each echoing its own data, over HTTP CONNECT and the gRPC frontend.
 */
import anyTest, { type TestFn } from 'ava';
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import type net from 'node:net';
import { grpcJsTransport } from '../../src/transport/grpc-js/index.js';
import { grpcDial } from '../../kit/demo/proxy-client.js';
import {
  connectThrough,
  echoRoundTrip,
  fileScope,
  frontendProxyStream,
  readExactly,
  readToEnd,
  sha256,
  startEchoBackend,
  startProxy,
  startSinkBackend,
  startSourceBackend,
  tunnelThrough,
  writeAll,
  waitUntil,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { UNIX_FRONTEND_SEND_BUFFER_BYTES } from '../../src/transport/socket-send-buffer.js';
import { PacketType } from '../../src/wire/packet.js';

interface Ctx {
  server: KanalServerProcess;
  payload: Buffer;
}

const test = anyTest as TestFn<Ctx>;
const shared = fileScope(test);
const BIG = 64 * 1024 * 1024;

test.before(async (t) => {
  const { server } = await startProxy(shared);
  t.context = { server, payload: randomBytes(BIG) };
});

/** Polls until `cond` holds (bounded); returns whether it did. */
async function eventually(cond: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() >= deadline) return false;
    await sleep(50);
  }
  return true;
}

/** The server's ends of connections on its Unix socket, as `ss` reports them: send buffer (skmem tb) and bytes queued in it (t). */
function serverUnixEnds(uds: string): { tb: number; queued: number }[] {
  const out = execFileSync('ss', ['-x', '-m', '-n', 'state', 'established'], { encoding: 'utf8' });
  const ends: { tb: number; queued: number }[] = [];
  for (const line of out.split('\n')) {
    // The accepting end has the socket's path as its local address; the client's end shows '*'.
    const fields = line.trim().split(/\s+/);
    if (!fields.includes(uds)) continue;
    const tb = /\btb(\d+)/.exec(line);
    const queued = /[(,]t(\d+)/.exec(line);
    if (tb) ends.push({ tb: Number(tb[1]), queued: Number(queued?.[1] ?? 0) });
  }
  return ends;
}

test.serial(
  'the server gives its end of a frontend Unix socket a 2 MiB send buffer once the default one fills (it stalls downloads)',
  async (t) => {
    const { server } = t.context;
    const echo = await startEchoBackend(t);
    const s = await tunnelThrough(t, server, echo.address);
    t.true(await echoRoundTrip(s, randomBytes(1000)));
    const wmemMax = Number(fs.readFileSync('/proc/sys/net/core/wmem_max', 'utf8').trim());
    const wmemDefault = Number(fs.readFileSync('/proc/sys/net/core/wmem_default', 'utf8').trim());
    const privileged = process.getuid?.() === 0;
    // Unprivileged, the kernel caps the request at net.core.wmem_max (it accounts twice that).
    const expected = privileged ? UNIX_FRONTEND_SEND_BUFFER_BYTES : Math.min(UNIX_FRONTEND_SEND_BUFFER_BYTES, 2 * wmemMax);
    const small = serverUnixEnds(server.uds);
    t.is(small.length, 1, 'one established connection on the socket');
    t.log(`ss: after a small echo, tb ${small[0].tb} B (wmem_default ${wmemDefault} B)`);
    // A connection whose answers fit pays no setsockopt (listeners.ts, sizeWhenFull).
    if (wmemDefault * 2 < expected) t.true(small[0].tb < expected, `tb ${small[0].tb} B stays the default while it has not filled`);
    // Fill it: the client reads nothing while the echo's bytes come back, until the server's end holds a queue.
    s.pause();
    const big = randomBytes(4 * 1024 * 1024);
    s.write(big);
    await waitUntil(() => (serverUnixEnds(server.uds)[0]?.queued ?? 0) > 64 * 1024, "the server's end of the socket holds a queue", 30_000);
    const back = readExactly(s, big.length, 60_000);
    s.resume();
    t.true((await back).equals(big), 'the echo comes back whole');
    const sizes = serverUnixEnds(server.uds);
    t.log(`ss: after a filled buffer, tb ${sizes.map((e) => e.tb).join(', ')} B`);
    t.true(sizes[0].tb >= expected, `tb ${sizes[0].tb} B, expected at least ${expected} B`);
  },
);

test.serial('CONNECT: 64 MiB control plane -> node arrives intact (sha256)', async (t) => {
  const { server, payload } = t.context;
  const sink = await startSinkBackend(t, BIG);
  const s = await tunnelThrough(t, server, sink.address);
  const answer = readToEnd(s, 60_000);
  await writeAll(s, payload);
  t.is((await answer).toString('latin1'), sha256(payload));
});

test.serial('CONNECT: 64 MiB node -> control plane arrives intact (sha256)', async (t) => {
  const { server, payload } = t.context;
  const source = await startSourceBackend(t, payload);
  const s = await tunnelThrough(t, server, source.address);
  const got = await readToEnd(s, 60_000);
  t.is(got.length, BIG);
  t.is(sha256(got), sha256(payload));
});

test.serial('CONNECT: 64 MiB echoed, both directions at once', async (t) => {
  const { server, payload } = t.context;
  const echo = await startEchoBackend(t);
  const s = await tunnelThrough(t, server, echo.address);
  const reading = readExactly(s, BIG, 60_000);
  await writeAll(s, payload);
  const back = await reading;
  t.is(sha256(back), sha256(payload));
});

test.serial('gRPC frontend (Kanal client): 64 MiB each way intact (sha256)', async (t) => {
  const { server, payload } = t.context;
  const sink = await startSinkBackend(t, BIG);
  const up = await grpcDial(grpcJsTransport, `unix://${server.uds}`, sink.address, { kanal: true });
  up.conn.on('error', () => undefined);
  t.teardown(() => up.close());
  const answer = readToEnd(up.conn as net.Socket, 60_000);
  await writeAll(up.conn, payload);
  t.is((await answer).toString('latin1'), sha256(payload));

  const source = await startSourceBackend(t, payload);
  const down = await grpcDial(grpcJsTransport, `unix://${server.uds}`, source.address, { kanal: true });
  down.conn.on('error', () => undefined);
  t.teardown(() => down.close());
  const got = await readToEnd(down.conn as net.Socket, 60_000);
  t.is(sha256(got), sha256(payload));
});

test.serial('gRPC frontend (upstream-style grpc-js client): 64 MiB node -> control plane intact', async (t) => {
  const { server, payload } = t.context;
  const source = await startSourceBackend(t, payload);
  const stream = frontendProxyStream(t, server);
  const dial = await stream.dial(source.address);
  t.is(dial.error, '');
  const got = await stream.read(dial.connectID, BIG, 60_000);
  t.is(sha256(got), sha256(payload));
  stream.close();
});

// An upstream-style client has no per-connection windows: the server holds
// back its stream (one connection per stream) while the node side reads slowly.
test.serial('gRPC frontend (upstream-style grpc-js client): 32 MiB to a node backend that reads slowly arrives intact', async (t) => {
  const { server, payload } = t.context;
  const size = 32 * 1024 * 1024;
  const data = payload.subarray(0, size);
  // The backend reads nothing until the sender is done or has been held
  // back (no progress) for a second: back-pressure, as a correct proxy applies.
  let written = 0;
  let finished = false;
  const release = (async () => {
    let last = -1;
    let still = 0;
    for (let i = 0; i < 600 && !finished; i++) {
      await sleep(100);
      still = written === last ? still + 1 : 0;
      last = written;
      if (still >= 10) return;
    }
  })();
  const sink = await startSinkBackend(t, size, { stallUntil: release });
  const stream = frontendProxyStream(t, server);
  const dial = await stream.dial(sink.address);
  t.is(dial.error, '');
  const answer = stream.read(dial.connectID, 64, 60_000);
  answer.catch(() => undefined);
  const CHUNK = 32 * 1024;
  try {
    for (; written < size; written += CHUNK) {
      const closed = stream.closedByServer(dial.connectID);
      if (closed)
        t.fail(
          `the server closed the connection after ${written} bytes: ${PacketType[closed.type]} ${'error' in closed ? closed.error : ''}`,
        );
      if (closed) return;
      await stream.send({ type: PacketType.DATA, connectID: dial.connectID, error: '', data: data.subarray(written, written + CHUNK) });
    }
  } finally {
    finished = true;
  }
  t.is((await answer).toString('latin1'), sha256(data));
  stream.close();
});

test.serial('CONNECT: 200 concurrent connections each echo their own data', async (t) => {
  const { server } = t.context;
  const echo = await startEchoBackend(t);
  const N = 200;
  const sockets: net.Socket[] = [];
  t.teardown(() => sockets.forEach((s) => s.destroy()));
  const results = await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const s = await connectThrough(server, echo.address, 30_000);
      sockets.push(s);
      // Distinct content and length per connection: a mix-up cannot pass.
      const data = Buffer.concat([Buffer.from(`connection ${i}:`), randomBytes(16 * 1024 + i * 97)]);
      const ok = await echoRoundTrip(s, data, 30_000);
      s.end();
      return ok;
    }),
  );
  t.is(results.filter((ok) => ok).length, N);
  t.is(echo.accepted(), N);
  // Every backend connection is released once the clients are done.
  t.true(await eventually(() => echo.open() === 0, 15_000), `${echo.open()} backend connections still open`);
});

test.serial('gRPC frontend: 200 concurrent connections over 4 streams each echo their own data', async (t) => {
  const { server } = t.context;
  const echo = await startEchoBackend(t);
  const streams = Array.from({ length: 4 }, () => frontendProxyStream(t, server));
  const N = 200;
  const results = await Promise.all(
    Array.from({ length: N }, async (_, i) => {
      const stream = streams[i % streams.length];
      const dial = await stream.dial(echo.address, 30_000);
      if (dial.error) return false;
      const data = Buffer.concat([Buffer.from(`stream ${i % 4} connection ${i}:`), randomBytes(8 * 1024 + i * 61)]);
      const same = await stream.echoes(dial.connectID, data, 30_000);
      const closed = await stream.closeConnection(dial.connectID, 15_000);
      return same && closed.error === '';
    }),
  );
  t.is(results.filter((ok) => ok).length, N);
  t.is(echo.accepted(), N);
  t.true(await eventually(() => echo.open() === 0, 15_000), `${echo.open()} backend connections still open`);
  for (const s of streams) s.close();
});
