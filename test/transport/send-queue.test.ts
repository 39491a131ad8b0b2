/**
 * The h2 transport's send side (src/transport/h2/send-queue.ts): control
 * packets and other connections' first bytes go ahead of bulk DATA still in
 * our own buffers (a dial next to a download), and packets of one
 * connection never change order. First on a fake stream that takes bytes
 * when told, then end to end over node:http2.
 */
import test from 'ava';
import fs from 'node:fs';
import {
  BULK_WRITE_AHEAD_BYTES,
  MIXED_HOLD_MS,
  MIXED_WRITE_AHEAD_BYTES,
  SendQueue,
  type MessageSink,
  type WriteAhead,
} from '../../src/transport/h2/send-queue.js';
import { framePacket, MessageParser } from '../../src/transport/h2/framing.js';
import { createH2Channel, createH2Server } from '../../src/transport/h2/index.js';
import { decodePacket } from '../../src/wire/codec.js';
import { AGENT_SERVICE_CONNECT } from '../../src/wire/metadata.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { listenUnix, tempDir } from '../helpers/grpc-js-peer.js';

/** A stream that takes written bytes only when take() is called. */
class FakeStream implements MessageSink {
  writableLength = 0;
  destroyed = false;
  readonly written: Uint8Array[] = [];
  private readonly pending: (() => void)[] = [];

  write(chunk: Uint8Array, done: () => void): void {
    this.written.push(chunk);
    this.writableLength += chunk.length;
    this.pending.push(() => {
      this.writableLength -= chunk.length;
      done();
    });
  }

  /** The connection takes the oldest `n` writes (all by default). */
  take(n = Number.POSITIVE_INFINITY): void {
    for (let i = 0; i < n && this.pending.length > 0; i++) this.pending.shift()!();
  }

  packets(): Packet[] {
    const out: Packet[] = [];
    const parser = new MessageParser(1 << 24);
    for (const chunk of this.written) parser.push(Buffer.from(chunk), (m) => (out.push(decodePacket(m)), true));
    return out;
  }
}

const KB = 1024;
const DEFAULT_FOR_TEST: WriteAhead = {
  mixedBytes: MIXED_WRITE_AHEAD_BYTES,
  bulkBytes: BULK_WRITE_AHEAD_BYTES,
  mixedHoldMs: MIXED_HOLD_MS,
  now: () => 0,
};
/** A write-ahead of `bytes` whatever is sent. */
const fixed = (bytes: number): WriteAhead => ({ mixedBytes: bytes, bulkBytes: bytes, mixedHoldMs: 0, now: () => 0 });
const data = (connectID: number, bytes: number, fill = 0): Packet => ({
  type: PacketType.DATA,
  connectID,
  error: '',
  data: Buffer.alloc(bytes, fill),
});

/** "DATA 1 65536", "DIAL_RSP 2", … */
function describe(p: Packet): string {
  const id = 'connectID' in p ? ` ${p.connectID}` : '';
  return `${PacketType[p.type]}${id}${p.type === PacketType.DATA ? ` ${p.data.length}` : ''}`;
}

test("control packets and a new connection's first bytes go ahead of held DATA; the held connection keeps its order", (t) => {
  const sink = new FakeStream();
  const queue = new SendQueue(sink, () => undefined, fixed(256 * KB));
  const packets: Packet[] = [
    ...Array.from({ length: 16 }, () => data(1, 64 * KB)),
    { type: PacketType.DIAL_RSP, random: 7n, connectID: 2, error: '' },
    data(2, 1),
    { type: PacketType.CLOSE_REQ, connectID: 1 },
    { type: PacketType.KANAL_WINDOW, connectID: 1, increment: 64 * KB },
    { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'a:1', random: 9n },
  ];
  for (const p of packets) queue.push(p);
  const framed = packets.reduce((n, p) => n + framePacket(p).reduce((m, part) => m + part.length, 0), 0);
  t.is(queue.queuedBytes, framed, 'everything sent is counted until the stream takes it');
  queue.flush(); // the end of the turn
  sink.take();
  queue.flushAll();
  sink.take();
  t.deepEqual(sink.packets().map(describe), [
    ...Array<string>(4).fill('DATA 1 65536'),
    'DIAL_RSP 2',
    'DATA 2 1',
    'KANAL_WINDOW 1',
    'DIAL_REQ',
    ...Array<string>(12).fill('DATA 1 65536'),
    'CLOSE_REQ 1',
  ]);
  t.is(queue.queuedBytes, 0);
});

test('held DATA is written as the stream takes bytes, never more than the write-ahead at once', (t) => {
  const sink = new FakeStream();
  const queue = new SendQueue(sink, () => queue.pump(), fixed(256 * KB));
  for (let i = 0; i < 64; i++) queue.push(data(1, 64 * KB));
  queue.flush();
  let rounds = 0;
  while (queue.queuedBytes > 0 && rounds++ < 1000) {
    t.true(sink.writableLength <= 256 * KB + 64 * KB + 100);
    sink.take(1);
  }
  t.is(queue.queuedBytes, 0);
  t.is(sink.packets().length, 64);
});

test('the write-ahead is large while only bulk DATA is sent, small for MIXED_HOLD_MS after a small message', (t) => {
  let clock = 1000;
  const sink = new FakeStream();
  const queue = new SendQueue(sink, () => undefined, { ...DEFAULT_FOR_TEST, now: () => clock });
  t.is(queue.writeAheadBytes, BULK_WRITE_AHEAD_BYTES, 'nothing small sent yet');
  for (let i = 0; i < 64; i++) queue.push(data(1, 64 * KB));
  const bulkInStream = sink.writableLength;
  t.true(bulkInStream >= BULK_WRITE_AHEAD_BYTES && bulkInStream < BULK_WRITE_AHEAD_BYTES + 65 * KB, `${bulkInStream} B in the stream`);

  queue.push({ type: PacketType.DIAL_RSP, random: 7n, connectID: 2, error: '' });
  t.is(queue.writeAheadBytes, MIXED_WRITE_AHEAD_BYTES, 'a small message was just sent');
  queue.flush();
  sink.take();
  queue.pump();
  t.true(sink.writableLength < MIXED_WRITE_AHEAD_BYTES + 65 * KB, `refilled to ${sink.writableLength} B while small messages are recent`);

  clock += MIXED_HOLD_MS;
  t.is(queue.writeAheadBytes, BULK_WRITE_AHEAD_BYTES, `${MIXED_HOLD_MS} ms later`);
  sink.take();
  queue.pump();
  t.true(sink.writableLength >= BULK_WRITE_AHEAD_BYTES, `refilled to ${sink.writableLength} B once only bulk DATA is sent`);
  queue.flushAll();
  sink.take();
  t.is(sink.packets().length, 65);
});

test('random traffic over four connections: every packet arrives once, each connection in the order sent', (t) => {
  for (let round = 0; round < 200; round++) {
    const sink = new FakeStream();
    const queue = new SendQueue(sink, () => queue.pump(), fixed(64 * KB));
    const sent = new Map<number, string[]>();
    let seq = 0;
    for (let i = 0; i < 300; i++) {
      const id = 1 + Math.floor(Math.random() * 4);
      const r = Math.random();
      // Each DATA carries its sequence number in its first byte, so reordering shows.
      const p: Packet =
        r < 0.5
          ? data(id, Math.random() < 0.5 ? 1 + Math.floor(Math.random() * 200) : 1024 + Math.floor(Math.random() * 60 * KB), seq++ & 0xff)
          : r < 0.6
            ? { type: PacketType.KANAL_HALF_CLOSE, connectID: id }
            : r < 0.7
              ? { type: PacketType.CLOSE_RSP, connectID: id, error: '' }
              : r < 0.8
                ? { type: PacketType.KANAL_WINDOW, connectID: id, increment: 1 }
                : r < 0.9
                  ? { type: PacketType.DIAL_CLS, random: BigInt(i) }
                  : { type: PacketType.DIAL_RSP, random: 1n, connectID: id, error: '' };
      queue.push(p);
      if (p.type !== PacketType.KANAL_WINDOW && p.type !== PacketType.DIAL_CLS) sent.set(id, [...(sent.get(id) ?? []), order(p)]);
      if (Math.random() < 0.2) queue.flush();
      if (Math.random() < 0.3) sink.take(Math.floor(Math.random() * 4));
    }
    queue.flushAll();
    sink.take();
    const got = new Map<number, string[]>();
    for (const p of sink.packets()) {
      if (p.type !== PacketType.KANAL_WINDOW && 'connectID' in p) got.set(p.connectID, [...(got.get(p.connectID) ?? []), order(p)]);
    }
    for (const [id, packets] of sent) t.deepEqual(got.get(id), packets, `connection ${id}, round ${round}`);
    t.is(got.size, sent.size);
    t.is(queue.queuedBytes, 0);
  }

  function order(p: Packet): string {
    return p.type === PacketType.DATA ? `DATA ${p.data.length} ${p.data[0]}` : describe(p);
  }
});

test('clear() drops what is held and gathered; the stream keeps what it has', (t) => {
  const sink = new FakeStream();
  const queue = new SendQueue(sink, () => undefined, fixed(128 * KB));
  for (let i = 0; i < 8; i++) queue.push(data(1, 64 * KB));
  queue.push({ type: PacketType.CLOSE_REQ, connectID: 3 });
  const inStream = sink.writableLength;
  t.true(queue.queuedBytes > inStream);
  queue.clear();
  t.is(queue.queuedBytes, inStream);
  queue.flushAll();
  t.is(sink.writableLength, inStream);
});

test.serial(
  "over node:http2: a DIAL_RSP sent after 2 MiB of another connection's DATA arrives before that DATA has all arrived",
  async (t) => {
    const order: string[] = [];
    let done: () => void = () => undefined;
    const received = new Promise<void>((resolve) => (done = resolve));
    const server = createH2Server(
      {
        agentConnect: (incoming) => {
          const stream = incoming.accept({});
          stream.on('packet', (p) => {
            order.push(describe(p));
            if (p.type === PacketType.CLOSE_REQ) done();
          });
        },
      },
      { maxReceiveMessageBytes: 4 * 1024 * KB },
    );
    const dir = tempDir();
    const listener = await listenUnix(dir, (s) => server.injectConnection(s));
    const channel = createH2Channel({ target: listener.target });
    try {
      const stream = await channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000);
      // One turn, as an agent splicing a download and answering a dial at once.
      for (let i = 0; i < 32; i++) stream.send(data(1, 64 * KB));
      stream.send({ type: PacketType.DIAL_RSP, random: 7n, connectID: 2, error: '' });
      stream.send(data(2, 1));
      stream.send({ type: PacketType.CLOSE_REQ, connectID: 1 });
      await Promise.race([
        received,
        new Promise((_, reject) => setTimeout(() => reject(new Error('not all packets arrived within 10 s')), 10_000)),
      ]);
      const dialRsp = order.indexOf('DIAL_RSP 2');
      const lastData = order.lastIndexOf('DATA 1 65536');
      t.is(order.filter((o) => o === 'DATA 1 65536').length, 32);
      t.true(dialRsp >= 0 && dialRsp < lastData, `DIAL_RSP went ahead of held DATA: ${order.join(', ')}`);
      t.is(order[dialRsp + 1], 'DATA 2 1');
      t.is(order.at(-1), 'CLOSE_REQ 1', 'CLOSE_REQ 1 stays behind its DATA');
      stream.destroy();
    } finally {
      channel.close();
      await server.close(100);
      await listener.close();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  },
);
