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

test('without half-close, finish() whose FIN closes the connection ends there: no flush starts on a closed connection', (t) => {
  // A relay partner's close calls finish() (splice.ts PartnerEnd); with a peer that has no half-close
  // the FIN it sends closes the connection inside that call.
  const { host, conn, end } = connection({ halfClose: false, flowControl: false });
  t.notThrows(() => conn.finish());
  t.is(conn.state, 'closed');
  t.deepEqual(host.sent, ['CLOSE_RSP ']);
  t.deepEqual(end.events, ['abort']);
  t.notThrows(() => conn.finish());
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

test('each kind of close names who ended the connection and why (the audit log), whose FIN came first winning a clean end', (t) => {
  const oursFirst = connection();
  oursFirst.conn.end();
  oursFirst.conn.receiveHalfClose();
  t.deepEqual([oursFirst.conn.endedBy, oursFirst.conn.closeReason], ['local', 'finished']);

  const theirsFirst = connection();
  theirsFirst.conn.receiveHalfClose();
  theirsFirst.conn.end();
  t.deepEqual([theirsFirst.conn.endedBy, theirsFirst.conn.closeReason], ['peer', 'finished']);

  // Our local end's FIN waits behind unsent bytes when the peer's arrives: ours still came first.
  const pending = connection();
  pending.host.writable = false;
  pending.conn.send(Buffer.alloc(256 * KiB));
  pending.conn.end();
  pending.conn.receiveHalfClose();
  t.is(pending.conn.state, 'peer-ended');
  t.is(pending.conn.endedBy, undefined, 'nobody has ended it before it closes');
  t.is(pending.conn.closeReason, '');
  pending.conn.receiveClose('');
  t.deepEqual([pending.conn.endedBy, pending.conn.closeReason], ['local', 'closed']);

  const peerFailed = connection();
  peerFailed.conn.end();
  peerFailed.conn.receiveClose('read: connection reset by peer');
  t.deepEqual([peerFailed.conn.endedBy, peerFailed.conn.closeReason], ['peer', 'closed by peer: read: connection reset by peer']);
  t.deepEqual(peerFailed.end.events, ['abort: closed by peer: read: connection reset by peer'], 'a failure drops what the local end holds');
  t.deepEqual(peerFailed.host.sent, ['HALF_CLOSE'], 'the peer is not told of its own close');

  const cut = connection();
  cut.conn.close(new Error('limit'), 'proxy');
  t.deepEqual([cut.conn.endedBy, cut.conn.closeReason], ['proxy', 'limit']);
  t.deepEqual(cut.host.sent, ['CLOSE_RSP limit']);

  const lost = connection();
  lost.conn.end();
  lost.conn.abandon(new Error('tunnel closed'));
  t.deepEqual([lost.conn.endedBy, lost.conn.closeReason], ['tunnel', 'tunnel closed']);
  t.deepEqual(lost.host.sent, ['HALF_CLOSE']);

  const finished = connection();
  finished.conn.finish();
  t.deepEqual([finished.conn.endedBy, finished.conn.closeReason], ['local', 'finished']);
  t.deepEqual(finished.host.sent, ['HALF_CLOSE', 'CLOSE_RSP '], 'our FIN, then the close, told to the peer');
  t.deepEqual(finished.end.events, ['abort']);
});

test('at debug level each move of the connection is logged; below it nothing is', (t) => {
  const lines: string[] = [];
  const log = pino({ level: 'debug' }, { write: (line: string) => lines.push((JSON.parse(line) as { msg: string }).msg) });
  const limits = resolveLimits({});
  const options = (connectID: number, l: pino.Logger) => ({
    connectID,
    dialID: 7n,
    address: 'pod:80',
    role: 'performer' as const,
    rules: connectionRules(new Set([Feature.Window, Feature.HalfClose]), limits),
    limits,
    log: l,
  });
  const conn = new TunnelConnection(new RecordingHost(), options(1, log));
  conn.attach(new RecordingEnd());
  conn.end();
  conn.receiveHalfClose();
  t.deepEqual(lines, [
    'connection (our direction): open -> fin-pending',
    'connection (our direction): fin-pending -> fin-sent',
    'connection (peer direction): open -> ended (after ours)',
    'connection: live -> closed (both-ended, by local)',
  ]);
  lines.length = 0;
  const quiet = new TunnelConnection(new RecordingHost(), options(2, log.child({}, { level: 'info' })));
  quiet.attach(new RecordingEnd());
  quiet.close();
  t.deepEqual(lines, []);
});
