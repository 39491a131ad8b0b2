/**
 * Edges of the node:http2 gRPC transport: framing and header helpers, and the
 * wire behaviour seen by raw HTTP/2 peers (what grpc-go would see): Trailers-
 * Only refusals, grpc-timeout, compressed or split messages, bad statuses,
 * garbage connections, sniffed-and-unshifted prefaces, graceful close.
 */
import test from 'ava';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http2, { constants as h2c, type ClientHttp2Stream, type IncomingHttpHeaders } from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { h2Transport, createH2Channel, createH2Server, H2PacketStream } from '../../src/transport/h2/index.js';
import { framePacket, MessageParser } from '../../src/transport/h2/framing.js';
import {
  decodeGrpcMessage,
  encodeGrpcMessage,
  formatGrpcTimeout,
  metadataFromRawHeaders,
  parseGrpcTimeout,
} from '../../src/transport/h2/grpc-headers.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import { GrpcStatus, GrpcStatusError, type GrpcServerTransport, type StreamHandlers } from '../../src/transport/transport.js';
import { decodePacket, encodePacket } from '../../src/wire/codec.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT } from '../../src/wire/metadata.js';
import { activeResources, listenTls, listenUnix, resourcesBackTo, tempDir, throwawayTls, type Listener } from '../helpers/grpc-js-peer.js';

// ---------- framing ----------

test('framePacket: DATA header + payload equal encodePacket', (t) => {
  const cases: Packet[] = [];
  for (const size of [0, 1, 1023, 1024, 1025, 16384, 32768, 70000, 300000]) {
    for (const connectID of [0, 1, 127, 128, 300, 2 ** 31, 2 ** 40, Number.MAX_SAFE_INTEGER]) {
      for (const error of ['', 'x', 'é'.repeat(100)]) {
        cases.push({ type: PacketType.DATA, connectID, error, data: crypto.randomBytes(size) });
      }
    }
  }
  cases.push({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'a:1', random: -5n });
  cases.push({ type: PacketType.DRAIN });
  for (const p of cases) {
    const parts = framePacket(p);
    const all = Buffer.concat(parts);
    const body = encodePacket(p);
    t.is(all[0], 0);
    t.is(all.readUInt32BE(1), body.length);
    t.true(all.subarray(5).equals(body));
    if (p.type === PacketType.DATA && p.data.length >= 1024) {
      t.is(parts.length, 2);
      t.is(parts[1], p.data, 'payload is not copied');
    }
  }
});

function frames(bodies: Buffer[]): Buffer {
  return Buffer.concat(
    bodies.map((b) => {
      const h = Buffer.alloc(5);
      h.writeUInt32BE(b.length, 1);
      return Buffer.concat([h, b]);
    }),
  );
}

test('MessageParser: any chunking yields the same messages; whole messages are views', (t) => {
  const bodies = [0, 1, 5, 100, 16384, 40000, 3].map((n) => crypto.randomBytes(n));
  const wire = frames(bodies);
  for (let round = 0; round < 200; round++) {
    const parser = new MessageParser(1 << 20);
    const got: Buffer[] = [];
    let off = 0;
    let errors = 0;
    while (off < wire.length) {
      const n = round === 0 ? wire.length : 1 + Math.floor(Math.random() * (round < 20 ? 7 : 30000));
      const chunk = wire.subarray(off, off + n);
      if (parser.push(chunk, (m) => (got.push(Buffer.from(m)), true)) !== null) errors++;
      off += n;
    }
    t.is(errors, 0);
    t.false(parser.midMessage);
    t.true(got.length === bodies.length && got.every((g, i) => g.equals(bodies[i])));
  }
  // One chunk: every message is a view into it.
  const parser = new MessageParser(1 << 20);
  const views: Uint8Array[] = [];
  parser.push(wire, (m) => (views.push(m), true));
  t.true(views.every((v) => v.buffer === wire.buffer));
});

test('MessageParser: DATA spread over chunks is streamed as payload slices, other messages assembled', (t) => {
  const packets: Packet[] = [];
  for (const size of [0, 10, 1024, 16384, 65536, 70000]) {
    for (const connectID of [0, 1, 300, 2 ** 40]) {
      for (const error of ['', 'boom']) packets.push({ type: PacketType.DATA, connectID, error, data: crypto.randomBytes(size) });
    }
  }
  packets.push({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'x'.repeat(40000), random: 7n });
  const wire = Buffer.concat(packets.flatMap((p) => framePacket(p)));
  const expected = new Map<number, Buffer>();
  for (const p of packets)
    if (p.type === PacketType.DATA) expected.set(p.connectID, Buffer.concat([expected.get(p.connectID) ?? Buffer.alloc(0), p.data]));
  for (let round = 0; round < 100; round++) {
    const parser = new MessageParser(1 << 20);
    // Each connection's bytes, from whole messages and slices in arrival order.
    const joined = new Map<number, Buffer[]>();
    const add = (id: number, b: Uint8Array): void => void (joined.get(id) ?? joined.set(id, []).get(id)!).push(Buffer.from(b));
    let other: Packet | undefined;
    let slices = 0;
    let off = 0;
    while (off < wire.length) {
      const n = round === 0 ? wire.length : 1 + Math.floor(Math.random() * (round < 20 ? 40 : 30000));
      const err = parser.push(
        wire.subarray(off, off + n),
        (m) => {
          const p = decodePacket(m);
          if (p.type === PacketType.DATA) add(p.connectID, p.data);
          else other = p;
          return true;
        },
        (connectID, slice) => {
          t.true(slice.buffer === wire.buffer, 'slices are views');
          slices++;
          add(connectID, slice);
          return true;
        },
      );
      t.is(err, null);
      off += n;
    }
    t.false(parser.midMessage);
    t.is(other?.type, PacketType.DIAL_REQ);
    if (round > 0) t.true(slices > 0);
    for (const [id, b] of expected) t.true(Buffer.concat(joined.get(id) ?? []).equals(b), `payload of connectID ${id}, round ${round}`);
  }
});

test('MessageParser: oversized refused at the prefix, compressed refused', (t) => {
  const p1 = new MessageParser(1000);
  const prefix = Buffer.from([0, 0x7f, 0xff, 0xff, 0xff]);
  const e1 = p1.push(prefix, () => t.fail());
  t.is(e1?.code, GrpcStatus.RESOURCE_EXHAUSTED);
  t.regex(e1!.message, /2147483647 vs\. 1000/);
  const p2 = new MessageParser(1000);
  const e2 = p2.push(Buffer.from([1, 0, 0, 0, 1, 0]), () => t.fail());
  t.is(e2?.code, GrpcStatus.INTERNAL);
  t.regex(e2!.message, /compressed/);
  // The message handler can stop the parser.
  const p3 = new MessageParser(1000);
  let n = 0;
  p3.push(frames([Buffer.alloc(1), Buffer.alloc(1)]), () => (n++, false));
  t.is(n, 1);
});

test('grpc-message percent-encoding and grpc-timeout', (t) => {
  for (const s of ['', 'plain', '100%', 'ünïcødé ✓', 'tab\tnew\nline', '%41%', '\u0000', '😀']) {
    const e = encodeGrpcMessage(s);
    t.regex(e, /^[\x20-\x7e]*$/);
    t.is(decodeGrpcMessage(e), s);
  }
  t.is(encodeGrpcMessage('a%b'), 'a%25b');
  t.is(encodeGrpcMessage('ü'), '%C3%BC');
  t.is(decodeGrpcMessage('a%20b%ZZ%4'), 'a b%ZZ%4');
  t.is(decodeGrpcMessage('%c3%bc'), 'ü');
  t.is(parseGrpcTimeout('100m'), 100);
  t.is(parseGrpcTimeout('2S'), 2000);
  t.is(parseGrpcTimeout('1H'), 3_600_000);
  t.is(parseGrpcTimeout('5M'), 300_000);
  t.is(parseGrpcTimeout('1000u'), 1);
  t.is(parseGrpcTimeout('1000000n'), 1);
  t.is(parseGrpcTimeout('123456789m'), undefined);
  t.is(parseGrpcTimeout('10'), undefined);
  t.is(parseGrpcTimeout('-1m'), undefined);
  t.is(parseGrpcTimeout(formatGrpcTimeout(1500)), 1500);
  t.is(formatGrpcTimeout(1e12), '277778H');
});

test('metadataFromRawHeaders: repeated keys, -bin split and normalised, reserved skipped', (t) => {
  const md = metadataFromRawHeaders([
    ':path',
    '/x',
    'content-type',
    'application/grpc',
    'te',
    'trailers',
    'grpc-timeout',
    '1S',
    'agentid',
    'a',
    'x-k',
    '1',
    'x-k',
    '2',
    'x-bin',
    'AAEC,/w',
    'user-agent',
    'ua',
  ]);
  t.deepEqual([...md.keys()].sort(), ['agentid', 'user-agent', 'x-bin', 'x-k']);
  t.deepEqual(md.get('x-k'), ['1', '2']);
  t.deepEqual(md.get('x-bin'), ['AAEC', '/w==']);
});

// ---------- harness ----------

interface Served {
  server: GrpcServerTransport;
  listener: Listener;
  dir: string;
  close(): Promise<void>;
}

async function serve(handlers: StreamHandlers, max = 4 * 1024 * 1024): Promise<Served> {
  const server = createH2Server(handlers, { maxReceiveMessageBytes: max });
  const dir = tempDir();
  const listener = await listenUnix(dir, (s) => server.injectConnection(s));
  return {
    server,
    listener,
    dir,
    async close() {
      await server.close(100);
      await listener.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

function socketPath(target: string): string {
  return target.slice('unix://'.length);
}

/** A raw node:http2 client session on a Unix socket. */
function rawClient(target: string): http2.ClientHttp2Session {
  const session = http2.connect('http://localhost', { createConnection: () => net.connect(socketPath(target)) });
  session.on('error', () => {});
  return session;
}

const GRPC_HEADERS = {
  ':method': 'POST',
  ':path': AGENT_SERVICE_CONNECT,
  'content-type': 'application/grpc',
  te: 'trailers',
};

interface RawResult {
  headers: IncomingHttpHeaders;
  headersEndStream: boolean;
  trailers?: IncomingHttpHeaders;
  data: Buffer;
  rstCode?: number;
}

/** Collects the response of a raw stream until it closes. */
function collect(req: ClientHttp2Stream): Promise<RawResult> {
  return new Promise<RawResult>((resolve) => {
    const out: RawResult = { headers: {}, headersEndStream: false, data: Buffer.alloc(0) };
    const chunks: Buffer[] = [];
    req.on('response', (h, flags) => {
      out.headers = h;
      out.headersEndStream = (flags & h2c.NGHTTP2_FLAG_END_STREAM) !== 0;
    });
    req.on('response', (_h, flags) => {
      // Like a gRPC client, close our half once the server sent its status.
      if ((flags & h2c.NGHTTP2_FLAG_END_STREAM) !== 0) req.end();
    });
    req.on('trailers', (h: IncomingHttpHeaders) => {
      out.trailers = h;
      req.end();
    });
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('error', () => {});
    req.on('close', () => {
      out.data = Buffer.concat(chunks);
      out.rstCode = req.rstCode;
      resolve(out);
    });
  });
}

function message(p: Packet | Buffer, flags = 0): Buffer {
  const body = Buffer.isBuffer(p) ? p : encodePacket(p);
  const h = Buffer.alloc(5);
  h[0] = flags;
  h.writeUInt32BE(body.length, 1);
  return Buffer.concat([h, body]);
}

function watchClose(stream: PacketStream): { count: () => number; result: Promise<Error | undefined> } {
  let n = 0;
  const result = new Promise<Error | undefined>((resolve) =>
    stream.on('close', (err) => {
      n++;
      resolve(err);
    }),
  );
  return { count: () => n, result };
}

// ---------- server, seen by a raw HTTP/2 client ----------

test.serial('reject() is one HEADERS frame with END_STREAM: :status 200, content-type, grpc-status, grpc-message', async (t) => {
  const baseline = activeResources();
  const s = await serve({ agentConnect: (inc) => inc.reject(GrpcStatus.UNAUTHENTICATED, 'no 100% ✓') });
  const session = rawClient(s.listener.target);
  const r = await collect(session.request(GRPC_HEADERS));
  t.true(r.headersEndStream);
  t.is(Number(r.headers[':status']), 200);
  t.is(r.headers['content-type'], 'application/grpc');
  t.is(r.headers['grpc-status'], '16');
  t.is(r.headers['grpc-message'], 'no 100%25 %E2%9C%93');
  t.is(r.trailers, undefined);
  session.close();
  await s.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('response headers, packets, then trailers grpc-status 0 on end()', async (t) => {
  const s = await serve({
    agentConnect: (inc) => {
      const st = inc.accept({ serverid: 'S' });
      st.send({ type: PacketType.DRAIN });
      st.end();
    },
  });
  const session = rawClient(s.listener.target);
  const req = session.request(GRPC_HEADERS);
  const r = await collect(req);
  t.is(Number(r.headers[':status']), 200);
  t.is(r.headers['content-type'], 'application/grpc');
  t.is(r.headers['serverid'], 'S');
  t.false(r.headersEndStream);
  t.true(r.data.equals(message({ type: PacketType.DRAIN })));
  t.is(r.trailers?.['grpc-status'], '0');
  t.is(r.trailers?.['grpc-message'], undefined);
  session.close();
  await s.close();
});

test.serial(
  'malformed requests: GET → 405, bad content-type → 415, grpc-encoding gzip → UNIMPLEMENTED, bad grpc-timeout → INTERNAL',
  async (t) => {
    const s = await serve({ agentConnect: (inc) => void inc.accept({}) });
    const session = rawClient(s.listener.target);
    const get = await collect(session.request({ ':method': 'GET', ':path': AGENT_SERVICE_CONNECT }));
    t.is(Number(get.headers[':status']), 405);
    const ct = await collect(session.request({ ...GRPC_HEADERS, 'content-type': 'application/json' }));
    t.is(Number(ct.headers[':status']), 415);
    t.is(ct.headers['grpc-status'], String(GrpcStatus.INTERNAL));
    const gz = await collect(session.request({ ...GRPC_HEADERS, 'grpc-encoding': 'gzip' }));
    t.is(gz.headers['grpc-status'], String(GrpcStatus.UNIMPLEMENTED));
    t.is(gz.headers['grpc-accept-encoding'], 'identity');
    const to = await collect(session.request({ ...GRPC_HEADERS, 'grpc-timeout': 'soon' }));
    t.is(to.headers['grpc-status'], String(GrpcStatus.INTERNAL));
    const plus = await collect(session.request({ ...GRPC_HEADERS, 'content-type': 'application/grpc+proto', 'grpc-timeout': '50m' }));
    t.is(Number(plus.headers[':status']), 200);
    t.is(plus.trailers?.['grpc-status'], String(GrpcStatus.DEADLINE_EXCEEDED));
    session.close();
    await s.close();
  },
);

test.serial('grpc-timeout is honoured: accepted stream ends with DEADLINE_EXCEEDED; unaccepted one is refused', async (t) => {
  const baseline = activeResources();
  let serverSide: Promise<Error | undefined> | undefined;
  const s = await serve({
    agentConnect: (inc) => {
      if (inc.metadata.get('x-accept')?.[0] === 'yes') serverSide = watchClose(inc.accept({})).result;
      // else: never answer
    },
  });
  const session = rawClient(s.listener.target);
  const started = Date.now();
  const r1 = await collect(session.request({ ...GRPC_HEADERS, 'grpc-timeout': '200m', 'x-accept': 'yes' }));
  const elapsed = Date.now() - started;
  // Not before the deadline (load can only make it later); the status below says it was the deadline.
  t.true(elapsed >= 190, `took ${elapsed} ms`);
  t.is(Number(r1.headers[':status']), 200);
  t.is(r1.trailers?.['grpc-status'], String(GrpcStatus.DEADLINE_EXCEEDED));
  const err = await serverSide!;
  t.is((err as GrpcStatusError).code, GrpcStatus.DEADLINE_EXCEEDED);
  const r2 = await collect(session.request({ ...GRPC_HEADERS, 'grpc-timeout': '100000u' }));
  t.true(r2.headersEndStream);
  t.is(r2.headers['grpc-status'], String(GrpcStatus.DEADLINE_EXCEEDED));
  session.close();
  await s.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('messages split across DATA frames and packed in one frame; malformed protobuf → invalid, stream goes on', async (t) => {
  const got: Packet[] = [];
  const invalid: string[] = [];
  let done!: () => void;
  const allIn = new Promise<void>((r) => (done = r));
  const s = await serve({
    agentConnect: (inc) => {
      const st = inc.accept({});
      st.on('packet', (p) => {
        got.push(p);
        if (got.length === 4) done();
      });
      st.on('invalid', (why) => invalid.push(why));
    },
  });
  const session = rawClient(s.listener.target);
  const req = session.request(GRPC_HEADERS);
  const r = collect(req);
  const big: Packet = { type: PacketType.DATA, connectID: 3, error: '', data: crypto.randomBytes(50_000) };
  const wire = Buffer.concat([
    message({ type: PacketType.DRAIN }),
    message(Buffer.from([0xff, 0xff, 0xff])), // not a Packet
    message(big),
    message({ type: PacketType.CLOSE_REQ, connectID: 3 }),
    message({ type: PacketType.DIAL_CLS, random: 5n }),
  ]);
  // Dribble it out in tiny writes (one DATA frame each), then the rest at once.
  let off = 0;
  for (; off < 2000; off += 3) req.write(wire.subarray(off, off + 3));
  req.write(wire.subarray(off));
  await allIn;
  t.is(invalid.length, 1);
  t.deepEqual(
    got.map((p) => p.type),
    [PacketType.DRAIN, PacketType.DATA, PacketType.CLOSE_REQ, PacketType.DIAL_CLS],
  );
  t.true(Buffer.from((got[1] as typeof big).data).equals(Buffer.from(big.data)));
  req.end();
  const res = await r;
  t.is(res.trailers?.['grpc-status'], '0');
  session.close();
  await s.close();
});

test.serial('packets sent right after accept() reach a client that attaches listeners after await', async (t) => {
  const s = await serve({
    agentConnect: (inc) => {
      const st = inc.accept({ serverid: 'S' });
      for (let i = 0; i < 50; i++) st.send({ type: PacketType.CLOSE_REQ, connectID: i + 1 });
    },
  });
  for (let round = 0; round < 20; round++) {
    const ch = createH2Channel({ target: s.listener.target });
    const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
    await Promise.resolve(); // a few microtask turns later still
    const ids: number[] = [];
    await new Promise<void>((resolve) =>
      st.on('packet', (p) => {
        if (p.type === PacketType.CLOSE_REQ) ids.push(p.connectID);
        if (ids.length === 50) resolve();
      }),
    );
    t.deepEqual(
      ids,
      Array.from({ length: 50 }, (_, i) => i + 1),
    );
    st.destroy();
    ch.close();
  }
  await s.close();
});

test.serial('client: the status is delivered after every packet sent before it, even when the client was paused', async (t) => {
  const s = await serve({
    agentConnect: (inc) => {
      const st = inc.accept({});
      // 600 kB: fits the stream window, so all of it and the trailers arrive while paused.
      for (let i = 0; i < 30; i++) st.send({ type: PacketType.DATA, connectID: i + 1, error: '', data: Buffer.alloc(20_000) });
      st.end();
    },
  });
  const ch = createH2Channel({ target: s.listener.target });
  const st = (await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000)) as H2PacketStream;
  st.pause();
  await new Promise((r) => setTimeout(r, 300));
  t.false(st.closed);
  const events: string[] = [];
  st.on('packet', (p) => events.push(`p${(p as { connectID: number }).connectID}`));
  const closed = new Promise<Error | undefined>((r) => st.on('close', (e: Error | undefined) => (events.push('close'), r(e))));
  st.resume();
  t.is(await closed, undefined);
  t.deepEqual(events, [...Array.from({ length: 30 }, (_, i) => `p${i + 1}`), 'close']);
  ch.close();
  await s.close();
});

test.serial('compressed message → INTERNAL; oversized → RESOURCE_EXHAUSTED before it is buffered', async (t) => {
  const s = await serve({ agentConnect: (inc) => void inc.accept({}) }, 1024);
  const session = rawClient(s.listener.target);
  const req1 = session.request(GRPC_HEADERS);
  const r1 = collect(req1);
  req1.write(message(Buffer.from([8, 6]), 1));
  t.is((await r1).trailers?.['grpc-status'], String(GrpcStatus.INTERNAL));
  const req2 = session.request(GRPC_HEADERS);
  const r2 = collect(req2);
  // Only the prefix announcing 1 GiB: refused without waiting for the body.
  req2.write(Buffer.from([0, 0x40, 0, 0, 0]));
  const res2 = await r2;
  t.is(res2.trailers?.['grpc-status'], String(GrpcStatus.RESOURCE_EXHAUSTED));
  t.regex(decodeGrpcMessage(String(res2.trailers?.['grpc-message'])), /larger than max/);
  session.close();
  await s.close();
});

// ---------- client, against raw HTTP/2 servers ----------

async function rawServer(onStream: (stream: http2.ServerHttp2Stream, headers: IncomingHttpHeaders) => void): Promise<{
  target: string;
  close(): Promise<void>;
}> {
  const dir = tempDir();
  const file = path.join(dir, 's.sock');
  const server = http2.createServer();
  server.on('stream', onStream);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (s) => {
    sessions.add(s);
    s.on('close', () => sessions.delete(s));
  });
  await new Promise<void>((r) => server.listen(file, r));
  return {
    target: `unix://${file}`,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sessions) s.destroy();
        server.close(() => {
          fs.rmSync(dir, { recursive: true, force: true });
          resolve();
        });
      }),
  };
}

test.serial('client request headers and status mapping from odd servers', async (t) => {
  const baseline = activeResources();
  let seen: IncomingHttpHeaders | undefined;
  const srv = await rawServer((stream, headers) => {
    stream.on('error', () => {});
    const mode = headers['x-mode'];
    seen = headers;
    switch (mode) {
      case '503':
        stream.respond({ ':status': 503 }, { endStream: true });
        break;
      case '404':
        stream.respond({ ':status': 404 }, { endStream: true });
        break;
      case 'html':
        stream.respond({ ':status': 200, 'content-type': 'text/html' }, { endStream: true });
        break;
      case 'refuse':
        stream.close(h2c.NGHTTP2_REFUSED_STREAM);
        break;
      case 'silent':
        break;
      case 'no-status':
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
        stream.on('wantTrailers', () => stream.sendTrailers({ 'x-nothing': '1' }));
        stream.end();
        break;
      case 'message':
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' }, { waitForTrailers: true });
        stream.on('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '9', 'grpc-message': 'a%20b%ZZ%' }));
        stream.end(message({ type: PacketType.DRAIN }));
        break;
      case 'eager':
        // Headers and the first messages in one write, as grpc-go often does.
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
        stream.write(Buffer.concat(Array.from({ length: 20 }, (_, i) => message({ type: PacketType.CLOSE_REQ, connectID: i + 1 }))));
        break;
      case 'rst-after-headers':
        stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
        setTimeout(() => stream.close(h2c.NGHTTP2_INTERNAL_ERROR), 20);
        break;
    }
  });
  const ch = createH2Channel({ target: srv.target });
  const code = async (mode: string, timeout = 2000): Promise<[GrpcStatus, string]> => {
    const e = await t.throwsAsync(ch.openStream(AGENT_SERVICE_CONNECT, { 'x-mode': mode }, timeout));
    t.true(e instanceof GrpcStatusError, `${mode}: ${String(e)}`);
    return [(e as GrpcStatusError).code, e.message];
  };
  t.is((await code('503'))[0], GrpcStatus.UNAVAILABLE);
  t.is(seen?.[':method'], 'POST');
  t.is(seen?.['content-type'], 'application/grpc');
  t.is(seen?.te, 'trailers');
  t.is(seen?.['grpc-timeout'], undefined);
  t.regex(String(seen?.['user-agent']), /kanal/);
  t.is((await code('404'))[0], GrpcStatus.UNIMPLEMENTED);
  t.is((await code('html'))[0], GrpcStatus.UNKNOWN);
  t.is((await code('refuse'))[0], GrpcStatus.UNAVAILABLE);
  const started = Date.now();
  t.is((await code('silent', 150))[0], GrpcStatus.DEADLINE_EXCEEDED);
  t.true(Date.now() - started >= 140, 'not before its timeout');

  const ns = await ch.openStream(AGENT_SERVICE_CONNECT, { 'x-mode': 'no-status' }, 2000);
  const nsErr = await watchClose(ns).result;
  t.is((nsErr as GrpcStatusError).code, GrpcStatus.UNKNOWN);

  const m = await ch.openStream(AGENT_SERVICE_CONNECT, { 'x-mode': 'message' }, 2000);
  const packets: Packet[] = [];
  m.on('packet', (p) => packets.push(p));
  const mErr = await watchClose(m).result;
  t.is(packets.length, 1);
  t.is((mErr as GrpcStatusError).code, GrpcStatus.FAILED_PRECONDITION);
  t.is(mErr?.message, 'a b%ZZ%');

  for (let round = 0; round < 10; round++) {
    const eager = await ch.openStream(AGENT_SERVICE_CONNECT, { 'x-mode': 'eager' }, 2000);
    await Promise.resolve();
    const ids: number[] = [];
    await new Promise<void>((resolve) =>
      eager.on('packet', (p) => {
        if (p.type === PacketType.CLOSE_REQ) ids.push(p.connectID);
        if (ids.length === 20) resolve();
      }),
    );
    t.is(ids.length, 20);
    eager.destroy();
  }

  const rst = await ch.openStream(AGENT_SERVICE_CONNECT, { 'x-mode': 'rst-after-headers' }, 2000);
  const w = watchClose(rst);
  t.is(((await w.result) as GrpcStatusError).code, GrpcStatus.INTERNAL);
  await new Promise((r) => setTimeout(r, 30));
  t.is(w.count(), 1);

  ch.close();
  await srv.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('client: nothing listening → UNAVAILABLE; closed channel → UNAVAILABLE', async (t) => {
  const dir = tempDir();
  const ch = createH2Channel({ target: `unix://${path.join(dir, 'nothing.sock')}` });
  const e = await t.throwsAsync(ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000));
  t.is((e as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.regex(e.message, /ENOENT/);
  const tcp = createH2Channel({ target: '127.0.0.1:1' });
  const e2 = await t.throwsAsync(tcp.openStream(AGENT_SERVICE_CONNECT, {}, 2000));
  t.is((e2 as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  ch.close();
  tcp.close();
  const e3 = await t.throwsAsync(ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000));
  t.is((e3 as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  fs.rmSync(dir, { recursive: true, force: true });
});

test.serial('client: TLS refuses an untrusted server and a server without ALPN h2', async (t) => {
  const files = await throwawayTls();
  const other = await throwawayTlsOtherCa();
  // Server presents a certificate from another CA.
  const l1 = await listenTlsWith({ cert: other.cert, key: other.key, ALPNProtocols: ['h2'] });
  const c1 = createH2Channel({ target: l1.target, tls: { ca: files.ca } });
  const e1 = await t.throwsAsync(c1.openStream(AGENT_SERVICE_CONNECT, {}, 3000));
  t.is((e1 as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  // Right certificate, but only http/1.1 offered.
  const l2 = await listenTlsWith({ cert: files.serverCert, key: files.serverKey, ALPNProtocols: ['http/1.1'] });
  const c2 = createH2Channel({ target: l2.target, tls: { ca: files.ca } });
  const e2 = await t.throwsAsync(c2.openStream(AGENT_SERVICE_CONNECT, {}, 3000));
  t.is((e2 as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.regex(e2.message, /ALPN|HTTP\/2|protocol/i);
  c1.close();
  c2.close();
  await l1.close();
  await l2.close();
});

async function throwawayTlsOtherCa(): Promise<{ cert: string; key: string }> {
  const { createCertificateAuthority } = await import('../../kit/pki/certificate-authority.js');
  const ca = await createCertificateAuthority('other-ca');
  const leaf = await ca.issue({ commonName: 'x', dnsNames: ['localhost'], ipAddresses: ['127.0.0.1'], usage: 'server' });
  return { cert: leaf.certPem, key: leaf.keyPem };
}

async function listenTlsWith(opts: tls.TlsOptions): Promise<{ target: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = tls.createServer(opts, (s) => {
    sockets.add(s);
    s.on('error', () => {});
  });
  server.on('tlsClientError', () => {});
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    target: `127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

// ---------- server lifecycle ----------

async function echoRoundTrip(target: string, tlsOpts?: { ca: Buffer; cert: Buffer; key: Buffer }): Promise<boolean> {
  const ch = createH2Channel(tlsOpts ? { target, tls: tlsOpts } : { target });
  try {
    const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 3000);
    const back = new Promise<Packet>((r) => st.once('packet', r));
    st.send({ type: PacketType.CLOSE_REQ, connectID: 9 });
    const p = await back;
    st.end();
    await watchClose(st).result;
    return p.type === PacketType.CLOSE_REQ;
  } finally {
    ch.close();
  }
}

const echo: StreamHandlers = {
  agentConnect: (inc) => {
    const st = inc.accept({});
    st.on('packet', (p) => st.send(p));
  },
};

test.serial('garbage injected as connections: each is dropped, the server keeps serving', async (t) => {
  const baseline = activeResources();
  const s = await serve(echo);
  const file = socketPath(s.listener.target);
  const garbage: Buffer[] = [
    crypto.randomBytes(4096),
    Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'),
    Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), // preface, then nothing valid
    Buffer.concat([Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n'), crypto.randomBytes(1000)]),
    Buffer.from([0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5]), // a TLS ClientHello start
  ];
  const closed = garbage.map(
    (g) =>
      new Promise<void>((resolve) => {
        const c = net.connect(file, () => c.write(g));
        c.on('error', () => {});
        c.on('close', () => resolve());
        c.resume();
        // The preface-only one is dropped by the handshake timeout (10 s) at
        // the latest; end our side so the test does not wait for that.
        setTimeout(() => c.end(), 200);
      }),
  );
  t.true(await echoRoundTrip(s.listener.target));
  await Promise.all(closed);
  t.true(await echoRoundTrip(s.listener.target));
  await s.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('a connection whose first bytes were read and unshift()ed back is served (Unix and TLS)', async (t) => {
  const baseline = activeResources();
  const server = createH2Server(echo, { maxReceiveMessageBytes: 1 << 20 });
  const sniffAndInject = (socket: net.Socket): void => {
    const onReadable = (): void => {
      const head = socket.read(30) as Buffer | null; // more than the 24-byte preface
      if (head === null) return;
      socket.off('readable', onReadable);
      t.is(head.subarray(0, 3).toString(), 'PRI');
      socket.unshift(head);
      server.injectConnection(socket);
    };
    socket.on('readable', onReadable);
  };
  const dir = tempDir();
  const unix = await listenUnix(dir, sniffAndInject);
  t.true(await echoRoundTrip(unix.target));
  const files = await throwawayTls();
  const secure = await listenTls(files, sniffAndInject);
  t.true(await echoRoundTrip(secure.target, { ca: files.ca, cert: files.clientCert, key: files.clientKey }));
  await server.close(100);
  await unix.close();
  await secure.close();
  fs.rmSync(dir, { recursive: true, force: true });
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('close(graceMs): GOAWAY, no new streams, open streams finish within the grace', async (t) => {
  const baseline = activeResources();
  const s = await serve(echo);
  const ch = createH2Channel({ target: s.listener.target });
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  const w = watchClose(st);
  // A grace beyond the test's timeout: close() resolving at all shows it did not wait the grace out.
  const closing = s.server.close(600_000);
  await new Promise((r) => setTimeout(r, 50));
  // A new stream (same connection, which got GOAWAY) is refused.
  const e = await t.throwsAsync(ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000));
  t.is((e as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  // The existing one still works...
  const back = new Promise<Packet>((r) => st.once('packet', r));
  st.send({ type: PacketType.DRAIN });
  t.is((await back).type, PacketType.DRAIN);
  // ...and when it ends, close() resolves without waiting out the grace.
  st.end();
  t.is(await w.result, undefined);
  await closing;
  // Connections injected after close are dropped.
  const late = new net.Socket();
  let destroyed = false;
  late.on('close', () => (destroyed = true));
  s.server.injectConnection(late);
  await new Promise((r) => setImmediate(r));
  t.true(destroyed || late.destroyed);
  ch.close();
  await s.listener.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('close(graceMs): streams still open after the grace end with UNAVAILABLE', async (t) => {
  const baseline = activeResources();
  let serverSide: Promise<Error | undefined> | undefined;
  const s = await serve({
    agentConnect: (inc) => {
      serverSide = watchClose(inc.accept({})).result;
    },
  });
  const ch = createH2Channel({ target: s.listener.target });
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  const w = watchClose(st);
  const started = Date.now();
  await s.server.close(300);
  const took = Date.now() - started;
  t.true(took >= 290, `close took ${took} ms: not before its grace`);
  const err = await w.result;
  t.is((err as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.is(((await serverSide!) as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.is(w.count(), 1);
  ch.close();
  await s.listener.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('connection lost: both sides close once with UNAVAILABLE / an error', async (t) => {
  const baseline = activeResources();
  let serverSide: { count: () => number; result: Promise<Error | undefined> } | undefined;
  let ready!: () => void;
  const accepted = new Promise<void>((r) => (ready = r));
  const s = await serve({
    agentConnect: (inc) => {
      serverSide = watchClose(inc.accept({}));
      ready();
    },
  });
  const ch = createH2Channel({ target: s.listener.target });
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 2000);
  await accepted;
  const w = watchClose(st);
  for (const sock of s.listener.sockets) sock.destroy();
  t.is(((await w.result) as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
  t.true((await serverSide!.result) instanceof GrpcStatusError);
  await new Promise((r) => setTimeout(r, 50));
  t.is(w.count(), 1);
  t.is(serverSide!.count(), 1);
  // The channel makes a new connection for the next stream.
  t.true(await echoRoundTripOn(ch));
  ch.close();
  await s.close();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

async function echoRoundTripOn(ch: ReturnType<typeof createH2Channel>): Promise<boolean> {
  const st = await ch.openStream(AGENT_SERVICE_CONNECT, {}, 3000);
  st.end();
  return (await watchClose(st).result) === undefined;
}

test.after.always('no handles left behind', () => {
  const left = activeResources();
  if (left.some((r) => r !== 'PipeWrap' && r !== 'TTYWrap')) console.error('active resources after tests:', left);
});

test.serial('h2Transport satisfies the Transport interface', (t) => {
  t.is(typeof h2Transport.createServer, 'function');
  t.is(typeof h2Transport.createChannel, 'function');
});
