/**
 * The SOCKS5 door with a stub FrontendClients over real Unix sockets:
 * malformed, truncated and oversized heads get their reply and nothing is
 * admitted or dialled (while another client goes through); admission refused;
 * each dial failure's REP code; early bytes; half-close both ways.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { once } from 'node:events';
import { Socks5Frontend } from '../../src/server/frontends/socks5-frontend.js';
import { Refusals, type PeerRefusal } from '../../src/domain/refusal-log.js';
import { DialError } from '../../src/tunnel/errors.js';
import { DIAL_FAILURES, type DialFailure } from '../../src/domain/dial-result.js';
import { REP_FOR_FAILURE } from '../../src/server/frontends/socks5-reply-codes.js';
import {
  ClientRefused,
  type ClientCredentials,
  type Dialed,
  type FrontendClient,
  type FrontendClients,
} from '../../src/server/clients/frontend-client.js';
import { captureLogger } from '../helpers/memory-stream.js';
import { startEchoServer } from '../helpers/in-process.js';
import {
  connectRequest,
  halfOpenPair,
  readExactly,
  readReply,
  readToEnd as readAll,
  socks5Handshake,
  userPassMessage,
} from '../helpers/socks5-client.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import path from 'node:path';
import type { CancelSignal } from '../../src/common/cancel.js';
import { waitFor } from '../helpers/in-process.js';

/** Admits (or refuses) and dials (to `dialTo`, or fails) as told, recording what it was asked. */
class StubClients implements FrontendClients {
  readonly admitted: ClientCredentials[] = [];
  readonly dialled: string[] = [];
  /** Each dial's cancel signal, in order. */
  readonly signals: CancelSignal[] = [];
  constructor(
    private readonly how: {
      refuse?: ClientRefused;
      fail?: DialFailure;
      /** A TCP port on 127.0.0.1 dial() connects to (a direct route). */
      dialTo?: number;
      /** Holds each dial until released. */
      hold?: Promise<void>;
    } = {},
  ) {}

  admit(credentials: ClientCredentials): Promise<FrontendClient> {
    this.admitted.push(credentials);
    if (this.how.refuse) return Promise.reject(this.how.refuse);
    return Promise.resolve({ name: 'test-client', identity: credentials.identity });
  }

  async dial(_client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed> {
    this.dialled.push(address);
    if (signal) this.signals.push(signal);
    await this.how.hold;
    if (this.how.fail) throw new DialError(this.how.fail, `stub: ${this.how.fail}`);
    const port = this.how.dialTo;
    if (port === undefined) throw new DialError('refused', 'stub: nowhere to dial');
    const socket = net.connect({ port, host: '127.0.0.1', allowHalfOpen: true });
    await once(socket, 'connect');
    return { via: 'direct', socket };
  }
}

interface Door {
  clients: StubClients;
  refused: PeerRefusal[];
  /** A new client connection served by the door. */
  connect(): Promise<net.Socket>;
}

function door(
  t: ExecutionContext,
  clients: StubClients,
  headDeadlineMs = 5000,
  limits: { maxEarlyBytes?: number } = {},
  peer = 'unix:test',
): Door {
  const logs = captureLogger();
  const refused: PeerRefusal[] = [];
  const refusals = new Refusals(logs.log, undefined, 1000, { refused: (r) => refused.push(r) });
  const part = new Socks5Frontend(clients, refusals, limits);
  const dir = scopedTempDir(t, 'kanal-socks5-');
  let n = 0;
  return {
    clients,
    refused,
    async connect() {
      const [server, client] = await halfOpenPair(path.join(dir, `s${n++}`));
      t.teardown(() => {
        server.destroy();
        client.destroy();
      });
      const identity = peer.startsWith('unix:') ? { address: peer, uid: 1000 } : { address: peer };
      part.serve(server, { peer, connection: { client: identity }, headDeadlineMs });
      server.resume();
      return client;
    },
  };
}

test('a client with no authentication is admitted by its connection, dialled by name, joined; the reply comes first', async (t) => {
  const echo = await startEchoServer(t);
  const d = door(t, new StubClients({ dialTo: echo.port }));
  const c = await d.connect();
  const out = await socks5Handshake(c, 'backend.example', 7);
  t.like(out, { kind: 'reply', rep: 0 });
  t.deepEqual(d.clients.dialled, ['backend.example:7']);
  t.deepEqual(d.clients.admitted, [{ identity: { address: 'unix:test', uid: 1000 }, door: 'socks5' }]);
  c.write('ping');
  t.is((await readExactly(c, 4))?.toString(), 'ping');
  t.deepEqual(d.refused, []);
});

test('no authentication over TCP is refused (method 0xFF) before anything is admitted; username/password there goes on', async (t) => {
  const echo = await startEchoServer(t);
  const d = door(t, new StubClients({ dialTo: echo.port }), 5000, {}, '127.0.0.1:40000');
  const c = await d.connect();
  c.write(Buffer.from([5, 1, 0]));
  t.deepEqual([...((await readExactly(c, 2)) ?? [])], [5, 0xff]);
  t.deepEqual(d.clients.admitted, []);
  t.like(d.refused[0], { reason: 'socks5_auth', detail: 'no_auth_over_tcp' });
  const c2 = await d.connect();
  t.like(await socks5Handshake(c2, '127.0.0.1', echo.port, { auth: { username: 'op', password: 'tok' } }), { kind: 'reply', rep: 0 });
});

test('username/password: the password is the token, the username only informational; an empty password is no token', async (t) => {
  const echo = await startEchoServer(t);
  const d = door(t, new StubClients({ dialTo: echo.port }));
  const c = await d.connect();
  t.like(await socks5Handshake(c, '127.0.0.1', echo.port, { auth: { username: 'prometheus', password: 's3cret' } }), {
    kind: 'reply',
    rep: 0,
  });
  t.is(d.clients.admitted[0]?.token, 's3cret');
  const c2 = await d.connect();
  t.like(await socks5Handshake(c2, '127.0.0.1', echo.port, { auth: { username: 'x', password: '' } }), { kind: 'reply', rep: 0 });
  t.false('token' in (d.clients.admitted[1] ?? {}));
});

test('greeting, sub-negotiation and request in one write (a client that does not wait for answers) go through', async (t) => {
  const echo = await startEchoServer(t);
  const d = door(t, new StubClients({ dialTo: echo.port }));
  const c = await d.connect();
  c.write(
    Buffer.concat([Buffer.from([5, 1, 2]), userPassMessage('u', 'tok'), connectRequest('127.0.0.1', echo.port), Buffer.from('early')]),
  );
  t.deepEqual([...((await readExactly(c, 4)) ?? [])], [5, 2, 1, 0]);
  t.is(await readReply(c), 0);
  t.is((await readExactly(c, 5))?.toString(), 'early');
});

test('admission refused: RFC 1929 status 1 after a password; reply 2 (not allowed) without authentication; nothing dialled', async (t) => {
  const d = door(t, new StubClients({ refuse: new ClientRefused(403, 'no client entry matches') }));
  const c = await d.connect();
  const out = await socks5Handshake(c, '10.0.0.1', 80, { auth: { username: 'u', password: 'bad' } });
  t.like(out, { kind: 'auth-failed', status: 1 });
  t.is((await readAll(c)).length, 0, 'closed after the status');
  const c2 = await d.connect();
  t.like(await socks5Handshake(c2, '10.0.0.1', 80), { kind: 'reply', rep: 2 });
  t.deepEqual(d.clients.dialled, []);
  t.deepEqual(
    d.refused.map((r) => [r.reason, r.detail]),
    [
      ['socks5_auth', 'refused_403'],
      ['socks5_auth', 'refused_403'],
    ],
  );
  t.like(d.refused[0]?.fields, { username: 'u', err: 'no client entry matches' });
});

test('each dial failure gets its REP code, and the connection closes', async (t) => {
  for (const failure of DIAL_FAILURES) {
    const d = door(t, new StubClients({ fail: failure }));
    const c = await d.connect();
    t.like(await socks5Handshake(c, 'svc.example', 443), { kind: 'reply', rep: REP_FOR_FAILURE[failure] }, failure);
    t.is((await readAll(c)).length, 0);
  }
});

/** Raw heads the door must refuse, each with its reply and refusal. */
const MALFORMED: readonly (readonly [string, Buffer, string, string, string])[] = [
  ['no method', Buffer.from([5, 0]), '05ff', 'socks5_bad_greeting', 'greeting_no_methods'],
  ['GSSAPI only', Buffer.from([5, 1, 1]), '05ff', 'socks5_auth', 'no_acceptable_method'],
  ['sub-negotiation version 5', Buffer.from([5, 1, 2, 5, 1, 0x61, 1, 0x62]), '05020101', 'socks5_auth', 'auth_version'],
  ['BIND', Buffer.from([5, 1, 0, 5, 2, 0, 1, 127, 0, 0, 1, 0, 80]), '050005070001000000000000', 'socks5_command', 'request_command'],
  ['UDP ASSOCIATE', Buffer.from([5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0]), '050005070001000000000000', 'socks5_command', 'request_command'],
  ['address type 9', Buffer.from([5, 1, 0, 5, 1, 0, 9]), '050005080001000000000000', 'socks5_bad_request', 'request_address_type'],
  ['empty name', Buffer.from([5, 1, 0, 5, 1, 0, 3, 0, 0, 80]), '050005010001000000000000', 'socks5_bad_request', 'request_domain_length'],
  [
    'name with a CRLF',
    Buffer.from([5, 1, 0, 5, 1, 0, 3, 4, 0x61, 13, 10, 0x62, 0, 80]),
    '050005040001000000000000',
    'socks5_bad_request',
    'request_domain',
  ],
  [
    'request version 4',
    Buffer.from([5, 1, 0, 4, 1, 0, 1, 1, 2, 3, 4, 0, 80]),
    '050005010001000000000000',
    'socks5_bad_request',
    'request_version',
  ],
];

test('malformed heads: each gets its reply, is refused and closed, nothing dialled; a client beside them goes through', async (t) => {
  const echo = await startEchoServer(t);
  const d = door(t, new StubClients({ dialTo: echo.port }));
  const good = await d.connect();
  t.like(await socks5Handshake(good, '127.0.0.1', echo.port), { kind: 'reply', rep: 0 });
  for (const [what, bytes, reply, reason, code] of MALFORMED) {
    const c = await d.connect();
    c.write(bytes);
    t.is((await readAll(c)).toString('hex'), reply, what);
    t.like(d.refused.at(-1), { reason, detail: code }, what);
  }
  t.deepEqual(d.clients.dialled, [`127.0.0.1:${echo.port}`], 'only the good client dialled');
  good.write('still here');
  t.is((await readExactly(good, 10))?.toString(), 'still here');
});

test('a truncated head waits for the deadline, then gets its failure reply; one ended half way is refused at once', async (t) => {
  const d = door(t, new StubClients(), 300);
  for (const [bytes, reply] of [
    [Buffer.from([5, 2, 0]), '05ff'], // one method missing
    [Buffer.from([5, 1, 2, 1, 3, 0x61]), '05020101'], // username cut short
    [Buffer.from([5, 1, 0, 5, 1, 0, 3, 10, 0x61]), '0500050100010000000000'.padEnd(24, '0')], // name cut short
  ] as const) {
    const c = await d.connect();
    const started = Date.now();
    c.write(bytes);
    t.is((await readAll(c)).toString('hex'), reply);
    t.true(Date.now() - started >= 250, 'waited for the deadline');
    t.like(d.refused.at(-1), { reason: 'frontend_header_timeout' });
  }
  const c = await d.connect();
  c.end(Buffer.from([5, 3, 0]));
  t.is((await readAll(c)).toString('hex'), '05ff');
  t.like(d.refused.at(-1), { reason: 'socks5_bad_greeting', detail: 'truncated' });
  t.deepEqual(d.clients.dialled, []);
});

test('an oversized head (every field at its largest) is refused at 1 KiB', async (t) => {
  const d = door(t, new StubClients());
  const c = await d.connect();
  const name = 'a'.repeat(63) + '.' + 'b'.repeat(63) + '.' + 'c'.repeat(63) + '.' + 'd'.repeat(61); // 253 bytes
  c.write(Buffer.from([5, 255, 2, ...Array.from({ length: 254 }, (_, i) => (i + 3) % 256)]));
  t.deepEqual([...((await readExactly(c, 2)) ?? [])], [5, 2]);
  c.write(userPassMessage('u'.repeat(255), 'p'.repeat(255)));
  t.deepEqual([...((await readExactly(c, 2)) ?? [])], [1, 0]);
  c.write(Buffer.concat([Buffer.from([5, 1, 0, 3, name.length]), Buffer.from(name), Buffer.from([0, 80])]));
  t.is(await readReply(c), 1);
  t.like(d.refused.at(-1), { reason: 'socks5_bad_request', detail: 'head_too_large' });
  t.deepEqual(d.clients.dialled, []);
});

test('early bytes: sent after the request, before the reply, held during the dial and delivered first; a FIN after them is a half-close', async (t) => {
  const echo = await startEchoServer(t);
  let release = (): void => undefined;
  const hold = new Promise<void>((resolve) => (release = resolve));
  const d = door(t, new StubClients({ dialTo: echo.port, hold }));
  const c = await d.connect();
  c.write(Buffer.from([5, 1, 0]));
  await readExactly(c, 2);
  c.write(Buffer.concat([connectRequest('127.0.0.1', echo.port), Buffer.from('early bytes')]));
  // The client's half-close while the dial is pending: the dial goes on.
  c.end();
  await new Promise((r) => setTimeout(r, 100));
  release();
  t.is(await readReply(c), 0);
  // The echo server ends after the client's FIN: everything came back, then the end.
  t.is((await readAll(c)).toString(), 'early bytes');
});

test('a client that half-closes and then goes while its dial is pending is found gone: the dial is cancelled', async (t) => {
  const never = new Promise<void>(() => undefined);
  const d = door(t, new StubClients({ dialTo: 1, hold: never }));
  const c = await d.connect();
  c.write(Buffer.from([5, 1, 0]));
  await readExactly(c, 2);
  c.write(connectRequest('127.0.0.1', 9));
  c.end();
  await waitFor(() => d.clients.signals.length === 1, 'the dial started');
  t.false(d.clients.signals[0].aborted, 'a half-close alone keeps the dial');
  c.destroy();
  await waitFor(() => d.clients.signals[0].aborted, 'the dial cancelled once the client is gone', 15_000);
  t.pass();
});

test('early bytes beyond the bound pause reading (the kernel holds the rest), and all of them arrive', async (t) => {
  const echo = await startEchoServer(t);
  let release = (): void => undefined;
  const hold = new Promise<void>((resolve) => (release = resolve));
  const d = door(t, new StubClients({ dialTo: echo.port, hold }), 5000, { maxEarlyBytes: 1024 });
  const c = await d.connect();
  c.write(Buffer.from([5, 1, 0]));
  await readExactly(c, 2);
  const early = Buffer.alloc(256 * 1024, 0x61);
  c.write(Buffer.concat([connectRequest('127.0.0.1', echo.port), early]));
  await new Promise((r) => setTimeout(r, 100));
  release();
  t.is(await readReply(c), 0);
  const back = await readExactly(c, early.length, 20_000);
  t.is(back?.length, early.length);
});

test('half-close the other way: the destination ends first, the client still sends and gets its answer', async (t) => {
  // A destination that says hello, ends its side, then answers what it reads until the client ends.
  const got: Buffer[] = [];
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    s.end('bye');
    s.on('data', (b: Buffer) => got.push(b));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const port = (server.address() as net.AddressInfo).port;
  const d = door(t, new StubClients({ dialTo: port }));
  const c = await d.connect();
  t.like(await socks5Handshake(c, '127.0.0.1', port), { kind: 'reply', rep: 0 });
  const ended = once(c, 'end');
  t.is((await readExactly(c, 3))?.toString(), 'bye');
  c.resume();
  await ended;
  c.write('after your FIN');
  await new Promise<void>((resolve, reject) => {
    const deadline = Date.now() + 5000;
    const check = (): void => {
      if (Buffer.concat(got).toString() === 'after your FIN') resolve();
      else if (Date.now() > deadline) reject(new Error(`destination got ${JSON.stringify(Buffer.concat(got).toString())}`));
      else setTimeout(check, 20);
    };
    check();
  });
  t.pass();
  c.end();
});

test('a client that goes away during its dial cancels it; what comes late is dropped', async (t) => {
  const echo = await startEchoServer(t);
  let release = (): void => undefined;
  const hold = new Promise<void>((resolve) => (release = resolve));
  const d = door(t, new StubClients({ dialTo: echo.port, hold }));
  const c = await d.connect();
  c.write(Buffer.from([5, 1, 0]));
  await readExactly(c, 2);
  c.write(connectRequest('127.0.0.1', echo.port));
  await new Promise((r) => setTimeout(r, 50));
  c.destroy();
  await new Promise((r) => setTimeout(r, 50));
  release();
  // The late direct socket is closed: the echo server sees it go.
  const deadline = Date.now() + 5000;
  while (echo.accepted === 0 || echo.open > 0) {
    if (Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 20));
  }
  t.is(echo.open, 0);
});
