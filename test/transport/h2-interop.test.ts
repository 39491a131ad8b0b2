/**
 * The node:http2 transport against itself and against @grpc/grpc-js, in both
 * roles, over Unix sockets and mutual TLS: metadata, every packet type, bulk
 * data with hash checks, refusals, limits, 'close' once, no leaked handles.
 */
import test, { type ExecutionContext } from 'ava';
import crypto from 'node:crypto';
import fs from 'node:fs';
import { h2Transport } from '../../src/transport/h2/index.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import {
  GrpcStatus,
  GrpcStatusError,
  type ChannelOptions,
  type GrpcChannel,
  type GrpcServerTransport,
  type IncomingStream,
  type StreamHandlers,
  type Transport,
} from '../../src/transport/transport.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT, PROXY_SERVICE_PROXY } from '../../src/wire/metadata.js';
import * as grpc from '@grpc/grpc-js';
import { createH2Channel } from '../../src/transport/h2/index.js';
import type { Decoded } from '../../src/transport/decoded.js';
import {
  activeResources,
  agentService,
  createGrpcJsChannel,
  grpcJsPeerTransport,
  listenTls,
  openGrpcJsStream,
  listenUnix,
  resourcesBackTo,
  tempDir,
  throwawayTls,
  type Listener,
} from '../helpers/grpc-js-peer.js';
import { drainOrClose } from '../helpers/memory-stream.js';

interface Pairing {
  name: string;
  server: Transport;
  client: Transport;
  tls: boolean;
}

const pairings: Pairing[] = [
  { name: 'h2 server ⇄ h2 client, unix', server: h2Transport, client: h2Transport, tls: false },
  { name: 'h2 server ⇄ h2 client, TLS', server: h2Transport, client: h2Transport, tls: true },
  { name: 'h2 server ⇄ grpc-js client, unix', server: h2Transport, client: grpcJsPeerTransport, tls: false },
  { name: 'h2 server ⇄ grpc-js client, TLS', server: h2Transport, client: grpcJsPeerTransport, tls: true },
  { name: 'grpc-js server ⇄ h2 client, unix', server: grpcJsPeerTransport, client: h2Transport, tls: false },
  { name: 'grpc-js server ⇄ h2 client, TLS', server: grpcJsPeerTransport, client: h2Transport, tls: true },
];
const tlsPairings = pairings.filter((p) => p.tls);

interface Setup {
  server: GrpcServerTransport;
  channel: GrpcChannel;
  listener: Listener;
  teardown(): Promise<void>;
}

async function setup(p: Pairing, handlers: StreamHandlers, opts: { serverMax?: number; clientMax?: number } = {}): Promise<Setup> {
  const server = p.server.createServer(handlers, { maxReceiveMessageBytes: opts.serverMax ?? 4 * 1024 * 1024 });
  const dir = tempDir();
  let listener: Listener;
  let channelOpts: ChannelOptions;
  if (p.tls) {
    const files = await throwawayTls();
    listener = await listenTls(files, (s) => server.injectConnection(s));
    channelOpts = { target: listener.target, tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey } };
  } else {
    listener = await listenUnix(dir, (s) => server.injectConnection(s));
    channelOpts = { target: listener.target };
  }
  if (opts.clientMax !== undefined) channelOpts.maxReceiveMessageBytes = opts.clientMax;
  const channel = p.client.createChannel(channelOpts);
  let done: Promise<void> | undefined;
  const setupEntry: Setup = {
    server,
    channel,
    listener,
    teardown() {
      // Idempotent: tests call it to check handles, afterEach calls it when an assertion cut a test short.
      done ??= (async () => {
        live.delete(setupEntry);
        channel.close();
        await server.close(200);
        await listener.close();
        fs.rmSync(dir, { recursive: true, force: true });
      })();
      return done;
    },
  };
  live.add(setupEntry);
  return setupEntry;
}

/** Setups not torn down yet: a failed assertion must not leave servers keeping the worker alive. */
const live = new Set<Setup>();
test.afterEach.always(async () => {
  for (const s of [...live]) await s.teardown();
});

/** Counts 'close' events; `result` resolves with the first one's error. */
function watch(stream: PacketStream): { closes: () => number; result: Promise<Error | undefined> } {
  let n = 0;
  const result = new Promise<Error | undefined>((resolve) => {
    stream.on('close', (err) => {
      n++;
      resolve(err);
    });
  });
  return { closes: () => n, result };
}

interface Pausable {
  pause?: () => void;
  resume?: () => void;
}

const norm = (p: Packet): unknown => (p.type === PacketType.DATA ? { ...p, data: Buffer.from(p.data).toString('hex') } : p);

function everyPacket(): Packet[] {
  return [
    { type: PacketType.DIAL_REQ, protocol: 'tcp', address: '10.0.0.1:443', random: -1234567890123456789n },
    { type: PacketType.DIAL_REQ, protocol: '', address: '', random: 0n },
    { type: PacketType.DIAL_RSP, error: '', connectID: 7, random: 42n },
    { type: PacketType.DIAL_RSP, error: 'connection refused ✗', connectID: 0, random: 9223372036854775807n },
    { type: PacketType.CLOSE_REQ, connectID: 7 },
    { type: PacketType.CLOSE_RSP, error: 'gone', connectID: 7 },
    { type: PacketType.DATA, connectID: 7, error: '', data: new Uint8Array(0) },
    { type: PacketType.DATA, connectID: 7, error: '', data: crypto.randomBytes(10) },
    { type: PacketType.DATA, connectID: 2 ** 40, error: 'eof', data: crypto.randomBytes(100_000) },
    { type: PacketType.DATA, connectID: 0, error: '', data: crypto.randomBytes(2048) },
    { type: PacketType.DIAL_CLS, random: 99n },
    { type: PacketType.DRAIN },
    { type: PacketType.KANAL_WINDOW, connectID: 7, increment: 65536 },
    { type: PacketType.KANAL_HALF_CLOSE, connectID: 7 },
  ];
}

/** Sends every packet type over `stream` (whose peer echoes) and collects as many packets back. */
async function echoEveryPacket(stream: PacketStream): Promise<{ sent: Packet[]; got: Packet[] }> {
  const sent = everyPacket();
  const got: Packet[] = [];
  const allBack = new Promise<void>((resolve) =>
    stream.on('packet', (pkt) => {
      got.push(pkt);
      if (got.length === sent.length) resolve();
    }),
  );
  for (const pkt of sent) stream.send(pkt);
  await allBack;
  return { sent, got };
}

const BIN = Buffer.from([0, 1, 2, 0xfe, 0xff]);

for (const p of pairings) {
  test.serial(`${p.name}: metadata both ways, every packet type, end → OK, close once`, async (t) => {
    const baseline = activeResources();
    let serverSide: { closes: () => number; result: Promise<Error | undefined> } | undefined;
    let seenMetadata: IncomingStream['metadata'] | undefined;
    const s = await setup(p, {
      agentConnect: (inc) => {
        seenMetadata = inc.metadata;
        const stream = inc.accept({ serverid: 'server-1', servercount: '3', 'x-reply-bin': BIN.toString('base64') });
        serverSide = watch(stream);
        stream.on('packet', (pkt) => stream.send(pkt));
      },
    });
    const stream = await s.channel.openStream(
      AGENT_SERVICE_CONNECT,
      { agentid: 'agent-1', agentidentifiers: 'ipv4=10.0.0.1&host=node-1', 'x-trace-bin': BIN.toString('base64') },
      5000,
    );
    const clientSide = watch(stream);
    t.deepEqual(stream.metadata.get('serverid'), ['server-1']);
    t.deepEqual(stream.metadata.get('servercount'), ['3']);
    t.deepEqual(stream.metadata.get('x-reply-bin'), [BIN.toString('base64')]);
    t.is(stream.metadata.get('grpc-status'), undefined);
    t.deepEqual(seenMetadata?.get('agentid'), ['agent-1']);
    t.deepEqual(seenMetadata?.get('agentidentifiers'), ['ipv4=10.0.0.1&host=node-1']);
    t.deepEqual(seenMetadata?.get('x-trace-bin'), [BIN.toString('base64')]);
    t.is(seenMetadata?.get('content-type'), undefined);

    const { sent, got } = await echoEveryPacket(stream);
    t.deepEqual(got.map(norm), sent.map(norm));

    stream.end();
    t.is(await clientSide.result, undefined);
    t.is(await serverSide!.result, undefined);
    await new Promise((r) => setTimeout(r, 50));
    t.is(clientSide.closes(), 1);
    t.is(serverSide!.closes(), 1);
    t.true(stream.closed);

    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });
}

for (const p of tlsPairings) {
  test.serial(`${p.name}: 64 MiB of DATA each way with hash check`, async (t) => {
    const baseline = activeResources();
    const TOTAL = 64 * 1024 * 1024;
    const CHUNK = 32 * 1024;
    const serverHash = crypto.createHash('sha256');
    let serverResult: Promise<Error | undefined> | undefined;
    const s = await setup(p, {
      agentConnect: (inc) => {
        const stream = inc.accept({});
        serverResult = watch(stream).result;
        stream.on('packet', (pkt) => {
          if (pkt.type !== PacketType.DATA) return;
          serverHash.update(pkt.data);
          if (!stream.send(pkt)) {
            (stream as Pausable).pause?.();
            stream.once('drain', () => (stream as Pausable).resume?.());
          }
        });
      },
    });
    const stream = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
    const clientResult = watch(stream).result;
    const backHash = crypto.createHash('sha256');
    let back = 0;
    const allBack = new Promise<void>((resolve) =>
      stream.on('packet', (pkt) => {
        if (pkt.type !== PacketType.DATA) return;
        backHash.update(pkt.data);
        back += pkt.data.length;
        if (back === TOTAL) resolve();
      }),
    );
    const sentHash = crypto.createHash('sha256');
    const started = Date.now();
    for (let off = 0; off < TOTAL; off += CHUNK) {
      const data = crypto.randomFillSync(Buffer.allocUnsafe(CHUNK));
      sentHash.update(data);
      if (!stream.send({ type: PacketType.DATA, connectID: 1, error: '', data })) await drainOrClose(stream);
      t.false(stream.closed);
    }
    await allBack;
    const ms = Date.now() - started;
    t.log(`${p.name}: 64 MiB echoed in ${ms} ms (${((2 * TOTAL) / 1e6 / (ms / 1000)).toFixed(0)} MB/s both ways)`);
    const digest = sentHash.digest('hex');
    t.is(serverHash.digest('hex'), digest);
    t.is(backHash.digest('hex'), digest);
    stream.end();
    t.is(await clientResult, undefined);
    t.is(await serverResult!, undefined);
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });
}

const NASTY = 'bad token: 100% wrong — ünïcødé ✓ %41 \t\n end';

for (const p of pairings) {
  test.serial(`${p.name}: reject(UNAUTHENTICATED) reaches the client with its message`, async (t) => {
    const baseline = activeResources();
    const s = await setup(p, { agentConnect: (inc) => inc.reject(GrpcStatus.UNAUTHENTICATED, NASTY) });
    const err = await t.throwsAsync(s.channel.openStream(AGENT_SERVICE_CONNECT, { agentid: 'x' }, 5000));
    t.true(err instanceof GrpcStatusError);
    t.is((err as GrpcStatusError).code, GrpcStatus.UNAUTHENTICATED);
    t.is(err?.message, NASTY);
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });

  test.serial(`${p.name}: unknown path and unserved service → UNIMPLEMENTED`, async (t) => {
    const baseline = activeResources();
    const s = await setup(p, { agentConnect: (inc) => void inc.accept({}) });
    const e1 = await t.throwsAsync(s.channel.openStream('/Nope/Nothing', {}, 5000));
    t.is((e1 as GrpcStatusError).code, GrpcStatus.UNIMPLEMENTED);
    const e2 = await t.throwsAsync(s.channel.openStream(PROXY_SERVICE_PROXY, {}, 5000));
    t.is((e2 as GrpcStatusError).code, GrpcStatus.UNIMPLEMENTED);
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });

  test.serial(`${p.name}: oversized message → RESOURCE_EXHAUSTED, both directions`, async (t) => {
    const baseline = activeResources();
    const LIMIT = 64 * 1024;
    let serverResult: Promise<Error | undefined> | undefined;
    const s = await setup(
      p,
      {
        agentConnect: (inc) => {
          const stream = inc.accept({});
          serverResult = watch(stream).result;
          stream.on('packet', (pkt) => {
            // A DIAL_CLS asks the server to send an oversized message back.
            if (pkt.type === PacketType.DIAL_CLS) {
              stream.send({ type: PacketType.DATA, connectID: 1, error: '', data: Buffer.alloc(LIMIT * 2) });
            }
          });
        },
      },
      { serverMax: LIMIT, clientMax: LIMIT },
    );
    // Client → server.
    const a = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
    const aw = watch(a);
    a.send({ type: PacketType.DATA, connectID: 1, error: '', data: Buffer.alloc(LIMIT + 1) });
    const errA = await aw.result;
    t.true(errA instanceof GrpcStatusError, String(errA));
    t.is((errA as GrpcStatusError).code, GrpcStatus.RESOURCE_EXHAUSTED);
    const serverErr = await serverResult!;
    t.true(serverErr instanceof GrpcStatusError, String(serverErr));
    // (grpc-js reports its own refusal to the handler as a cancellation.)
    if (p.server === h2Transport) t.is((serverErr as GrpcStatusError).code, GrpcStatus.RESOURCE_EXHAUSTED);
    // Server → client.
    const b = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
    const bw = watch(b);
    b.send({ type: PacketType.DIAL_CLS, random: 1n });
    const errB = await bw.result;
    t.true(errB instanceof GrpcStatusError, String(errB));
    t.is((errB as GrpcStatusError).code, GrpcStatus.RESOURCE_EXHAUSTED);
    await new Promise((r) => setTimeout(r, 50));
    t.is(aw.closes(), 1);
    t.is(bw.closes(), 1);
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });

  test.serial(`${p.name}: server destroy(UNAVAILABLE) → client closes with that status`, async (t) => {
    const baseline = activeResources();
    const s = await setup(p, {
      agentConnect: (inc) => {
        const stream = inc.accept({});
        stream.on('packet', () => stream.destroy(new GrpcStatusError(GrpcStatus.UNAVAILABLE, 'going away')));
      },
    });
    const stream = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
    const w = watch(stream);
    stream.send({ type: PacketType.DRAIN });
    const err = await w.result;
    t.true(err instanceof GrpcStatusError, String(err));
    t.is((err as GrpcStatusError).code, GrpcStatus.UNAVAILABLE);
    t.is(err?.message, 'going away');
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });

  test.serial(`${p.name}: client destroy() → server sees CANCELLED`, async (t) => {
    const baseline = activeResources();
    let serverResult: Promise<Error | undefined> | undefined;
    let accepted!: () => void;
    const acceptedP = new Promise<void>((r) => (accepted = r));
    const s = await setup(p, {
      agentConnect: (inc) => {
        const stream = inc.accept({});
        serverResult = watch(stream).result;
        accepted();
      },
    });
    const stream = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
    const w = watch(stream);
    await acceptedP;
    stream.destroy();
    await w.result;
    const err = await serverResult!;
    // Node clients send END_STREAM before RST_STREAM(CANCEL); grpc-js servers
    // report the first as a clean end, the h2 server waits for the reset.
    if (p.server === h2Transport) {
      t.true(err instanceof GrpcStatusError, String(err));
      t.is((err as GrpcStatusError).code, GrpcStatus.CANCELLED);
    }
    t.is(w.closes(), 1);
    await s.teardown();
    t.deepEqual(await resourcesBackTo(baseline), []);
  });
}

async function backPressure(t: ExecutionContext, p: Pairing, direction: 'client-sends' | 'server-sends'): Promise<void> {
  const baseline = activeResources();
  const CHUNK = 32 * 1024;
  let serverStream: PacketStream | undefined;
  let ready!: () => void;
  const readyP = new Promise<void>((r) => (ready = r));
  const s = await setup(p, {
    agentConnect: (inc) => {
      serverStream = inc.accept({});
      ready();
    },
  });
  const client = await s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
  await readyP;
  const [sender, receiver] = direction === 'client-sends' ? [client, serverStream!] : [serverStream!, client];
  (receiver as Pausable).pause!();
  let received = 0;
  receiver.on('packet', (pkt) => {
    if (pkt.type === PacketType.DATA) received += pkt.data.length;
  });
  // Send until send() says stop; a sender that respects it stays bounded.
  let accepted = 0;
  const data = Buffer.alloc(CHUNK, 7);
  let drained = false;
  sender.on('drain', () => (drained = true));
  for (;;) {
    const more = sender.send({ type: PacketType.DATA, connectID: 1, error: '', data });
    accepted += CHUNK;
    if (!more) {
      // Let flushing settle; with the reader paused the buffer stays full.
      await new Promise((r) => setTimeout(r, 300));
      if (!drained) break;
      drained = false;
    }
    if (accepted > 256 * 1024 * 1024) break;
  }
  t.log(`${p.name} (${direction}): send() returned false after ${(accepted / 1024 / 1024).toFixed(2)} MiB`);
  t.true(accepted <= 8 * 1024 * 1024, `accepted ${accepted} bytes before back-pressure`);
  t.false(drained);
  await new Promise((r) => setTimeout(r, 300));
  t.false(drained, 'no drain while the peer does not read');
  const drainP = drainOrClose(sender);
  (receiver as Pausable).resume!();
  await drainP;
  t.true(drained);
  await new Promise<void>((resolve) => {
    const check = (): void => (received === accepted ? resolve() : void setTimeout(check, 10));
    check();
  });
  t.is(received, accepted);
  client.end();
  await s.teardown();
  t.deepEqual(await resourcesBackTo(baseline), []);
}

for (const p of tlsPairings) {
  test.serial(`${p.name}: back-pressure, client sends to a server that does not read`, (t) => backPressure(t, p, 'client-sends'));
  test.serial(`${p.name}: back-pressure, server sends to a client that does not read`, (t) => backPressure(t, p, 'server-sends'));
}

test.serial('grpc-js server with its own TLS (bindAsync, ALPN by grpc-js) ⇄ h2 client', async (t) => {
  const baseline = activeResources();
  const files = await throwawayTls();
  const server = new grpc.Server();
  let seen: grpc.Metadata | undefined;
  server.addService(agentService, {
    Connect: (call: grpc.ServerDuplexStream<Decoded, Packet>) => {
      seen = call.metadata;
      const md = new grpc.Metadata();
      md.set('serverid', 'go-like');
      md.set('x-reply-bin', BIN);
      call.sendMetadata(md);
      call.on('data', (d: Decoded) => call.write(d as Packet));
      call.on('end', () => call.end());
    },
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(
      '127.0.0.1:0',
      grpc.ServerCredentials.createSsl(files.ca, [{ cert_chain: files.serverCert, private_key: files.serverKey }], true),
      (err, p) => (err ? reject(err) : resolve(p)),
    ),
  );
  const channel = createH2Channel({
    target: `127.0.0.1:${port}`,
    tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey, serverName: 'localhost' },
  });
  const stream = await channel.openStream(AGENT_SERVICE_CONNECT, { agentid: 'a', 'x-trace-bin': BIN.toString('base64') }, 5000);
  t.deepEqual(stream.metadata.get('serverid'), ['go-like']);
  t.deepEqual(stream.metadata.get('x-reply-bin'), [BIN.toString('base64')]);
  t.deepEqual(seen?.get('x-trace-bin'), [BIN]);
  t.deepEqual(seen?.get('agentid'), ['a']);
  const { sent, got } = await echoEveryPacket(stream);
  t.deepEqual(got.map(norm), sent.map(norm));
  const w = watch(stream);
  stream.end();
  t.is(await w.result, undefined);
  channel.close();
  await new Promise<void>((r) => server.tryShutdown(() => r()));
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial('h2 server honours a grpc-js client deadline (grpc-timeout): both sides see DEADLINE_EXCEEDED', async (t) => {
  const baseline = activeResources();
  const p = pairings.find((x) => x.server === h2Transport && x.client === grpcJsPeerTransport && x.tls)!;
  let serverSide: Promise<Error | undefined> | undefined;
  const s = await setup(p, {
    agentConnect: (inc) => {
      serverSide = watch(inc.accept({})).result;
    },
  });
  const files = await throwawayTls();
  const ch = createGrpcJsChannel({ target: s.listener.target, tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey } });
  t.teardown(() => ch.close());
  const started = Date.now();
  const st = await openGrpcJsStream(ch.client, { path: AGENT_SERVICE_CONNECT, metadata: {}, timeoutMs: 5000, deadline: Date.now() + 400 });
  const clientErr = await watch(st).result;
  const serverErr = await serverSide!;
  t.is((clientErr as GrpcStatusError).code, GrpcStatus.DEADLINE_EXCEEDED);
  // Both ends time the same deadline: on a loaded machine grpc-js's own timer
  // may fire first and cancel, which the server then sees as CANCELLED.
  // (transport-h2.test.ts pins the server-side expiry with a peer that never cancels.)
  t.true(
    [GrpcStatus.DEADLINE_EXCEEDED, GrpcStatus.CANCELLED].includes((serverErr as GrpcStatusError).code),
    `server saw ${GrpcStatus[(serverErr as GrpcStatusError).code]}`,
  );
  t.true(Date.now() - started >= 390, 'not before the deadline');
  ch.close();
  await s.teardown();
  t.deepEqual(await resourcesBackTo(baseline), []);
});

test.serial(
  'grpc-js client: a server that never answers → openStream rejects with DEADLINE_EXCEEDED, and its cancel does not crash the process',
  async (t) => {
    const p = pairings.find((x) => x.server === h2Transport && x.client === grpcJsPeerTransport && x.tls)!;
    const s = await setup(p, { agentConnect: () => {} });
    const e = await t.throwsAsync(s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 300));
    t.is((e as GrpcStatusError).code, GrpcStatus.DEADLINE_EXCEEDED);
    // The cancelled call reports CANCELLED after the rejection; it must find a listener.
    await new Promise((r) => setTimeout(r, 300));
    await s.teardown();
  },
);

test.serial('h2 client: a grpc-js server that never answers → openStream rejects with DEADLINE_EXCEEDED after timeoutMs', async (t) => {
  const baseline = activeResources();
  const p = pairings.find((x) => x.server === grpcJsPeerTransport && x.client === h2Transport && x.tls)!;
  const s = await setup(p, { agentConnect: () => {} });
  const started = Date.now();
  const e = await t.throwsAsync(s.channel.openStream(AGENT_SERVICE_CONNECT, {}, 300));
  t.is((e as GrpcStatusError).code, GrpcStatus.DEADLINE_EXCEEDED);
  const took = Date.now() - started;
  t.true(took >= 290, `took ${took} ms: not before timeoutMs`);
  await s.teardown();
  t.deepEqual(await resourcesBackTo(baseline), []);
});
