/**
 * A TunnelConnection's life on its own (src/tunnel/connection.ts): the
 * states it passes through and what it tells the peer and its local end on
 * each way out, with a recording tunnel and local end instead of a stream.
 */
import test from 'ava';
import { Stream } from 'node:stream';
import { pino } from 'pino';
import { TunnelConnection, type ConnectionHost, type ConnectionRole } from '../../src/tunnel/connection.js';
import type { LocalClose, LocalEnd } from '../../src/tunnel/local-end.js';
import { resolveLimits } from '../../src/tunnel/limits.js';
import { connectionRules } from '../../src/tunnel/connection-rules.js';
import { Feature } from '../../src/wire/features.js';
import { WindowGrowthBudget } from '../../src/tunnel/receive-window.js';
import { duplexPair } from '../helpers/memory-stream.js';
import { splice } from '../../src/tunnel/splice.js';

const KiB = 1024;

/** A tunnel that records what the connection sends. */
class RecordingHost implements ConnectionHost {
  writable = true;
  readonly windowGrowth = new WindowGrowthBudget(0);
  readonly sent: string[] = [];
  data = 0;
  forgotten = false;
  private waiters: (() => void)[] = [];
  sendData(_id: number, data: Uint8Array): void {
    this.data += data.length;
  }
  whenWritable(resume: () => void): void {
    this.waiters.push(resume);
  }
  drain(): void {
    this.writable = true;
    for (const w of this.waiters.splice(0)) w();
  }
  holdInbound(_id: number, hold: boolean): void {
    this.sent.push(hold ? 'hold' : 'release');
  }
  noteUnflowedBytes(): void {}
  sendWindow(_id: number, increment: number): void {
    this.sent.push(`WINDOW ${increment}`);
  }
  sendHalfClose(): void {
    this.sent.push('HALF_CLOSE');
  }
  sendClose(_id: number, role: ConnectionRole, reason: string): void {
    this.sent.push(role === 'dialer' ? 'CLOSE_REQ' : `CLOSE_RSP ${reason}`);
  }
  forget(): void {
    this.forgotten = true;
  }
  windowFault(): void {
    this.sent.push('WINDOW_FAULT');
  }
}

/** A local end that records what it is told; its reader takes nothing until take(). */
class RecordingEnd implements LocalEnd {
  readonly events: string[] = [];
  undeliveredBytes = 0;
  deliver(chunk: Buffer): void {
    this.undeliveredBytes += chunk.length;
    this.events.push(`data ${chunk.toString()}`);
  }
  peerEnded(): void {
    this.events.push('end');
  }
  connectionClosed(how: LocalClose, error?: Error): void {
    this.events.push(error ? `${how}: ${error.message}` : how);
  }
  sendProgress(): void {}
}

function connection(opts: { halfClose?: boolean; flowControl?: boolean; windowBytes?: number; spliced?: boolean } = {}) {
  const host = new RecordingHost();
  const features = new Set<Feature>();
  if (opts.flowControl ?? true) features.add(Feature.Window);
  if (opts.halfClose ?? true) features.add(Feature.HalfClose);
  const limits = resolveLimits({ windowBytes: opts.windowBytes ?? 64 * KiB });
  const conn = new TunnelConnection(host, {
    connectID: 1,
    dialID: 7n,
    address: 'pod:80',
    role: 'performer',
    rules: connectionRules(features, limits),
    limits,
    log: pino({ level: 'silent' }),
  });
  const end = new RecordingEnd();
  if (!opts.spliced) conn.attach(end);
  return { host, conn, end };
}

test('a connection is not a Node stream: it is spliced to its socket by four listeners and no pipe()', (t) => {
  const { conn } = connection({ spliced: true });
  t.false(conn instanceof Stream);
  const [socket, other] = duplexPair();
  const before = socket.eventNames().map((e) => `${String(e)} ${socket.listenerCount(e)}`);
  splice(socket, conn);
  const added = socket.eventNames().flatMap((e) => {
    const n = socket.listenerCount(e) - Number(before.find((b) => b.startsWith(`${String(e)} `))?.split(' ')[1] ?? 0);
    return n > 0 ? [`${String(e)} ${n}`] : [];
  });
  t.deepEqual(added.sort(), ['close 1', 'data 1', 'end 1', 'error 1']);
  other.destroy();
});

test('both FINs: open -> local-ended -> closed; nothing more is sent, the local end flushes', (t) => {
  const { host, conn, end } = connection();
  t.is(conn.state, 'open');
  conn.send(Buffer.from('request'));
  conn.end();
  t.is(conn.state, 'local-ended');
  t.deepEqual(host.sent, ['HALF_CLOSE']);
  t.true(conn.send(Buffer.from('late')), 'bytes after the FIN are dropped');
  t.is(host.data, 7);
  conn.receiveData(Buffer.from('answer'));
  conn.receiveHalfClose();
  t.is(conn.state, 'closed');
  t.deepEqual(host.sent, ['HALF_CLOSE'], 'both FINs passed: no close packet');
  t.deepEqual(end.events, ['data answer', 'end', 'flush']);
  t.true(host.forgotten);
});

test('the peer FINs first: open -> peer-ended; our FIN closes it; DATA after the peer FIN is a fault', (t) => {
  const a = connection();
  a.conn.receiveHalfClose();
  t.is(a.conn.state, 'peer-ended');
  t.false(a.host.forgotten);
  a.conn.end();
  t.is(a.conn.state, 'closed');
  t.deepEqual(a.host.sent, ['HALF_CLOSE']);

  const b = connection();
  b.conn.receiveHalfClose();
  b.conn.receiveData(Buffer.from('x'));
  t.is(b.conn.state, 'closed');
  t.deepEqual(b.host.sent, ['CLOSE_RSP peer sent DATA after closing its side']);
  t.deepEqual(b.end.events, ['end', 'abort: peer sent DATA after closing its side']);
});

test('our FIN waits behind bytes the window does not let out yet', (t) => {
  const { host, conn } = connection({ windowBytes: 4 });
  t.false(conn.send(Buffer.from('0123456789')), 'the window takes 4 of 10 bytes');
  conn.end();
  t.is(conn.state, 'open', 'the FIN waits');
  t.deepEqual(host.sent, []);
  conn.receiveWindow(4);
  t.is(host.data, 8);
  t.is(conn.state, 'open');
  conn.receiveWindow(4);
  t.is(host.data, 10);
  t.is(conn.state, 'local-ended');
  t.deepEqual(host.sent, ['HALF_CLOSE']);
});

test('the transport being full holds the local end; its drain lets it go on', (t) => {
  const { host, conn } = connection();
  host.writable = false;
  t.false(conn.send(Buffer.from('abc')));
  t.false(conn.ready);
  host.drain();
  t.is(host.data, 3);
  t.true(conn.ready);
});

test('without half-close (upstream peers) a FIN closes the whole connection', (t) => {
  const { host, conn, end } = connection({ halfClose: false, flowControl: false });
  conn.end();
  t.is(conn.state, 'closed');
  t.deepEqual(host.sent, ['CLOSE_RSP ']);
  t.deepEqual(end.events, ['abort']);
});

test('the peer closes: cleanly, what it sent is flushed; with an error, it is dropped; neither is answered', (t) => {
  const clean = connection();
  clean.conn.receiveData(Buffer.from('last'));
  clean.conn.receiveClose('');
  t.is(clean.conn.state, 'closed');
  t.deepEqual(clean.end.events, ['data last', 'flush']);
  t.deepEqual(clean.host.sent, []);

  const failed = connection();
  failed.conn.receiveClose('connection reset');
  t.deepEqual(failed.end.events, ['abort: closed by peer: connection reset']);
  t.deepEqual(failed.host.sent, []);

  const abandoned = connection();
  abandoned.conn.abandon(new Error('tunnel closed'));
  t.deepEqual(abandoned.end.events, ['abort: tunnel closed']);
  t.deepEqual(abandoned.host.sent, []);
});

test('a peer that overruns the window is closed with the reason', (t) => {
  const { host, conn } = connection({ windowBytes: 4 });
  conn.receiveData(Buffer.from('1234'));
  t.is(conn.state, 'open');
  conn.receiveData(Buffer.from('5'));
  t.is(conn.state, 'closed');
  t.deepEqual(host.sent, ['CLOSE_RSP peer overran the flow-control window (5 > 4 bytes)']);
});

test('credit goes back as the local reader takes bytes, in quarter windows', (t) => {
  const { host, conn, end } = connection({ windowBytes: 16 });
  conn.receiveData(Buffer.from('0123456789abcdef'));
  end.undeliveredBytes = 13;
  conn.taken();
  t.deepEqual(host.sent, [], 'three bytes taken: under a quarter window');
  end.undeliveredBytes = 12;
  conn.taken();
  t.deepEqual(host.sent, ['WINDOW 4']);
});

test('what arrives before a local end is attached reaches it in order, with the FIN and the close', (t) => {
  const host = new RecordingHost();
  const conn = new TunnelConnection(host, {
    connectID: 2,
    dialID: 8n,
    address: 'kas:6443',
    role: 'dialer',
    rules: connectionRules(new Set([Feature.Window, Feature.HalfClose]), resolveLimits()),
    limits: resolveLimits(),
    log: pino({ level: 'silent' }),
  });
  conn.receiveData(Buffer.from('a'));
  conn.receiveData(Buffer.from('b'));
  conn.receiveHalfClose();
  conn.receiveClose('');
  const end = new RecordingEnd();
  conn.attach(end);
  t.deepEqual(end.events, ['data a', 'data b', 'end', 'flush']);
});

test('a socket that closed before the splice closes its connection at once', async (t) => {
  const { host, conn } = connection({ spliced: true });
  const [socket] = duplexPair();
  socket.destroy();
  await new Promise((resolve) => socket.once('close', resolve));
  splice(socket, conn);
  t.is(conn.state, 'closed');
  t.deepEqual(host.sent, ['CLOSE_RSP ']);
});

test('a socket spliced while the transport is full is read once it drains', async (t) => {
  const { host, conn } = connection({ spliced: true });
  host.writable = false;
  const [socket, other] = duplexPair();
  splice(socket, conn);
  other.write('abc');
  await new Promise((resolve) => setImmediate(resolve));
  t.is(host.data, 0, 'nothing goes out while the transport is full');
  host.drain();
  await new Promise((resolve) => setImmediate(resolve));
  t.is(host.data, 3);
  other.destroy();
});
