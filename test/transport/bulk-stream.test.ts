/**
 * One stream carrying many DATA packets over mutual TLS, for each pairing of
 * the h2 and grpc-js transports: every packet arrives intact and in order,
 * and while the receiver is paused the sender is held back by HTTP/2 flow
 * control (send() says wait, and no 'drain' comes) instead of queueing
 * without bound. What the stream carries per second is measured by the
 * bench, section 1b (bench/suite-transport.ts), not here.
 */
import test, { type ExecutionContext } from 'ava';
import { h2Transport } from '../../src/transport/h2/index.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import type { GrpcServerTransport, Transport } from '../../src/transport/transport.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT } from '../../src/wire/metadata.js';
import { grpcJsPeerTransport, listenTls, throwawayTls } from '../helpers/grpc-js-peer.js';
import { drainOrClose } from '../helpers/memory-stream.js';

const CHUNK = 32 * 1024;
/** Packets sent in all: 48 MiB, beyond the windows and socket buffers, so flow control must act. */
const PACKETS = 1536;
/**
 * Bound on what the sender may hand over while the receiver does not read: the stream's 4 MiB
 * receive window (src/transport/h2/tuning.ts), the send queue and both sockets' buffers, with room.
 */
const MAX_UNREAD_BYTES = 32 * 1024 * 1024;
/** How long a sender waits for a 'drain' before it counts as held back. A late drain only makes the check weaker. */
const QUIET_MS = 1000;

/** Packet `seq`: its number in the first four bytes, then a byte pattern that depends on it. */
function payload(seq: number): Buffer {
  const b = Buffer.alloc(CHUNK, seq & 0xff);
  b.writeUInt32BE(seq, 0);
  b[CHUNK - 1] = (seq * 7) & 0xff;
  return b;
}

/** Rejects after `ms` with a message naming the step, else settles as `p` does. */
function step<T>(p: Promise<T>, what: string, ms = 30_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

/** True on 'drain' within `ms`; false when none came (or the stream closed). */
function drainWithin(stream: PacketStream, ms: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const done = (drained: boolean): void => {
      clearTimeout(timer);
      stream.off('drain', onDrain);
      stream.off('close', onClose);
      resolve(drained);
    };
    const onDrain = (): void => done(true);
    const onClose = (): void => done(false);
    const timer = setTimeout(() => done(false), ms);
    stream.on('drain', onDrain);
    stream.on('close', onClose);
  });
}

const TRANSPORTS: Record<'h2' | 'grpc-js', Transport> = { h2: h2Transport, 'grpc-js': grpcJsPeerTransport };

async function bulkOverOneStream(t: ExecutionContext, clientKind: 'h2' | 'grpc-js', serverKind: 'h2' | 'grpc-js'): Promise<void> {
  const files = await throwawayTls();
  let accepted!: (s: PacketStream) => void;
  const serverStream = new Promise<PacketStream>((r) => (accepted = r));
  const received: Packet[] = [];
  const server: GrpcServerTransport = TRANSPORTS[serverKind].createServer(
    {
      agentConnect: (inc) => {
        const st = inc.accept({});
        // Not reading from the first moment: what the client may send is then what the windows allow.
        st.pause();
        st.on('packet', (p) => received.push(p));
        accepted(st);
      },
    },
    { maxReceiveMessageBytes: 4 << 20 },
  );
  const listener = await listenTls(files, (s) => server.injectConnection(s));
  const channel = TRANSPORTS[clientKind].createChannel({
    target: listener.target,
    tls: { ca: files.ca, cert: files.clientCert, key: files.clientKey },
  });
  t.teardown(async () => {
    channel.close();
    await server.close(100);
    await listener.close();
  });

  const stream = await step(channel.openStream(AGENT_SERVICE_CONNECT, {}, 10_000), 'the stream opens');
  const peer = await step(serverStream, 'the server accepts the stream');

  // The receiver does not read: the sender is held back (send() says wait and no 'drain' follows)
  // before it has handed the transport more than the windows and buffers between them can hold.
  let seq = 0;
  let heldBack = false;
  while (seq < PACKETS && !heldBack) {
    if (!stream.send({ type: PacketType.DATA, connectID: 1, error: '', data: payload(seq++) })) {
      // A drain may still come while the queue moves into the peer's window; one that does not come is the hold.
      heldBack = !(await drainWithin(stream, QUIET_MS));
    }
  }
  t.true(heldBack, `the sender took all ${seq} packets (${seq * CHUNK} bytes) from a receiver that does not read`);
  t.true(seq * CHUNK <= MAX_UNREAD_BYTES, `${seq * CHUNK} bytes taken before the sender was held back`);
  t.false(stream.closed, 'the stream stays open while held back');

  // The receiver reads again: the rest flows with the sender waiting for 'drain' each time it is told to.
  peer.resume();
  while (seq < PACKETS) {
    if (!stream.send({ type: PacketType.DATA, connectID: 1, error: '', data: payload(seq) })) {
      await step(drainOrClose(stream), `drain after packet ${seq}`);
      t.false(stream.closed, `the stream closed while sending packet ${seq}`);
    }
    seq++;
  }
  const all = new Promise<void>((resolve) => {
    const check = (): void => {
      if (received.length < PACKETS) return;
      peer.off('packet', check);
      resolve();
    };
    peer.on('packet', check);
    check();
  });
  await step(all, `all ${PACKETS} packets arrive (${received.length} so far)`);

  t.is(received.length, PACKETS);
  const wrong = received.findIndex((p, i) => p.type !== PacketType.DATA || p.connectID !== 1 || !Buffer.from(p.data).equals(payload(i)));
  t.is(wrong, -1, `packet ${wrong} arrived out of order or changed`);

  const closed = new Promise<void>((r) => (peer.closed ? r() : peer.once('close', () => r())));
  stream.end();
  peer.end();
  await step(closed, "the server's stream closes after both ends");
}

for (const [client, server] of [
  ['h2', 'h2'],
  ['grpc-js', 'grpc-js'],
  ['h2', 'grpc-js'],
  ['grpc-js', 'h2'],
] as const) {
  test.serial(
    `${client} client -> ${server} server: ${PACKETS} DATA packets arrive intact and in order; a paused receiver holds the sender back`,
    (t) => bulkOverOneStream(t, client, server),
  );
}
