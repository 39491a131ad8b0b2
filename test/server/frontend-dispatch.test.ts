/**
 * The front-door seam: a frontend listener reads a connection's first
 * bytes, asks the registered doors in order which one it is, and hands it
 * to that door if `--mode` serves it. Here the sniffer alone (doors in
 * order, 'more' waits, a bound on what a door may ask for, one byte and a
 * FIN, a stall), then a real listener on a Unix socket with a stub gRPC
 * server and a real HTTP CONNECT door: each protocol reaches its door with
 * its bytes intact, a protocol --mode does not serve is refused, and a
 * client that stalls or leaves early is closed and said why.
 */
import test, { type ExecutionContext } from 'ava';
import { EventEmitter, once } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { MAX_SNIFF_BYTES, sniffProtocol } from '../../src/server/frontends/protocol-sniffer.js';
import { FRONTENDS, FRONTEND_MODES, frontendsServed, type FrontendMode } from '../../src/server/frontends/frontend-registry.js';
import type { Frontend, FrontendConnection, Recognition } from '../../src/server/frontends/frontend.js';
import { httpConnectFrontend } from '../../src/server/frontends/http-connect-frontend.js';
import { BackendDialer } from '../../src/server/frontends/backend-dialer.js';
import { KasOnlyClients } from '../../src/server/clients/kas-only-clients.js';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import { listenForFrontends, type Listener } from '../../src/server/listeners.js';
import { Refusals, type PeerRefusal } from '../../src/domain/refusal-log.js';
import type { GrpcServerTransport } from '../../src/transport/transport.js';
import { captureLogger } from '../helpers/in-process.js';
import { unixSocketPair } from '../helpers/unix-socket-pair.js';

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const CONNECT = Buffer.from('CONNECT 10.0.0.1:10250 HTTP/1.1\r\nHost: 10.0.0.1:10250\r\n\r\n', 'latin1');
/** Bounds every wait below: a test that hangs fails instead. */
const WAIT_MS = 10_000;

function tempDir(t: ExecutionContext): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-doors-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

const socketPair = unixSocketPair;

/** What sniffProtocol chose, as one word. */
async function chosen(socket: Duplex, timeoutMs: number, doors: readonly Frontend[] = FRONTENDS): Promise<string> {
  const r = await sniffProtocol(socket, timeoutMs, doors);
  return r.kind === 'door' ? r.door.name : r.kind;
}

/** A door that says what `say` says of the first bytes, and serves nothing. */
function door(name: string, say: (first: Buffer) => Recognition): Frontend {
  return { name, recognises: say, serve: (socket) => socket.destroy() };
}

/** Reads what the socket gives until its end, bounded in time. */
function readAll(socket: Duplex): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    const timer = setTimeout(() => reject(new Error(`no end within ${WAIT_MS} ms; read ${Buffer.concat(chunks).length} bytes`)), WAIT_MS);
    const done = (): void => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    };
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('end', done);
    socket.once('close', done);
    socket.on('error', () => undefined);
    socket.resume();
  });
}

test('the registry: --mode takes "both" and every door by name; HTTP CONNECT, which claims what is left, is asked last', (t) => {
  t.deepEqual(FRONTEND_MODES, ['both', 'grpc', 'socks5', 'http-connect']);
  t.is(FRONTENDS.at(-1), httpConnectFrontend);
  // `both` is the kube-apiserver's listener as it was: SOCKS5 only where asked for.
  t.deepEqual([...frontendsServed('both')], ['grpc', 'http-connect']);
  t.deepEqual([...frontendsServed('socks5')], ['socks5']);
  t.is(httpConnectFrontend.recognises(Buffer.from('\x00')), 'yes');
});

test('the sniffer: the preface is gRPC, anything else HTTP CONNECT, decided at the first byte that differs', async (t) => {
  for (const [bytes, want] of [
    [PREFACE, 'grpc'],
    [CONNECT, 'http-connect'],
    [Buffer.from('PRI * HTTP/1.1\r\n'), 'http-connect'],
    [Buffer.from('\x16\x03\x01'), 'http-connect'],
  ] as const) {
    const [server, client] = await socketPair(t);
    const verdict = chosen(server, WAIT_MS);
    client.write(bytes);
    t.is(await verdict, want, JSON.stringify(bytes.toString('latin1')));
  }
});

test('the sniffer: one byte and a FIN — "C" chooses HTTP CONNECT, "P" (a preface begun) is closed; either way nothing throws', async (t) => {
  const [server, client] = await socketPair(t);
  const verdict = chosen(server, WAIT_MS);
  client.end('C');
  t.is(await verdict, 'http-connect');
  // The byte is back in the socket, then its end: HTTP CONNECT's parser will see both.
  t.is((await readAll(server)).toString(), 'C');

  const [server2, client2] = await socketPair(t);
  const verdict2 = chosen(server2, WAIT_MS);
  client2.end('P');
  t.is(await verdict2, 'closed');
});

test('the sniffer: a client that sends nothing, or stalls inside the preface, times out', async (t) => {
  const [idle] = await socketPair(t);
  t.is(await chosen(idle, 100), 'timeout');
  const [server, client] = await socketPair(t);
  const verdict = chosen(server, 100);
  client.write(PREFACE.subarray(0, 10));
  t.is(await verdict, 'timeout');
});

test("the sniffer: doors are asked in order; an earlier door's 'more' waits, its 'no' passes on; none claiming is unknown", async (t) => {
  const asked: string[] = [];
  const brew = door('teapot', (b) => {
    asked.push(b.toString());
    const word = Buffer.from('BREW ');
    const n = Math.min(b.length, word.length);
    if (!b.subarray(0, n).equals(word.subarray(0, n))) return 'no';
    return n === word.length ? 'yes' : 'more';
  });
  const doors = [brew, ...FRONTENDS];
  const [server, client] = await socketPair(t);
  const verdict = chosen(server, WAIT_MS, doors);
  client.write('BR');
  await once(server, 'data');
  client.write('EW /pot HTTP/1.1\r\n');
  t.is(await verdict, 'teapot');
  t.deepEqual(asked, ['BR', 'BREW /pot HTTP/1.1\r\n']);

  const [server2, client2] = await socketPair(t);
  const verdict2 = chosen(server2, WAIT_MS, doors);
  client2.write('BRIE');
  t.is(await verdict2, 'http-connect');

  const [server3, client3] = await socketPair(t);
  const verdict3 = chosen(server3, WAIT_MS, [door('never', () => 'no')]);
  client3.write('x');
  t.is(await verdict3, 'unknown');
});

test('the sniffer: a door that keeps asking for more is cut off at MAX_SNIFF_BYTES', async (t) => {
  const [server, client] = await socketPair(t);
  const verdict = chosen(server, WAIT_MS, [door('greedy', () => 'more'), ...FRONTENDS]);
  client.write(Buffer.alloc(MAX_SNIFF_BYTES, 0x41));
  t.is(await verdict, 'unknown');
});

// ---------- a listener and its doors ----------

interface Stand {
  uds: string;
  /** Connections the stub gRPC server was given, with their context. */
  grpc: EventEmitter;
  refused: EventEmitter;
  /** Doors whose part in a tenant was asked for, with the tenant. */
  tenantsAsked: string[];
}

/** A frontend listener on a Unix socket of tenant "t1": a stub gRPC server, and HTTP CONNECT's real part in the tenant (with no agents). */
async function stand(t: ExecutionContext, mode: FrontendMode, requestHeadTimeoutMs = WAIT_MS): Promise<Stand> {
  const logs = captureLogger();
  const grpc = new EventEmitter();
  const refused = new EventEmitter();
  const refusals = new Refusals(logs.log, undefined, 1000, { refused: (r: PeerRefusal) => refused.emit('refusal', r) });
  const dialer = new BackendDialer({ registry: new AgentRegistry(), timeoutMs: 1000, log: logs.log });
  const tenantPart = httpConnectFrontend.forTenant?.({ dialer, clients: new KasOnlyClients(dialer), refusals, log: logs.log });
  const stub: GrpcServerTransport<FrontendConnection> = {
    injectConnection: (connection, context) => grpc.emit('connection', connection, context),
    close: () => Promise.resolve(),
  };
  const tenantsAsked: string[] = [];
  const uds = path.join(tempDir(t), 'frontend.sock');
  const listener: Listener = await listenForFrontends({
    mode,
    uds: { path: uds, deleteExisting: false },
    tenant: 't1',
    services: {
      grpc: stub,
      log: logs.log,
      tenantFrontend: (tenant, name) => {
        tenantsAsked.push(`${tenant ?? '-'}/${name}`);
        return name === httpConnectFrontend.name ? tenantPart : undefined;
      },
    },
    log: logs.log,
    refusals,
    requestHeadTimeoutMs,
  });
  t.teardown(() => listener.close());
  return { uds, grpc, refused, tenantsAsked };
}

function connect(t: ExecutionContext, uds: string): net.Socket {
  const client = net.connect(uds);
  client.on('error', () => undefined);
  t.teardown(() => client.destroy());
  return client;
}

/** The next refusal, bounded in time. */
async function nextRefusal(s: Stand): Promise<PeerRefusal> {
  const [r] = (await once(s.refused, 'refusal', { signal: AbortSignal.timeout(WAIT_MS) })) as [PeerRefusal];
  return r;
}

test('listener: the HTTP/2 preface goes to the gRPC server whole, with the tenant and the client', async (t) => {
  const s = await stand(t, 'both');
  const client = connect(t, s.uds);
  const injected = once(s.grpc, 'connection', { signal: AbortSignal.timeout(WAIT_MS) });
  client.write(Buffer.concat([PREFACE, Buffer.from('settings')]));
  const [socket, context] = (await injected) as [net.Socket, FrontendConnection];
  t.like(context, { tenant: 't1', client: { address: `unix:${s.uds}` } });
  const got = await new Promise<Buffer>((resolve) => {
    let seen = Buffer.alloc(0);
    socket.on('data', (c: Buffer) => {
      seen = Buffer.concat([seen, c]);
      if (seen.length >= PREFACE.length + 8) resolve(seen);
    });
  });
  t.is(got.toString('latin1'), `${PREFACE.toString('latin1')}settings`);
  t.deepEqual(s.tenantsAsked, []);
  socket.destroy();
});

test("listener: a CONNECT goes to its tenant's HTTP CONNECT part, which reads the head (no agent: 500)", async (t) => {
  const s = await stand(t, 'both');
  const client = connect(t, s.uds);
  client.write(CONNECT);
  const answer = (await readAll(client)).toString('latin1');
  t.regex(answer, /^HTTP\/1\.1 500 /);
  t.deepEqual(s.tenantsAsked, ['t1/http-connect']);
});

test('listener: one byte and a FIN reach HTTP CONNECT, which answers 400; "P" and a FIN are closed unanswered', async (t) => {
  const s = await stand(t, 'both');
  const c = connect(t, s.uds);
  c.end('C');
  t.regex((await readAll(c)).toString('latin1'), /^HTTP\/1\.1 400 [^]*HPE_INVALID_EOF_STATE/);
  const p = connect(t, s.uds);
  p.end('P');
  t.is((await readAll(p)).length, 0);
  t.deepEqual(s.tenantsAsked, ['t1/http-connect']);
});

test('listener: a protocol the --mode does not serve is refused as frontend_protocol, naming the door', async (t) => {
  for (const [mode, bytes, door] of [
    ['grpc', CONNECT, 'http-connect'],
    ['http-connect', PREFACE, 'grpc'],
    ['http-connect', Buffer.from([5, 1, 0]), 'socks5'],
  ] as const) {
    const s = await stand(t, mode);
    const client = connect(t, s.uds);
    const refusal = nextRefusal(s);
    client.write(bytes);
    t.like(await refusal, { reason: 'frontend_protocol', detail: door, fields: { protocol: door, mode } });
    t.is((await readAll(client)).length, 0, `${mode}: closed without an answer`);
  }
});

test('listener: SOCKS5 bytes on a `both` listener (which serves no SOCKS5) reach HTTP CONNECT and get its 400', async (t) => {
  const s = await stand(t, 'both');
  const c = connect(t, s.uds);
  c.end(Buffer.from([5, 1, 0]));
  t.regex((await readAll(c)).toString('latin1'), /^HTTP\/1\.1 400 /);
  t.deepEqual(s.tenantsAsked, ['t1/http-connect']);
});

test('listener: a client that sends nothing is closed as frontend_timeout; one that stalls in its CONNECT head gets 408', async (t) => {
  const s = await stand(t, 'both', 200);
  const idle = connect(t, s.uds);
  const refusal = nextRefusal(s);
  t.like(await refusal, { reason: 'frontend_timeout' });
  t.is((await readAll(idle)).length, 0);

  const stalled = connect(t, s.uds);
  const headTimeout = nextRefusal(s);
  stalled.write('CONNECT 10.0.0.1:1');
  t.like(await headTimeout, { reason: 'frontend_header_timeout' });
  t.regex((await readAll(stalled)).toString('latin1'), /^HTTP\/1\.1 408 /);
});

test('plain TCP listener: a CONNECT from loopback reaches its door with the client address; a port in use names the flags', async (t) => {
  const logs = captureLogger();
  const refusals = new Refusals(logs.log);
  const dialer = new BackendDialer({ registry: new AgentRegistry(), timeoutMs: 1000, log: logs.log });
  const tenantPart = httpConnectFrontend.forTenant?.({ dialer, clients: new KasOnlyClients(dialer), refusals, log: logs.log });
  const peers: string[] = [];
  const options = {
    mode: 'http-connect' as const,
    plain: { host: '127.0.0.1', port: 0 },
    listenFlags: '--http-proxy-bind-address, --http-proxy-port',
    services: {
      grpc: { injectConnection: () => undefined, close: () => Promise.resolve() },
      log: logs.log,
      tenantFrontend: () =>
        tenantPart && {
          serve: (socket: Duplex, context: Parameters<NonNullable<typeof tenantPart>['serve']>[1]) => {
            peers.push(context.connection.client.address);
            tenantPart.serve(socket, context);
          },
        },
    },
    log: logs.log,
    refusals,
  };
  const listener = await listenForFrontends(options);
  t.teardown(() => listener.close());
  t.regex(listener.address, /^127\.0\.0\.1:\d+$/);
  const client = net.connect(listener.port, '127.0.0.1');
  client.on('error', () => undefined);
  t.teardown(() => client.destroy());
  client.write(CONNECT);
  t.regex((await readAll(client)).toString('latin1'), /^HTTP\/1\.1 500 /);
  t.is(peers.length, 1);
  t.regex(peers[0] ?? '', /^127\.0\.0\.1:\d+$/);
  const taken = await t.throwsAsync(listenForFrontends({ ...options, plain: { host: '127.0.0.1', port: listener.port } }));
  t.regex(taken?.message ?? '', /--http-proxy-bind-address, --http-proxy-port/);
});
