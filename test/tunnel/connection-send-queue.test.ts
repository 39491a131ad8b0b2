/**
 * The send side of one connection with resume (src/tunnel/connection-send-queue.ts)
 * over its slabs: what is retained is a copy and within retainLimit, partial
 * and whole acknowledgements free slabs, a resume and a lingering replay send
 * exactly what the peer lacks, and impossible numbers from the peer change nothing.
 */
import test from 'ava';
import { ConnectionSendQueue, type SendHost } from '../../src/tunnel/connection-send-queue.js';
import { SlabPool } from '../../src/tunnel/slab-pool.js';

/** Every piece copied as it is sent (no paced GCs): the tests see the slabs at once. */
const scavenges = { active: false, beforeNext: () => undefined, cancel: () => undefined };

const SLAB = 16;

/** A transport that takes everything and records what was sent, as copies (the queue may not rely on it copying). */
function recordingHost(): SendHost & { sent: Buffer[]; bytes(): Buffer; clear(): void } {
  const sent: Buffer[] = [];
  return {
    writable: true,
    sent,
    sendData: (_id, data) => void sent.push(Buffer.from(data)),
    whenWritable: () => undefined,
    bytes: () => Buffer.concat(sent),
    clear: () => void (sent.length = 0),
  };
}

function bytesFrom(start: number, n: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (start + i) % 251;
  return b;
}

function queue(opts: { window?: number; retainLimit?: number; maxDataBytes?: number } = {}) {
  const host = recordingHost();
  const pool = new SlabPool({ slabBytes: SLAB, maxFreeSlabs: 1024, trimEveryMs: 3_600_000 });
  const q = new ConnectionSendQueue({
    host,
    connectID: 7,
    window: opts.window ?? 1 << 20,
    maxDataBytes: opts.maxDataBytes ?? 40,
    onProgress: () => undefined,
    retain: true,
    retainLimit: opts.retainLimit ?? 1 << 20,
    slabs: pool,
    scavenges,
  });
  return { host, pool, q };
}

test('what is retained is a copy: the local end may reuse its read buffer at once, a resume still sends the original bytes', (t) => {
  const { host, pool, q } = queue();
  const read = bytesFrom(0, 100);
  t.true(q.push(read));
  t.deepEqual(host.bytes(), bytesFrom(0, 100));
  t.true(
    host.sent.every((p) => p.length <= 40),
    'DATA pieces stay within maxDataBytes',
  );
  read.fill(0); // a reused read buffer
  host.clear();
  q.suspend();
  t.deepEqual(q.resumeAt(30, 1 << 20), { resent: 70 });
  t.deepEqual(host.bytes(), bytesFrom(30, 70), 'exactly what the peer lacks, byte-exact');
  t.is(q.unacknowledged, 70, 'sent again and retained again');
  t.true(q.acknowledge(100));
  t.is(q.unacknowledged, 0);
  t.is(pool.inUse, 0, 'everything acknowledged: the connection holds no slab');
});

test('partial acknowledgements free whole slabs as they pass; an old acknowledgement frees nothing', (t) => {
  const { pool, q } = queue();
  q.push(bytesFrom(0, 10 * SLAB));
  t.is(pool.inUse, 10);
  t.true(q.acknowledge(SLAB + 3));
  t.is(pool.inUse, 9);
  t.is(q.unacknowledged, 9 * SLAB - 3);
  t.true(q.acknowledge(5), 'an acknowledgement older than the last one is no fault');
  t.is(q.unacknowledged, 9 * SLAB - 3, 'and drops nothing');
  t.true(q.acknowledge(4 * SLAB));
  t.is(pool.inUse, 6);
});

test('resend after many wraps through the slabs: interleaved sends and acknowledgements, then a resume mid-slab', (t) => {
  const { host, pool, q } = queue();
  let sent = 0;
  let acked = 0;
  for (let i = 0; i < 200; i++) {
    const n = 1 + ((i * 37) % 55);
    q.push(bytesFrom(sent, n));
    sent += n;
    if (i % 3 === 2) {
      acked = sent - ((i * 11) % Math.min(sent - acked, 50));
      t.true(q.acknowledge(acked));
    }
  }
  t.is(q.sent, sent);
  t.is(q.unacknowledged, sent - acked);
  t.true(pool.inUse <= Math.ceil((sent - acked) / SLAB) + 1);
  const received = acked + Math.min(5, sent - acked);
  host.clear();
  q.suspend();
  t.deepEqual(q.resumeAt(received, received + (1 << 20)), { resent: sent - received });
  t.deepEqual(host.bytes(), bytesFrom(received, sent - received));
  q.push(bytesFrom(sent, 20));
  t.deepEqual(host.bytes(), bytesFrom(received, sent + 20 - received), 'new bytes follow the resent ones');
});

test('retention stops at retainLimit whatever the window; an acknowledgement lets the rest go, within the limit again', (t) => {
  const { host, pool, q } = queue({ retainLimit: 5 * SLAB, window: 1 << 20 });
  t.false(q.push(bytesFrom(0, 8 * SLAB)), 'not idle: held back by retention');
  t.is(q.sent, 5 * SLAB);
  t.is(q.unacknowledged, 5 * SLAB);
  t.is(q.queuedBytes, 3 * SLAB);
  t.is(pool.inUse, 5);
  t.true(q.acknowledge(2 * SLAB));
  t.is(q.sent, 7 * SLAB);
  t.is(q.unacknowledged, 5 * SLAB);
  t.true(q.acknowledge(7 * SLAB));
  t.is(q.sent, 8 * SLAB);
  t.deepEqual(host.bytes(), bytesFrom(0, 8 * SLAB));
  t.true(pool.inUse <= 2);
});

test("impossible numbers from the peer are refused and change nothing: more than was sent, before what it acknowledged, a limit beyond the protocol's window", (t) => {
  const { host, pool, q } = queue();
  q.push(bytesFrom(0, 50));
  t.true(q.acknowledge(20));
  t.false(q.acknowledge(51));
  q.suspend();
  const before = { unacknowledged: q.unacknowledged, sent: q.sent, slabs: pool.inUse };
  host.clear();
  t.true('fault' in q.resumeAt(19, 1 << 20));
  t.true('fault' in q.resumeAt(51, 1 << 20));
  const window = q.resumeAt(30, 30 + 2 ** 40);
  t.true('fault' in window && window.window === true);
  t.deepEqual({ unacknowledged: q.unacknowledged, sent: q.sent, slabs: pool.inUse }, before);
  t.is(host.sent.length, 0, 'nothing was sent');
  t.true(q.isSuspended);
});

test('a lingering replay sends copies: releasing the slabs, and another connection filling them, leaves what was handed to the transport intact', (t) => {
  const pool = new SlabPool({ slabBytes: SLAB, maxFreeSlabs: 1024, trimEveryMs: 3_600_000 });
  const handed: Uint8Array[] = [];
  const host: SendHost = { writable: true, sendData: (_id, d) => void handed.push(d), whenWritable: () => undefined };
  const common = {
    host,
    window: 1 << 20,
    maxDataBytes: 40,
    onProgress: () => undefined,
    retain: true,
    retainLimit: 1 << 20,
    slabs: pool,
    scavenges,
  };
  const closed = new ConnectionSendQueue({ ...common, connectID: 1 });
  closed.push(bytesFrom(0, 100));
  closed.stop();
  handed.length = 0;
  t.is(closed.replayClosed(25), 75);
  const replayed = handed.splice(0);
  t.true(replayed.every((p) => p.length <= 40));
  closed.release();
  t.is(pool.inUse, 0);
  const other = new ConnectionSendQueue({ ...common, connectID: 2 });
  other.push(Buffer.alloc(100, 0xaa)); // takes the slabs just given back
  t.deepEqual(Buffer.concat(replayed), bytesFrom(25, 75));
  t.is(closed.replayClosed(10), -1, 'before what it acknowledged: impossible');
});

test('release forgets what was retained and gives its slabs back', (t) => {
  const { pool, q } = queue();
  q.push(bytesFrom(0, 77));
  q.release();
  t.is(q.unacknowledged, 0);
  t.is(pool.inUse, 0);
});
