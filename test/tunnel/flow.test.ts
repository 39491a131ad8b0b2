/**
 * Per-connection flow control. With the window extension a stalled reader
 * stops its own sender after about one window and costs bounded memory,
 * while its neighbours on the same tunnel keep moving; without it (upstream
 * peers) the stream is paused, as upstream does, and nothing is lost.
 * Transport back-pressure (send() false / 'drain') holds write callbacks.
 */
import test from 'ava';
import { createHash } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import type { ConnectionStream } from '../../src/tunnel/connection-stream.js';
import { Feature, type FeatureSet } from '../../src/wire/features.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import {
  captureLogger,
  createMemoryLink,
  drainOrClose,
  nextPacket,
  sinkEndpoint,
  tunnelPair,
  waitFor,
  type Sink,
} from '../helpers/memory-stream.js';
import { dialStream } from '../helpers/connection-stream.js';

const MiB = 1024 * 1024;
const KiB = 1024;

/** Deterministic bytes: chunk i of a stream is a function of (seed, i). */
function chunkOf(seed: number, i: number, size: number): Buffer {
  const b = Buffer.allocUnsafe(size);
  let x = (seed * 2654435761 + i * 40503) >>> 0;
  for (let j = 0; j < size; j += 4) {
    x = (x * 1664525 + 1013904223) >>> 0;
    b.writeUInt32LE(x, j);
  }
  return b;
}

interface WriteProgress {
  /** Bytes whose write callback ran. */
  completed: number;
  /** Bytes handed to write(). */
  written: number;
  digest: string;
  done: Promise<void>;
}

/**
 * Writes `total` bytes in `chunk`-sized pieces, respecting write() === false,
 * then ends (if `end`). Counts completed write callbacks.
 */
function writeStream(s: Duplex, seed: number, total: number, chunk: number, end: boolean): WriteProgress {
  const hash = createHash('sha256');
  const progress: WriteProgress = { completed: 0, written: 0, digest: '', done: Promise.resolve() };
  progress.done = (async () => {
    for (let i = 0; progress.written < total; i++) {
      if (s.destroyed) return;
      const c = chunkOf(seed, i, Math.min(chunk, total - progress.written));
      hash.update(c);
      progress.written += c.length;
      const ok = s.write(c, (err) => {
        if (!err) progress.completed += c.length;
      });
      if (!ok) await drainOrClose(s);
    }
    progress.digest = hash.digest('hex');
    if (end) s.end();
  })();
  return progress;
}

function finished(s: Duplex): Promise<void> {
  return new Promise((resolve, reject) => {
    if (s.writableFinished) return resolve();
    s.once('finish', () => resolve());
    s.once('close', () => (s.writableFinished ? resolve() : reject(new Error('closed before finishing'))));
  });
}

function closed(s: Duplex): Promise<void> {
  return new Promise((resolve) => (s.closed ? resolve() : s.once('close', () => resolve())));
}

const WINDOW: FeatureSet = new Set([Feature.Window, Feature.HalfClose]);
const NO_WINDOW: FeatureSet = new Set([Feature.HalfClose]);

/** Performer-side handler: "stalled:*" gets a stalled sink, anything else a reading sink. */
function sinks(out: Map<string, Sink>) {
  return (dial: { address: string }): Promise<Duplex> => {
    const sink = sinkEndpoint({ stalled: dial.address.startsWith('stalled') });
    out.set(dial.address, sink);
    return Promise.resolve(sink);
  };
}

/**
 * Dials `addresses` from `from` (the peer's handler is sinks(endpoints)):
 * each connection flowing, its errors logged; returns it with its sink.
 */
async function dialSinks(
  t: { log(...values: unknown[]): void },
  from: Tunnel,
  endpoints: Map<string, Sink>,
  addresses: string[],
): Promise<{ conn: ConnectionStream; sink: Sink }[]> {
  const out: { conn: ConnectionStream; sink: Sink }[] = [];
  for (const address of addresses) {
    const conn = await dialStream(from, address, { timeoutMs: 5000 });
    conn.on('error', (e: Error) => t.log(`connection error: ${e.message}`)).resume();
    out.push({ conn, sink: endpoints.get(address)! });
  }
  return out;
}

/** Tracks, on the sender's stream, DATA bytes sent minus window granted, per connection; records the maximum. */
function windowAccounting(sender: ReturnType<typeof createMemoryLink>['a']) {
  const sent = new Map<number, number>();
  const granted = new Map<number, number>();
  let maxOutstanding = 0;
  sender.tap((p: Packet) => {
    if (p.type !== PacketType.DATA) return;
    const s = (sent.get(p.connectID) ?? 0) + p.data.length;
    sent.set(p.connectID, s);
    maxOutstanding = Math.max(maxOutstanding, s - (granted.get(p.connectID) ?? 0));
  });
  // Before the tunnel's own listener, so a grant is counted before the sends it allows.
  sender.prependListener('packet', (p: Packet) => {
    if (p.type === PacketType.KANAL_WINDOW) granted.set(p.connectID, (granted.get(p.connectID) ?? 0) + p.increment);
  });
  return { maxOutstanding: () => maxOutstanding, sent: (id: number) => sent.get(id) ?? 0 };
}

test('window: a stalled reader stops its sender after one window; a neighbour moves 32 MiB; memory stays bounded', async (t) => {
  const windowBytes = 256 * KiB;
  const maxDataBytes = 16 * KiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({ features: WINDOW, limits: { windowBytes, maxDataBytes }, serverDialHandler: sinks(endpoints) });
  t.teardown(() => pair.close());
  const accounting = windowAccounting(pair.link.a);

  const [stalled, fast] = await dialSinks(t, pair.agent, endpoints, ['stalled:1', 'fast:2']);
  const { conn: stalledConn, sink: stalledSink } = stalled;
  const { conn: fastConn, sink: fastSink } = fast;

  const stalledWrite = writeStream(stalledConn, 1, 8 * MiB, 64 * KiB, true);
  const fastWrite = writeStream(fastConn, 2, 32 * MiB, 64 * KiB, true);
  await fastWrite.done;
  await finished(fastSink);
  t.is(fastSink.accepted, 32 * MiB, 'the neighbour moved all 32 MiB');
  t.is(fastSink.digest(), fastWrite.digest, 'intact');

  // The stalled connection: the sender's writes stopped completing after about one window.
  await sleep(50);
  const receiver = pair.server.connection(stalledConn.connection.connectID)!;
  t.truthy(receiver, 'performer-side connection found');
  const completed = stalledWrite.completed;
  const receivedBytes = receiver.bytesIn;
  t.log(`stalled: sender completed ${completed} B, receiver holds ${receivedBytes} B, window ${windowBytes} B`);
  t.true(completed <= windowBytes + 64 * KiB, `sender completed ${completed} B`);
  t.true(completed >= windowBytes / 2, 'the sender did use its window');
  // Memory bound: nothing was read by the application, so all of it is buffered.
  const bound = windowBytes + stalledSink.writableHighWaterMark;
  t.true(receivedBytes <= bound, `receiver buffered ${receivedBytes} B, bound ${bound} B`);
  t.true(accounting.maxOutstanding() <= windowBytes, `sender never exceeded the window (max outstanding ${accounting.maxOutstanding()} B)`);
  t.false(stalledConn.destroyed, 'a stalled connection with flow control stays open');

  // Still stalled: nothing more moves.
  await sleep(100);
  t.is(stalledWrite.completed, completed);
  t.is(receiver.bytesIn, receivedBytes);

  // Unstall: everything arrives, in order, and the connection closes cleanly.
  stalledSink.release();
  await stalledWrite.done;
  await finished(stalledSink);
  t.is(stalledSink.accepted, 8 * MiB);
  t.is(stalledSink.digest(), stalledWrite.digest);
  await Promise.all([closed(stalledConn), closed(fastConn)]);
  await waitFor(() => pair.agent.stats().connections === 0 && pair.server.stats().connections === 0, 'tables empty');
});

test('window: the receiver grants credit as it reads; a single connection moves 16 MiB through a 64 KiB window', async (t) => {
  const windowBytes = 64 * KiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({ features: WINDOW, limits: { windowBytes, maxDataBytes: 16 * KiB }, agentDialHandler: sinks(endpoints) });
  t.teardown(() => pair.close());
  const accounting = windowAccounting(pair.link.b);
  const conn = await dialStream(pair.server, 'pod:80', { timeoutMs: 5000 });
  conn.on('error', (e: Error) => t.log(`connection error: ${e.message}`)).resume();
  const w = writeStream(conn, 3, 16 * MiB, 100_000, true);
  await w.done;
  const sink = endpoints.get('pod:80')!;
  await finished(sink);
  t.is(sink.accepted, 16 * MiB);
  t.is(sink.digest(), w.digest);
  t.true(accounting.maxOutstanding() <= windowBytes, `max outstanding ${accounting.maxOutstanding()} B`);
  const grants = pair.link.a.sent.filter((p) => p.type === PacketType.KANAL_WINDOW);
  t.true(grants.length > 0);
  // Credit is batched: no grant smaller than a quarter window.
  t.true(grants.every((p) => p.type === PacketType.KANAL_WINDOW && p.increment >= windowBytes / 4));
});

test('window growth: a connection whose reader keeps up grows its window to maxWindowBytes; a stalled one keeps the first window', async (t) => {
  const windowBytes = 64 * KiB;
  const maxWindowBytes = 256 * KiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({
    features: WINDOW,
    limits: { windowBytes, maxWindowBytes, maxDataBytes: 16 * KiB },
    agentDialHandler: sinks(endpoints),
  });
  t.teardown(() => pair.close());
  const accounting = windowAccounting(pair.link.b);
  const [b, st] = await dialSinks(t, pair.server, endpoints, ['bulk:1', 'stalled:2']);
  const { conn: bulk, sink: bulkSink } = b;
  const { conn: stalled, sink: stalledSink } = st;

  const stalledWrite = writeStream(stalled, 4, 2 * MiB, 64 * KiB, false);
  const first = writeStream(bulk, 5, 16 * MiB, 64 * KiB, false);
  await first.done;
  await waitFor(() => bulkSink.accepted === 16 * MiB, 'the bulk reader took all 16 MiB');
  // Now the bulk reader stops: what its sender still gets through is the window it grew to.
  bulkSink.stall();
  const second = writeStream(bulk, 6, 2 * MiB, 64 * KiB, false);
  await sleep(100);
  const inFlight = second.completed;
  t.log(`after the stall the bulk sender completed ${inFlight} B; the stalled-from-start sender ${stalledWrite.completed} B`);
  t.true(inFlight > 2 * windowBytes, `the window grew (${inFlight} B moved into a stalled reader)`);
  t.true(inFlight <= maxWindowBytes + 64 * KiB, `and stayed within maxWindowBytes (${inFlight} B)`);
  t.true(
    stalledWrite.completed <= windowBytes + 64 * KiB,
    `a reader stalled from the start keeps the first window (${stalledWrite.completed} B)`,
  );
  // Sender-side invariant: never more in flight than the credit it was given.
  t.true(accounting.maxOutstanding() <= windowBytes, `max outstanding ${accounting.maxOutstanding()} B`);
  t.false(bulk.destroyed, 'no overrun: the receiver accepted what the grown window allowed');

  // Both drain completely and intact.
  bulkSink.release();
  stalledSink.release();
  await Promise.all([second.done, stalledWrite.done]);
  bulk.end();
  stalled.end();
  await Promise.all([finished(bulkSink), finished(stalledSink)]);
  t.is(bulkSink.accepted, 18 * MiB);
  t.is(stalledSink.accepted, 2 * MiB);
});

test('window growth budget: once a tunnel spent it, other connections keep the first window; closing returns it', async (t) => {
  const windowBytes = 64 * KiB;
  const maxWindowBytes = 256 * KiB;
  // Room for one connection's growth (64 -> 128 -> 256 KiB), not two.
  const windowGrowthBudgetBytes = 192 * KiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({
    features: WINDOW,
    limits: { windowBytes, maxWindowBytes, windowGrowthBudgetBytes, maxDataBytes: 16 * KiB },
    agentDialHandler: sinks(endpoints),
  });
  t.teardown(() => pair.close());
  const receiverSide = pair.agent; // the performer receives what the server-side dialer writes

  /** Moves 8 MiB through `conn`, stalls its reader, reports what the sender got through after the stall. */
  async function inFlightAfterStall(
    conn: ConnectionStream,
    sink: Sink,
    seed: number,
    before: number,
  ): Promise<{ inFlight: number; w: WriteProgress }> {
    const bulk = writeStream(conn, seed, 8 * MiB, 64 * KiB, false);
    await bulk.done;
    await waitFor(() => sink.accepted === before + 8 * MiB, 'the reader took the bulk');
    sink.stall();
    const w = writeStream(conn, seed + 1, 1 * MiB, 64 * KiB, false);
    // What gets through before the window stops it: wait until something went through (a loaded
    // machine may not give the sender any time at first) and the count holds still for 100 ms
    // (at most 10 s), not for a fixed time.
    let last = -1;
    for (const deadline = Date.now() + 10_000; (w.completed === 0 || w.completed !== last) && Date.now() < deadline;) {
      last = w.completed;
      await sleep(100);
    }
    return { inFlight: w.completed, w };
  }

  const [f, sc] = await dialSinks(t, pair.server, endpoints, ['first:1', 'second:2']);
  const { conn: first, sink: firstSink } = f;
  const { conn: second, sink: secondSink } = sc;

  const a = await inFlightAfterStall(first, firstSink, 10, 0);
  t.true(a.inFlight > 2 * windowBytes, `the first connection grew its window (${a.inFlight} B in flight)`);
  t.is(receiverSide.stats().windowGrowthBytes, maxWindowBytes - windowBytes, 'it holds the whole budget');

  const b = await inFlightAfterStall(second, secondSink, 20, 0);
  t.true(b.inFlight <= windowBytes + 64 * KiB, `the second kept the first window: budget spent (${b.inFlight} B in flight)`);
  t.is(receiverSide.stats().windowGrowthBytes, maxWindowBytes - windowBytes);

  // The first connection closes: its growth goes back to the budget ...
  firstSink.release();
  await a.w.done;
  first.destroy();
  await waitFor(() => receiverSide.stats().windowGrowthBytes === 0, 'growth returned when the connection closed');
  // ... and the second can now grow.
  secondSink.release();
  await b.w.done;
  // Every byte written so far taken first: one still in flight when the next stall comes would fill the window it measures.
  await waitFor(() => secondSink.accepted === 9 * MiB, "the second's reader took its 8 + 1 MiB");
  const c = await inFlightAfterStall(second, secondSink, 30, 9 * MiB);
  t.true(c.inFlight > 2 * windowBytes, `with the budget back, the second grew (${c.inFlight} B in flight)`);
  secondSink.release();
  await c.w.done;
  second.destroy();
  await waitFor(() => receiverSide.stats().windowGrowthBytes === 0 && receiverSide.stats().connections === 0, 'all returned');
});

test('limits: a maximum window below the first window is refused with a clear error', (t) => {
  const link = createMemoryLink();
  const err = t.throws(
    () =>
      new Tunnel(link.a, {
        side: 'agent',
        features: WINDOW,
        limits: { windowBytes: 2 * MiB, maxWindowBytes: MiB },
        log: captureLogger().log,
      }),
  );
  t.regex(err?.message ?? '', /maxWindowBytes \(1048576\) is below windowBytes \(2097152\)/);
});

/**
 * No window (upstream peer): dials 'stalled:1' and 'next:2' through the pair
 * and writes `total` bytes on each; returns once the server side stopped
 * reading because the stalled reader's buffer is full.
 */
async function stallUpstreamStream(
  t: { log(...values: unknown[]): void; teardown(fn: () => void): void },
  limits: { unflowedBufferBytes: number; maxDataBytes: number },
  total: number,
) {
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({ features: NO_WINDOW, limits, serverDialHandler: sinks(endpoints) });
  t.teardown(() => pair.close());
  const [stalled, next] = await dialSinks(t, pair.agent, endpoints, ['stalled:1', 'next:2']);
  const errors: Error[] = [];
  stalled.conn.on('error', (e: Error) => errors.push(e));
  const stalledWrite = writeStream(stalled.conn, 1, total, 64 * KiB, true);
  const nextWrite = writeStream(next.conn, 2, total, 64 * KiB, true);
  await waitFor(() => pair.server.stats().readPaused, 'the server stops reading the stream');
  const receiver = pair.server.connection(stalled.conn.connection.connectID)!;
  return { pair, stalled: stalled, next: next, receiver, stalledWrite, nextWrite, errors };
}

test('no window (upstream peer): a stalled reader pauses the stream, as upstream does; nothing is closed or lost and memory stays bounded', async (t) => {
  const limits = { unflowedBufferBytes: 1 * MiB, maxDataBytes: 16 * KiB };
  const { pair, stalled, next, receiver, stalledWrite, nextWrite, errors } = await stallUpstreamStream(t, limits, 8 * MiB);
  const nextBefore = next.sink.accepted;
  await sleep(300);
  // Held back, not closed: the receiver buffers at most the limit plus what one read carried.
  const bound = limits.unflowedBufferBytes + 256 * KiB + limits.maxDataBytes;
  t.true(stalled.sink.writableLength <= bound, `buffered ${stalled.sink.writableLength} B, bound ${bound}`);
  t.not(receiver.state, 'closed');
  t.is(errors.length, 0);
  // The cost, as with upstream: the neighbour on the same stream waits too.
  t.is(next.sink.accepted, nextBefore, 'head-of-line blocking: the neighbour waits while the stream is paused');

  stalled.sink.release();
  await Promise.all([stalledWrite.done, nextWrite.done]);
  for (const [{ sink }, w] of [
    [stalled, stalledWrite],
    [next, nextWrite],
  ] as const) {
    await finished(sink);
    t.is(sink.accepted, 8 * MiB);
    t.is(sink.digest(), w.digest);
  }
  await waitFor(() => !pair.server.stats().readPaused, 'reading resumes');
  await waitFor(() => pair.agent.stats().connections === 0 && pair.server.stats().connections === 0, 'tables empty');
  t.deepEqual(
    pair.serverLog.matching('connection closed').filter((l) => l.reason !== 'finished' && l.reason !== 'closed'),
    [],
    'no connection ended by a failure',
  );
});

test('no window: a stalled reader whose client gives up releases the stream; the neighbour finishes intact', async (t) => {
  const limits = { unflowedBufferBytes: 1 * MiB, maxDataBytes: 16 * KiB };
  const { pair, stalled, next, receiver, nextWrite } = await stallUpstreamStream(t, limits, 8 * MiB);
  stalled.sink.destroy(); // the local client (say the KAS) closes its connection
  await waitFor(() => receiver.state === 'closed', 'the receiver closed');
  await nextWrite.done;
  await finished(next.sink);
  t.is(next.sink.digest(), nextWrite.digest);
  t.false(pair.server.stats().readPaused);
  t.false(pair.agent.closed || pair.server.closed, 'the tunnel survives');
});

test('no window: many slow readers together pause the stream at unflowedStreamBufferBytes', async (t) => {
  const unflowedStreamBufferBytes = 2 * MiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({
    features: NO_WINDOW,
    limits: { unflowedBufferBytes: 4 * MiB, unflowedStreamBufferBytes, maxDataBytes: 16 * KiB },
    serverDialHandler: sinks(endpoints),
  });
  t.teardown(() => pair.close());
  const conns = await dialSinks(t, pair.agent, endpoints, ['stalled:1', 'stalled:2', 'stalled:3', 'stalled:4']);
  const writes = conns.map(({ conn }, i) => writeStream(conn, 30 + i, 4 * MiB, 64 * KiB, true));
  await waitFor(() => pair.server.stats().readPaused, 'the server stops reading the stream');
  await sleep(200);
  const buffered = conns.reduce((n, { sink }) => n + sink.writableLength, 0);
  t.true(buffered <= unflowedStreamBufferBytes + 256 * KiB + 16 * KiB, `buffered ${buffered} B in all`);
  t.true(
    conns.every(({ sink }) => sink.writableLength < 4 * MiB),
    'no single reader reached its own limit',
  );
  for (const { sink } of conns) sink.release();
  await Promise.all(writes.map((w) => w.done));
  for (const [i, { sink }] of conns.entries()) {
    await finished(sink);
    t.is(sink.digest(), writes[i].digest);
  }
});

test('a peer that overruns the window gets its connection closed (exactly at window + credit)', async (t) => {
  const windowBytes = 64 * KiB;
  const link = createMemoryLink();
  const logs = captureLogger();
  const endpoints = new Map<string, Sink>();
  const tunnel = new Tunnel(link.a, {
    side: 'agent',
    features: WINDOW,
    limits: { windowBytes },
    log: logs.log,
    dialHandler: sinks(endpoints),
  });
  t.teardown(() => tunnel.close());
  const peer = link.b;
  let credit = 0;
  peer.on('packet', (p) => {
    if (p.type === PacketType.KANAL_WINDOW) credit += p.increment;
  });
  const rspP = nextPacket(peer, PacketType.DIAL_RSP);
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'stalled:1', random: 11n });
  const { connectID } = await rspP;
  let sent = 0;
  const sendData = (n: number): void => {
    while (n > 0) {
      const size = Math.min(n, 16 * KiB);
      peer.send({ type: PacketType.DATA, connectID, error: '', data: Buffer.alloc(size, 0x61) });
      sent += size;
      n -= size;
    }
  };
  // Up to the window plus whatever credit was granted: allowed.
  for (let i = 0; i < 10; i++) {
    const allowed = windowBytes + credit;
    if (sent === allowed && i > 0) break;
    sendData(allowed - sent);
    await sleep(20);
  }
  t.is(sent, windowBytes + credit);
  t.is(tunnel.stats().connections, 1, 'a polite peer keeps its connection');
  t.false(peer.other.sent.some((p) => p.type === PacketType.CLOSE_RSP));
  // One byte more: overrun.
  const closeP = nextPacket(peer, PacketType.CLOSE_RSP, (p) => p.connectID === connectID);
  sendData(1);
  const close = await closeP;
  t.regex(close.error, /overran the flow-control window/);
  await waitFor(() => tunnel.stats().connections === 0, 'table empty');
  t.false(tunnel.closed, 'only the connection is closed, not the tunnel');
});

test('transport back-pressure: write callbacks wait for drain; the tunnel queues at most one buffer', async (t) => {
  const sendBufferBytes = 64 * KiB;
  const maxDataBytes = 16 * KiB;
  const endpoints = new Map<string, Sink>();
  const pair = tunnelPair({
    features: NO_WINDOW,
    limits: { maxDataBytes },
    link: { sendBufferBytes, batchBytes: 32 * KiB },
    serverDialHandler: sinks(endpoints),
  });
  t.teardown(() => pair.close());
  const conn = await dialStream(pair.agent, 'pod:1', { timeoutMs: 5000 });
  conn.on('error', (e: Error) => t.log(`connection error: ${e.message}`)).resume();
  pair.link.a.pauseDelivery(); // the transport stops taking bytes
  let done = false;
  conn.write(chunkOf(9, 0, MiB), () => (done = true));
  await sleep(50);
  t.false(done, 'the write does not complete while the transport is blocked');
  t.true(pair.link.a.queuedBytes <= sendBufferBytes + maxDataBytes + 64, `queued ${pair.link.a.queuedBytes} B`);
  t.true(pair.link.a.blockedCount >= 1);
  t.false(pair.agent.writable);
  pair.link.a.resumeDelivery();
  await waitFor(() => done, 'write completed after drain');
  const w = writeStream(conn, 10, 8 * MiB, 64 * KiB, true);
  await w.done;
  const sink = endpoints.get('pod:1')!;
  await finished(sink);
  t.is(sink.accepted, MiB + 8 * MiB);
  t.true(pair.link.a.blockedCount > 1, 'send() returned false more than once');
  await closed(conn);
});

for (const [name, features] of [
  ['window', WINDOW],
  ['no window', NO_WINDOW],
] as const) {
  test(`fair sharing (${name}): bulk senders on one tunnel take turns when the transport drains`, async (t) => {
    // Each turn after a drain refills the transport; a sender must not get
    // every turn just because it re-queued first.
    const endpoints = new Map<string, Sink>();
    const pair = tunnelPair({ features, link: { sendBufferBytes: 256 * KiB, batchBytes: 64 * KiB }, serverDialHandler: sinks(endpoints) });
    t.teardown(() => pair.close());
    const n = 4;
    const total = 8 * MiB;
    const conns = await Promise.all(Array.from({ length: n }, (_, i) => dialStream(pair.agent, `bulk:${i + 1}`, { timeoutMs: 5000 })));
    for (const c of conns) c.on('error', (e: Error) => t.log(`connection error: ${e.message}`)).resume();
    const writes = conns.map((c, i) => writeStream(c, 20 + i, total, 64 * KiB, true));
    await Promise.race(writes.map((w) => w.done));
    const shares = conns.map((_, i) => endpoints.get(`bulk:${i + 1}`)!.accepted / total);
    t.log(`progress when the first sender finished: ${shares.map((s) => s.toFixed(2)).join(' ')}`);
    for (const [i, s] of shares.entries()) t.true(s >= 0.5, `connection ${i + 1} had moved only ${(s * 100).toFixed(0)}%`);
    await Promise.all(writes.map((w) => w.done));
    for (const [i, w] of writes.entries()) {
      const sink = endpoints.get(`bulk:${i + 1}`)!;
      await finished(sink);
      t.is(sink.digest(), w.digest);
    }
    t.true(pair.link.a.blockedCount > 10, 'the transport really pushed back');
  });
}
