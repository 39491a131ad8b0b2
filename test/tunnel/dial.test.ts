/**
 * The multiplexer's dial and close protocol over an in-memory PacketStream
 * pair: who assigns connectIDs, how failures, timeouts and cancellations
 * travel (DIAL_RSP error, DIAL_CLS, late DIAL_RSP -> CLOSE_REQ), CLOSE_REQ/
 * CLOSE_RSP, packets for unknown connections, and what a dying stream does
 * to pending dials and open connections.
 */
import test from 'ava';
import { PassThrough, type Duplex } from 'node:stream';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Tunnel, type DialHandler, type InboundDial } from '../../src/tunnel/tunnel.js';
import { DialError } from '../../src/tunnel/errors.js';
import type { TunnelLimits } from '../../src/tunnel/limits.js';
import type { ConnectionStream } from '../../src/tunnel/connection-stream.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { ALL_FEATURES, NO_FEATURES } from '../../src/wire/features.js';
import {
  captureLogger,
  createMemoryLink,
  duplexPair,
  nextPacket,
  readAll,
  tunnelPair,
  waitFor,
  type MemoryPacketStream,
} from '../helpers/memory-stream.js';
import { dialStream } from '../helpers/connection-stream.js';

const echo: DialHandler = () => Promise.resolve(new PassThrough());

/** A dial handler that never finishes on its own: it rejects when the dial is aborted. */
function hangingHandler(seen: InboundDial[]): DialHandler {
  return (dial) => {
    seen.push(dial);
    return new Promise<Duplex>((_resolve, reject) => {
      dial.signal.addEventListener('abort', () => reject(new Error('aborted')), { once: true });
    });
  };
}

async function roundTrip(conn: Duplex, text: string): Promise<string> {
  conn.write(text);
  const [chunk] = (await once(conn, 'data')) as [Buffer];
  return chunk.toString();
}

const zero = { connections: 0, pendingDials: 0, inboundDials: 0, windowGrowthBytes: 0, readPaused: false, detached: false };

function statsZero(...tunnels: Tunnel[]): boolean {
  return tunnels.every((t) => {
    const s = t.stats();
    return s.connections === 0 && s.pendingDials === 0 && s.inboundDials === 0;
  });
}

/** Resolves when `s` emits 'close' (unlike events.once, an 'error' before it does not reject). */
function closed(s: Duplex): Promise<void> {
  return new Promise((resolve) => (s.destroyed && s.closed ? resolve() : s.once('close', () => resolve())));
}

function dialError(err: unknown): DialError {
  if (!(err instanceof DialError)) throw new Error(`expected DialError, got ${String(err)}`);
  return err;
}

/** A Tunnel on link.a and the raw packets of its peer on link.b. */
function rawPeer(
  side: 'agent' | 'server',
  opts: { dialHandler?: DialHandler; features?: typeof ALL_FEATURES; limits?: Partial<TunnelLimits> } = {},
) {
  const link = createMemoryLink();
  const logs = captureLogger();
  const tunnel = new Tunnel(link.a, {
    side,
    features: opts.features ?? ALL_FEATURES,
    log: logs.log,
    dialHandler: opts.dialHandler,
    limits: opts.limits,
  });
  const received: Packet[] = [];
  link.b.on('packet', (p) => received.push(p));
  return { tunnel, peer: link.b, a: link.a, received, logs };
}

// ---------- dial and accept ----------

test('either side dials and the other performs; agent assigns odd connectIDs, server even', async (t) => {
  const agentDials: InboundDial[] = [];
  const serverDials: InboundDial[] = [];
  const pair = tunnelPair({
    features: ALL_FEATURES,
    agentDialHandler: (d) => (agentDials.push(d), Promise.resolve(new PassThrough())),
    serverDialHandler: (d) => (serverDials.push(d), Promise.resolve(new PassThrough())),
  });
  t.teardown(() => pair.close());

  const n = 12;
  const fromServer = Array.from({ length: n }, (_, i) => dialStream(pair.server, `pod-${i}:80`, { timeoutMs: 5000 }));
  const fromAgent = Array.from({ length: n }, (_, i) => dialStream(pair.agent, `kas-${i}:6443`, { timeoutMs: 5000 }));
  const serverConns = await Promise.all(fromServer);
  const agentConns = await Promise.all(fromAgent);

  // The agent performed the server's dials and assigned odd IDs; the server the agent's, even IDs.
  for (const c of serverConns) t.is(c.connection.connectID % 2, 1, `server-dialled connectID ${c.connection.connectID}`);
  for (const c of agentConns) t.is(c.connection.connectID % 2, 0, `agent-dialled connectID ${c.connection.connectID}`);
  const ids = new Set([...serverConns, ...agentConns].map((c) => c.connection.connectID));
  t.is(ids.size, 2 * n, 'connectIDs of both directions never collide');
  t.is(pair.agent.stats().connections, 2 * n);
  t.is(pair.server.stats().connections, 2 * n);

  // The performer saw the address and the dial ID the dialer chose.
  t.deepEqual(agentDials.map((d) => d.address).sort(), serverConns.map((c) => c.connection.address).sort());
  t.deepEqual(new Set(agentDials.map((d) => d.dialID)), new Set(serverConns.map((c) => c.connection.dialID)));
  t.true(agentDials.every((d) => d.protocol === 'tcp' && d.dialID > 0n));
  t.is(serverDials.length, n);

  // Bytes flow on every connection, in both directions.
  for (const [i, c] of [...serverConns, ...agentConns].entries()) t.is(await roundTrip(c, `ping ${i}`), `ping ${i}`);

  for (const c of [...serverConns, ...agentConns]) c.destroy();
  await waitFor(() => statsZero(pair.agent, pair.server), 'both tables empty');
  t.deepEqual(pair.agent.stats(), zero);
  t.deepEqual(pair.server.stats(), zero);
});

test('DIAL_RSP with an error rejects the dial with DialError "refused" carrying the message', async (t) => {
  const pair = tunnelPair({
    features: ALL_FEATURES,
    serverDialHandler: () => Promise.reject(new Error('dial tcp 10.0.0.9:443: connect: connection refused')),
  });
  t.teardown(() => pair.close());
  const err = dialError(await t.throwsAsync(pair.agent.dial('10.0.0.9:443', { timeoutMs: 5000 })));
  t.is(err.failure, 'refused');
  t.regex(err.message, /connection refused/);
  const rsp = pair.link.b.sent.find((p) => p.type === PacketType.DIAL_RSP);
  t.is(rsp?.type === PacketType.DIAL_RSP ? rsp.connectID : -1, 0);
  t.deepEqual(pair.agent.stats(), zero);
  t.deepEqual(pair.server.stats(), zero);
});

test('a side without a dial handler refuses DIAL_REQ with its reason; other protocols are refused', async (t) => {
  const link = createMemoryLink();
  const logs = captureLogger();
  const server = new Tunnel(link.b, {
    side: 'server',
    features: ALL_FEATURES,
    log: logs.log,
    refuseDialsReason: 'node -> control plane dials were not negotiated',
  });
  const agent = new Tunnel(link.a, { side: 'agent', features: ALL_FEATURES, log: captureLogger().log, dialHandler: echo });
  t.teardown(() => (agent.close(), server.close()));
  const err = dialError(await t.throwsAsync(agent.dial('kas:6443', { timeoutMs: 5000 })));
  t.is(err.failure, 'refused');
  t.regex(err.message, /not negotiated/);
  t.is(logs.matching('refusing dial request').length, 1);

  const udp = dialError(await t.throwsAsync(server.dial('pod:53', { timeoutMs: 5000, protocol: 'udp' })));
  t.is(udp.failure, 'refused');
  t.regex(udp.message, /unsupported protocol "udp"/);
});

test('dial timeout: DialError "timeout", DIAL_CLS sent with the dial ID, the performer is aborted', async (t) => {
  const seen: InboundDial[] = [];
  const pair = tunnelPair({ features: ALL_FEATURES, serverDialHandler: hangingHandler(seen) });
  t.teardown(() => pair.close());
  const err = dialError(await t.throwsAsync(pair.agent.dial('slow:1', { timeoutMs: 100 })));
  t.is(err.failure, 'timeout');
  t.regex(err.message, /timed out after 100 ms/);
  const req = pair.link.a.sent.find((p) => p.type === PacketType.DIAL_REQ);
  const cls = pair.link.a.sent.find((p) => p.type === PacketType.DIAL_CLS);
  t.truthy(req && cls);
  t.is(cls?.type === PacketType.DIAL_CLS ? cls.random : 0n, req?.type === PacketType.DIAL_REQ ? req.random : 1n);
  await waitFor(() => seen[0]?.signal.aborted === true, 'performer signal aborted');
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
  await sleep(20);
  // The aborted performer must not answer.
  t.falsy(pair.link.b.sent.find((p) => p.type === PacketType.DIAL_RSP));
});

test('abort signal: DialError "cancelled" and DIAL_CLS; an already aborted signal sends nothing', async (t) => {
  const seen: InboundDial[] = [];
  const pair = tunnelPair({ features: ALL_FEATURES, serverDialHandler: hangingHandler(seen) });
  t.teardown(() => pair.close());
  const abort = new AbortController();
  const dialing = dialStream(pair.agent, 'kas:6443', { timeoutMs: 5000, signal: abort.signal });
  await waitFor(() => seen.length === 1, 'performer started');
  t.is(pair.agent.stats().pendingDials, 1);
  t.is(pair.server.stats().inboundDials, 1);
  abort.abort();
  const err = dialError(await t.throwsAsync(dialing));
  t.is(err.failure, 'cancelled');
  const cls = await waitFor(() => pair.link.a.sent.some((p) => p.type === PacketType.DIAL_CLS), 'DIAL_CLS').then(() =>
    pair.link.a.sent.find((p) => p.type === PacketType.DIAL_CLS),
  );
  t.is(cls?.type === PacketType.DIAL_CLS ? cls.random : 0n, seen[0].dialID);
  await waitFor(() => seen[0].signal.aborted, 'performer aborted');
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');

  const before = pair.link.a.packetsSent;
  const gone = new AbortController();
  gone.abort();
  const err2 = dialError(await t.throwsAsync(pair.agent.dial('kas:6443', { timeoutMs: 5000, signal: gone.signal })));
  t.is(err2.failure, 'cancelled');
  t.is(pair.link.a.packetsSent, before, 'no DIAL_REQ for a dial cancelled before it started');
});

test('a DIAL_RSP that arrives after the dial was cancelled is answered with CLOSE_REQ', async (t) => {
  const { tunnel, peer } = rawPeer('server');
  t.teardown(() => tunnel.close());
  const abort = new AbortController();
  const reqP = nextPacket(peer, PacketType.DIAL_REQ);
  const dialing = dialStream(tunnel, 'pod:80', { timeoutMs: 5000, signal: abort.signal });
  const req = await reqP;
  const clsP = nextPacket(peer, PacketType.DIAL_CLS);
  abort.abort();
  t.is(dialError(await t.throwsAsync(dialing)).failure, 'cancelled');
  t.is((await clsP).random, req.random);

  // The peer had already dialled: its DIAL_RSP crosses our DIAL_CLS.
  const closeP = nextPacket(peer, PacketType.CLOSE_REQ);
  peer.send({ type: PacketType.DIAL_RSP, random: req.random, connectID: 7, error: '' });
  t.is((await closeP).connectID, 7);
  t.deepEqual(tunnel.stats(), zero);

  // A late DIAL_RSP carrying an error needs no answer.
  const before = peer.other.packetsSent;
  peer.send({ type: PacketType.DIAL_RSP, random: req.random, connectID: 0, error: 'too late' });
  await sleep(20);
  t.is(peer.other.packetsSent, before);
});

test('DIAL_CLS from the dialer aborts the performer; a dial that completes anyway is discarded', async (t) => {
  const seen: InboundDial[] = [];
  const endpoints: Duplex[] = [];
  let finish: (() => void) | undefined;
  const { tunnel, peer, received } = rawPeer('agent', {
    dialHandler: (dial) => {
      seen.push(dial);
      // Ignores the signal: completes when the test says so.
      return new Promise<Duplex>((resolve) => {
        finish = () => {
          const [mine] = duplexPair();
          endpoints.push(mine);
          resolve(mine);
        };
      });
    },
  });
  t.teardown(() => tunnel.close());
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:80', random: 99n });
  await waitFor(() => seen.length === 1, 'handler called');
  t.is(seen[0].dialID, 99n);
  t.false(seen[0].signal.aborted);
  t.is(tunnel.stats().inboundDials, 1);
  peer.send({ type: PacketType.DIAL_CLS, random: 99n });
  await waitFor(() => seen[0].signal.aborted, 'handler signal aborted');
  t.is(tunnel.stats().inboundDials, 0);
  finish!();
  await waitFor(() => endpoints[0]?.destroyed === true, 'late endpoint destroyed');
  await sleep(20);
  t.false(
    received.some((p) => p.type === PacketType.DIAL_RSP),
    'no DIAL_RSP for a cancelled dial',
  );
  t.deepEqual(tunnel.stats(), zero);
});

test('DIAL_CLS from the performer rejects the pending dial', async (t) => {
  const { tunnel, peer } = rawPeer('server');
  t.teardown(() => tunnel.close());
  const reqP = nextPacket(peer, PacketType.DIAL_REQ);
  const dialing = dialStream(tunnel, 'pod:80', { timeoutMs: 5000 });
  const req = await reqP;
  peer.send({ type: PacketType.DIAL_CLS, random: req.random });
  const err = dialError(await t.throwsAsync(dialing));
  t.is(err.failure, 'refused');
  t.deepEqual(tunnel.stats(), zero);
});

test('a DIAL_RSP with connectID 0 and no error, or a connectID in use, is refused', async (t) => {
  const { tunnel, peer } = rawPeer('server');
  t.teardown(() => tunnel.close());
  const req1P = nextPacket(peer, PacketType.DIAL_REQ);
  const d1 = dialStream(tunnel, 'pod:80', { timeoutMs: 5000 });
  peer.send({ type: PacketType.DIAL_RSP, random: (await req1P).random, connectID: 0, error: '' });
  t.regex(dialError(await t.throwsAsync(d1)).message, /unusable connectID 0/);

  const req2P = nextPacket(peer, PacketType.DIAL_REQ);
  const d2 = dialStream(tunnel, 'pod:81', { timeoutMs: 5000 });
  peer.send({ type: PacketType.DIAL_RSP, random: (await req2P).random, connectID: 5, error: '' });
  const c2 = await d2;
  t.is(c2.connection.connectID, 5);
  const req3P = nextPacket(peer, PacketType.DIAL_REQ);
  const d3 = dialStream(tunnel, 'pod:82', { timeoutMs: 5000 });
  peer.send({ type: PacketType.DIAL_RSP, random: (await req3P).random, connectID: 5, error: '' });
  t.regex(dialError(await t.throwsAsync(d3)).message, /unusable connectID 5/);
  t.false(c2.destroyed, 'the existing connection is untouched');
  c2.destroy();
  await waitFor(() => statsZero(tunnel), 'table empty');
});

// ---------- closing ----------

test('CLOSE_REQ is answered with CLOSE_RSP and closes the endpoint; unknown IDs get an error', async (t) => {
  const far: Duplex[] = [];
  const { tunnel, peer } = rawPeer('agent', {
    dialHandler: () => {
      const [mine, theirs] = duplexPair();
      far.push(theirs);
      return Promise.resolve(mine);
    },
  });
  t.teardown(() => tunnel.close());
  const rspP = nextPacket(peer, PacketType.DIAL_RSP);
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:80', random: 5n });
  const rsp = await rspP;
  t.is(rsp.error, '');
  t.is(rsp.random, 5n);
  t.is(rsp.connectID % 2, 1);
  const endpoint = far[0];
  const endpointEnded = readAll(endpoint);

  peer.send({ type: PacketType.DATA, connectID: rsp.connectID, error: '', data: Buffer.from('GET / HTTP/1.1\r\n\r\n') });
  const closeRspP = nextPacket(peer, PacketType.CLOSE_RSP);
  peer.send({ type: PacketType.CLOSE_REQ, connectID: rsp.connectID });
  const closeRsp = await closeRspP;
  t.is(closeRsp.connectID, rsp.connectID);
  t.is(closeRsp.error, '');
  // What was sent before CLOSE_REQ still reaches the endpoint, then it ends.
  t.is((await endpointEnded).toString(), 'GET / HTTP/1.1\r\n\r\n');
  await waitFor(() => statsZero(tunnel), 'table empty');

  const unknownP = nextPacket(peer, PacketType.CLOSE_RSP);
  peer.send({ type: PacketType.CLOSE_REQ, connectID: 12345 });
  const unknown = await unknownP;
  t.is(unknown.connectID, 12345);
  t.is(unknown.error, 'unknown connectID');
});

test('the performer reports a closed endpoint with CLOSE_RSP; the dialer closes with CLOSE_REQ', async (t) => {
  const far: Duplex[] = [];
  const pair = tunnelPair({
    features: ALL_FEATURES,
    agentDialHandler: () => {
      const [mine, theirs] = duplexPair();
      far.push(theirs);
      return Promise.resolve(mine);
    },
  });
  t.teardown(() => pair.close());
  const c1 = await dialStream(pair.server, 'pod:80', { timeoutMs: 5000 });
  c1.resume();
  far[0].destroy(); // the pod's socket goes away
  await closed(c1);
  t.true(
    pair.link.a.sent.some((p) => p.type === PacketType.CLOSE_RSP && p.connectID === c1.connection.connectID),
    'agent (performer) sent CLOSE_RSP',
  );

  const c2 = await dialStream(pair.server, 'pod:80', { timeoutMs: 5000 });
  const farEnd = far[1];
  const farEnded = readAll(farEnd);
  c2.destroy();
  t.is((await farEnded).length, 0, 'the far endpoint sees EOF');
  t.true(
    pair.link.b.sent.some((p) => p.type === PacketType.CLOSE_REQ && p.connectID === c2.connection.connectID),
    'server (dialer) sent CLOSE_REQ',
  );
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
});

// ---------- unknown connections and garbage ----------

for (const side of ['server', 'agent'] as const) {
  test(`DATA for an unknown connectID on the ${side} side: answered, logged once, tunnel stays up`, async (t) => {
    const pair = tunnelPair({ features: ALL_FEATURES, agentDialHandler: echo, serverDialHandler: echo });
    t.teardown(() => pair.close());
    const target = side === 'server' ? pair.server : pair.agent;
    const targetStream: MemoryPacketStream = side === 'server' ? pair.link.b : pair.link.a;
    const intruder: MemoryPacketStream = side === 'server' ? pair.link.a : pair.link.b;
    const logs = side === 'server' ? pair.serverLog : pair.agentLog;

    for (let i = 0; i < 100; i++) intruder.send({ type: PacketType.DATA, connectID: 1000 + i, error: '', data: Buffer.from('x') });
    intruder.send({ type: PacketType.KANAL_HALF_CLOSE, connectID: 5000 });
    await waitFor(
      () => targetStream.sent.filter((p) => p.type === (side === 'server' ? PacketType.CLOSE_REQ : PacketType.CLOSE_RSP)).length >= 101,
      'answers',
    );
    const answers = targetStream.sent.filter((p) => 'connectID' in p && p.connectID >= 1000);
    if (side === 'server') {
      t.true(
        answers.every((p) => p.type === PacketType.CLOSE_REQ),
        'server answers CLOSE_REQ',
      );
    } else {
      t.true(
        answers.every((p) => p.type === PacketType.CLOSE_RSP && p.error === 'unknown connectID'),
        'agent answers CLOSE_RSP',
      );
    }
    t.deepEqual(
      answers.map((p) => ('connectID' in p ? p.connectID : -1)).sort((x, y) => x - y),
      [...Array.from({ length: 100 }, (_, i) => 1000 + i), 5000],
    );
    // Rate-limited: one warning for 101 bad packets.
    t.is(logs.matching('unknown connectID').length, 1);
    t.false(target.closed);

    // The answers do not start a ping-pong, and the tunnel still works in both directions.
    await sleep(30);
    const sentBefore = targetStream.packetsSent;
    await sleep(30);
    t.is(targetStream.packetsSent, sentBefore, 'quiet after answering');
    const c1 = await dialStream(pair.agent, 'x:1', { timeoutMs: 5000 });
    const c2 = await dialStream(pair.server, 'y:2', { timeoutMs: 5000 });
    t.is(await roundTrip(c1, 'still'), 'still');
    t.is(await roundTrip(c2, 'alive'), 'alive');
    c1.destroy();
    c2.destroy();
    await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
  });
}

test('malformed packets are logged (rate-limited) and ignored; the tunnel stays up', async (t) => {
  const pair = tunnelPair({ features: ALL_FEATURES, serverDialHandler: echo });
  t.teardown(() => pair.close());
  for (let i = 0; i < 20; i++) pair.link.a.sendRaw(Buffer.from([0x08, 0x07 + i]));
  pair.link.a.sendRaw(Buffer.from([0x12, 0x04, 0x12, 0x02, 0xff, 0xfe]));
  await waitFor(() => pair.serverLog.matching('malformed').length > 0, 'warning');
  await sleep(20);
  const lines = pair.serverLog.matching('ignoring malformed packet');
  t.is(lines.length, 1);
  t.regex(String(lines[0].reason), /unknown packet type 7/);
  t.false(pair.server.closed);
  const c = await dialStream(pair.agent, 'x:1', { timeoutMs: 5000 });
  t.is(await roundTrip(c, 'ok'), 'ok');
  c.destroy();
});

// ---------- limits ----------

test('pending dials are bounded in both directions (exhausted / "too many dials waiting for an answer")', async (t) => {
  const seen: InboundDial[] = [];
  const pair = tunnelPair({ features: ALL_FEATURES, serverDialHandler: hangingHandler(seen), limits: { maxPendingDials: 3 } });
  t.teardown(() => pair.close());
  const pending = [0, 1, 2].map((i) => dialStream(pair.agent, `h:${i + 1}`, { timeoutMs: 5000 }));
  const err = dialError(await t.throwsAsync(pair.agent.dial('h:9', { timeoutMs: 5000 })));
  t.is(err.failure, 'exhausted');
  await waitFor(() => seen.length === 3, 'three inbound dials');

  // The performer refuses a fourth concurrent DIAL_REQ (here sent raw, bypassing the dialer's limit).
  const rspP = nextPacket(pair.link.a, PacketType.DIAL_RSP, (p) => p.random === 4242n);
  pair.link.a.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'h:4', random: 4242n });
  t.regex((await rspP).error, /too many dials waiting for an answer: 3, limit 3/);
  pair.close();
  for (const p of pending) t.is(dialError(await t.throwsAsync(p)).failure, 'tunnel-closed');
});

test('duplicate dial ID in DIAL_REQ is refused', async (t) => {
  const seen: InboundDial[] = [];
  const { tunnel, peer } = rawPeer('agent', { dialHandler: hangingHandler(seen) });
  t.teardown(() => tunnel.close());
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:80', random: 77n });
  await waitFor(() => seen.length === 1, 'first dial');
  const rspP = nextPacket(peer, PacketType.DIAL_RSP);
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:81', random: 77n });
  const rsp = await rspP;
  t.is(rsp.random, 77n);
  t.regex(rsp.error, /duplicate dial ID/);
  t.is(seen.length, 1);
});

// ---------- DRAIN ----------

test('DRAIN sets drainRequested and emits drain-requested once', async (t) => {
  const pair = tunnelPair({ features: NO_FEATURES });
  t.teardown(() => pair.close());
  let events = 0;
  pair.server.on('drain-requested', () => events++);
  t.false(pair.server.drainRequested);
  pair.agent.sendDrain();
  pair.agent.sendDrain();
  await waitFor(() => pair.server.drainRequested, 'drainRequested');
  await sleep(20);
  t.is(events, 1);
  t.is(pair.serverLog.matching('peer requested drain').length, 1);
  t.false(pair.server.closed, 'DRAIN does not close the tunnel');
});

// ---------- the stream goes away ----------

for (const how of ['peer resets the stream', 'local close', 'graceful end by the peer'] as const) {
  test(`stream close (${how}): pending dials rejected "tunnel-closed", connections destroyed, inbound dials aborted`, async (t) => {
    const seen: InboundDial[] = [];
    const far: Duplex[] = [];
    let agentHandler = 0;
    const pair = tunnelPair({
      features: ALL_FEATURES,
      // The agent performs the first three dials, then hangs on the rest.
      agentDialHandler: async (d) => {
        if (agentHandler++ < 3) {
          const [mine, theirs] = duplexPair();
          far.push(theirs);
          theirs.on('error', () => undefined);
          return mine;
        }
        return hangingHandler(seen)(d);
      },
      serverDialHandler: hangingHandler(seen),
    });
    t.teardown(() => pair.close());
    const open: ConnectionStream[] = [];
    for (let i = 0; i < 3; i++) open.push(await dialStream(pair.server, `pod:${i + 1}`, { timeoutMs: 5000 }));
    const closes = open.map((c) => (c.on('error', () => undefined), closed(c)));
    const farCloses = far.map((f) => closed(f));
    const pendingFromServer = [
      dialStream(pair.server, 'pod:10', { timeoutMs: 10_000 }),
      dialStream(pair.server, 'pod:11', { timeoutMs: 10_000 }),
    ];
    const pendingFromAgent = [dialStream(pair.agent, 'kas:1', { timeoutMs: 10_000 })];
    await waitFor(() => seen.length === 3, 'three hanging inbound dials');
    t.is(pair.server.stats().pendingDials, 2);
    t.is(pair.server.stats().inboundDials, 1);
    let serverClosed = 0;
    pair.server.on('close', () => serverClosed++);

    if (how === 'peer resets the stream') pair.link.a.destroy(new Error('connection reset'));
    else if (how === 'local close') pair.server.close();
    else pair.link.a.end();

    for (const p of [...pendingFromServer, ...pendingFromAgent]) t.is(dialError(await t.throwsAsync(p)).failure, 'tunnel-closed');
    await Promise.all(closes);
    await Promise.all(farCloses);
    t.true(open.every((c) => c.destroyed));
    await waitFor(() => seen.every((d) => d.signal.aborted), 'inbound dials aborted');
    await waitFor(() => pair.agent.closed && pair.server.closed, 'both tunnels closed');
    t.is(serverClosed, 1);
    t.deepEqual(pair.server.stats(), zero);
    t.deepEqual(pair.agent.stats(), zero);
    t.is(dialError(await t.throwsAsync(pair.server.dial('pod:1', { timeoutMs: 1000 }))).failure, 'tunnel-closed');
  });
}
