/**
 * Half-close through the tunnel: with the half-close feature a FIN travels
 * as KANAL_HALF_CLOSE and the other direction keeps flowing; without it
 * (plain Konnectivity) a FIN closes the whole connection, as upstream does.
 */
import test, { type ExecutionContext } from 'ava';
import { createHash } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Feature, NO_FEATURES, type FeatureSet } from '../../src/wire/features.js';
import { PacketType } from '../../src/wire/packet.js';
import { duplexPair, readAll, tunnelPair, waitFor, createMemoryLink, captureLogger, nextPacket } from '../helpers/memory-stream.js';
import { Tunnel, type DialHandler } from '../../src/tunnel/tunnel.js';
import { dialStream } from '../helpers/connection-stream.js';

const HALF_CLOSE: FeatureSet = new Set([Feature.HalfClose, Feature.Window]);

function farEndHandler(far: Duplex[]): DialHandler {
  return () => {
    const [mine, theirs] = duplexPair();
    theirs.on('error', () => undefined);
    far.push(theirs);
    return Promise.resolve(mine);
  };
}

function closed(s: Duplex): Promise<void> {
  return new Promise((resolve) => (s.closed ? resolve() : s.once('close', () => resolve())));
}

function statsZero(...tunnels: Tunnel[]): boolean {
  return tunnels.every((t) => {
    const s = t.stats();
    return s.connections === 0 && s.pendingDials === 0 && s.inboundDials === 0;
  });
}

function pattern(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 13 + seed) & 0xff;
  return b;
}

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

/**
 * A tunnel (agent side, half-close on) driven packet by packet from a raw
 * peer that dialled one connection through it; the far endpoint is reading.
 */
async function performedByTunnel(t: ExecutionContext) {
  const link = createMemoryLink();
  const far: Duplex[] = [];
  /** Why each connection closed, as the tunnel's log line and audit record say it. */
  const closeReasons: string[] = [];
  const tunnel = new Tunnel(link.a, {
    side: 'agent',
    features: HALF_CLOSE,
    log: captureLogger().log,
    dialHandler: farEndHandler(far),
    onConnectionClosed: (conn) => closeReasons.push(conn.closeReason),
  });
  t.teardown(() => tunnel.close());
  const peer = link.b;
  const rspP = nextPacket(peer, PacketType.DIAL_RSP);
  peer.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:80', random: 3n });
  const { connectID } = await rspP;
  const endpoint = far[0];
  endpoint.resume();
  return { tunnel, peer, connectID, endpoint, closeReasons };
}

test('half-close: the dialer ends its side, the other direction keeps flowing, then both close', async (t) => {
  const far: Duplex[] = [];
  const pair = tunnelPair({ features: HALF_CLOSE, serverDialHandler: farEndHandler(far) });
  t.teardown(() => pair.close());
  const conn = await dialStream(pair.agent, 'kas:6443', { timeoutMs: 5000 });
  const endpoint = far[0];
  const request = pattern(200_000, 1);
  const response = pattern(3 * 1024 * 1024, 2);

  const endpointGot = readAll(endpoint);
  conn.end(request); // request, then FIN
  t.is(sha(await endpointGot), sha(request), 'endpoint got the whole request, then end');
  t.true(pair.link.a.sent.some((p) => p.type === PacketType.KANAL_HALF_CLOSE && p.connectID === conn.connection.connectID));
  t.false(endpoint.destroyed, 'endpoint still open for writing');
  t.false(conn.destroyed);

  // The response is written only after the request side closed.
  const connGot = readAll(conn);
  endpoint.end(response);
  t.is(sha(await connGot), sha(response), 'dialer got the whole response after its own FIN');
  await Promise.all([closed(conn), closed(endpoint)]);
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
  // A clean double half-close needs no CLOSE_REQ/CLOSE_RSP.
  const closes = [...pair.link.a.sent, ...pair.link.b.sent].filter(
    (p) => p.type === PacketType.CLOSE_REQ || p.type === PacketType.CLOSE_RSP,
  );
  t.deepEqual(closes, []);
});

test('half-close: the far endpoint ends first, the dialer keeps sending, then both close', async (t) => {
  const far: Duplex[] = [];
  const pair = tunnelPair({ features: HALF_CLOSE, agentDialHandler: farEndHandler(far) });
  t.teardown(() => pair.close());
  const conn = await dialStream(pair.server, 'pod:80', { timeoutMs: 5000 });
  const endpoint = far[0];
  const greeting = Buffer.from('220 ready, and done talking\r\n');
  const upload = pattern(2 * 1024 * 1024, 3);

  const connGot = readAll(conn);
  endpoint.end(greeting);
  t.is((await connGot).toString(), greeting.toString(), 'dialer sees the far FIN');
  t.false(conn.destroyed, 'the dialer can still write');

  const endpointGot = readAll(endpoint);
  conn.end(upload);
  t.is(sha(await endpointGot), sha(upload));
  await Promise.all([closed(conn), closed(endpoint)]);
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
});

test('half-close between two tunnelled connections spliced together (relay)', async (t) => {
  // node -> control plane style: both ends of the pair have real endpoints.
  const far: Duplex[] = [];
  const pair = tunnelPair({ features: HALF_CLOSE, serverDialHandler: farEndHandler(far) });
  t.teardown(() => pair.close());
  const conns = await Promise.all([0, 1, 2, 3].map((i) => dialStream(pair.agent, `kas:${6443 + i}`, { timeoutMs: 5000 })));
  await Promise.all(
    conns.map(async (conn, i) => {
      const endpoint = far[i];
      const got = readAll(endpoint);
      conn.end(`request ${i}`);
      t.is((await got).toString(), `request ${i}`);
      const back = readAll(conn);
      endpoint.end(`response ${i}`);
      t.is((await back).toString(), `response ${i}`);
    }),
  );
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
});

test('without the half-close feature (upstream): a FIN from the dialer closes the whole connection', async (t) => {
  const far: Duplex[] = [];
  const pair = tunnelPair({ features: NO_FEATURES, serverDialHandler: farEndHandler(far) });
  t.teardown(() => pair.close());
  const conn = await dialStream(pair.agent, 'kas:6443', { timeoutMs: 5000 });
  const endpoint = far[0];
  const endpointGot = readAll(endpoint);
  conn.end('last words');
  t.is((await endpointGot).toString(), 'last words', 'data before the FIN is delivered, then the endpoint ends');
  await closed(conn);
  let late = 0;
  conn.on('data', (c: Buffer) => (late += c.length));
  // The other direction is gone too: what the endpoint writes now is not delivered.
  endpoint.end('too late');
  await closed(endpoint);
  await sleep(20);
  t.is(late, 0);
  t.is(conn.connection.bytesIn, 0);
  const sent = [...pair.link.a.sent, ...pair.link.b.sent];
  t.false(
    sent.some((p) => p.type === PacketType.KANAL_HALF_CLOSE),
    'no extension packet to a peer without the feature',
  );
  t.true(
    pair.link.a.sent.some((p) => p.type === PacketType.CLOSE_REQ && p.connectID === conn.connection.connectID),
    'dialer sent CLOSE_REQ',
  );
  t.true(
    pair.link.b.sent.some((p) => p.type === PacketType.CLOSE_RSP && p.connectID === conn.connection.connectID),
    'performer answered CLOSE_RSP',
  );
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
});

test('without the half-close feature: a FIN from the far endpoint closes the connection after delivering its data', async (t) => {
  const far: Duplex[] = [];
  const pair = tunnelPair({ features: NO_FEATURES, agentDialHandler: farEndHandler(far) });
  t.teardown(() => pair.close());
  const conn = await dialStream(pair.server, 'pod:80', { timeoutMs: 5000 });
  const endpoint = far[0];
  const body = pattern(500_000, 9);
  const got = readAll(conn);
  endpoint.end(body);
  t.is(sha(await got), sha(body), 'everything before the FIN arrives');
  await closed(conn);
  // The dialer can no longer send: the connection is gone on both sides.
  t.true(conn.destroyed);
  t.true(
    pair.link.a.sent.some((p) => p.type === PacketType.CLOSE_RSP && p.connectID === conn.connection.connectID),
    'performer sent CLOSE_RSP',
  );
  await waitFor(() => statsZero(pair.agent, pair.server), 'tables empty');
});

test('DATA after the peer half-closed destroys the connection', async (t) => {
  const { tunnel, peer, connectID } = await performedByTunnel(t);
  peer.send({ type: PacketType.KANAL_HALF_CLOSE, connectID });
  await sleep(10);
  t.is(tunnel.stats().connections, 1, 'half-closed connection is still open');
  const closeP = nextPacket(peer, PacketType.CLOSE_RSP, (p) => p.connectID === connectID);
  peer.send({ type: PacketType.DATA, connectID, error: '', data: Buffer.from('rogue') });
  const close = await closeP;
  t.regex(close.error, /DATA after closing its side/);
  await waitFor(() => statsZero(tunnel), 'table empty');
});

test('DATA with an error string closes the connection with that error', async (t) => {
  const { tunnel, peer, connectID, endpoint, closeReasons } = await performedByTunnel(t);
  peer.send({ type: PacketType.DATA, connectID, error: 'read: connection reset by peer', data: new Uint8Array(0) });
  await closed(endpoint);
  await waitFor(() => statsZero(tunnel), 'table empty');
  t.deepEqual(closeReasons, ['closed by peer: read: connection reset by peer'], 'closed once, with the error the peer sent');
});
