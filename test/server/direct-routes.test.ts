/**
 * Direct routes (src/server/clients/direct-routes.ts): entries parsed or
 * refused with what to write instead, destinations matched by CIDR, name,
 * wildcard and port, and dials from the server itself to 127.0.0.1 — made,
 * refused, unresolved, timed out and cancelled.
 */
import test from 'ava';
import net from 'node:net';
import { once } from 'node:events';
import { DirectRoutes, type NameLookup } from '../../src/server/clients/direct-routes.js';
import { parseDirectRoute } from '../../src/server/clients/direct-routes-entry.js';
import { UsageError } from '../../src/common/usage-error.js';
import { DialError } from '../../src/tunnel/errors.js';
import { Cancel } from '../../src/common/cancel.js';
import { KasOnlyClients } from '../../src/server/clients/kas-only-clients.js';
import { DirectDials } from '../../src/server/clients/direct-dials.js';
import { ConnectionAuditor } from '../../src/audit/connection-auditor.js';
import type { AuditRecord } from '../../src/audit/audit-record.js';
import { Registry } from 'prom-client';
import { captureLogger } from '../helpers/memory-stream.js';

const FORMS = /expected CIDR\[:PORT\] \(10\.1\.0\.0\/16:443, \[fd00::\/64\]:443\), NAME\[:PORT\].*\*\.SUFFIX\[:PORT\]/;

test('entries are kept in canonical form', (t) => {
  const routes = new DirectRoutes([
    '10.1.0.0/16:443',
    '10.2.3.4',
    '[FD00::/64]:443',
    '[::1]',
    'Metrics-Server.Kube-System.svc.',
    '*.cp.internal:8443',
  ]);
  t.false(routes.empty);
  t.deepEqual(routes.list(), [
    '10.1.0.0/16:443',
    '10.2.3.4/32',
    '[fd00::/64]:443',
    '[::1/128]',
    'metrics-server.kube-system.svc',
    '*.cp.internal:8443',
  ]);
  t.true(new DirectRoutes([]).empty);
  t.like(parseDirectRoute('*.cp.internal'), { kind: 'wildcard', suffix: '.cp.internal', port: 0 });
});

const BAD: [entry: string, problem: RegExp][] = [
  ['', /no CIDR or name/],
  ['fd00::/64', /an IPv6 CIDR goes in brackets, e\.g\. \[fd00::\/64\]:443/],
  ['[fd00::/64', /no "\]" closes/],
  ['[fd00::/64]443', /"443" after "\]"/],
  ['[10.0.0.0/8]', /"10\.0\.0\.0" is not an IPv6 address/],
  ['10.0.0.0/33', /prefix \/33 is longer than an IPv4 address \(32 bits\)/],
  ['[fd00::/129]', /prefix \/129 is longer than an IPv6 address/],
  ['10.0.0.0/x', /prefix "x" is not a number from 0 to 32/],
  ['10.0.0/8', /"10\.0\.0" is not an IPv4 address/],
  ['10.0.0.0/8/9', /more than one "\/"/],
  ['10.0.0.0/8:', /nothing after ":"/],
  ['10.0.0.0/8:0', /port 0 is out of range 1-65535/],
  ['10.0.0.0/8:http', /port "http" is not a number/],
  ['a..b', /label "" is not a DNS label/],
  ['-a.example', /label "-a" is not a DNS label/],
  ['*', /label "\*"|"\*" stands only/],
  ['a.*.example', /"\*" stands only for the leading label/],
  ['*.', /"\*" stands only/],
  ['.', /a name has 1 to 253 characters/],
  ['10.0.0.300', /its last label is a number/],
  [`${'a'.repeat(64)}.example`, /is not a DNS label/],
  ['x'.repeat(300), /300 characters long/],
];

for (const [entry, problem] of BAD) {
  test(`entry ${JSON.stringify(entry.slice(0, 20))} is refused, naming it and the forms`, (t) => {
    const err = t.throws(() => new DirectRoutes(['10.9.0.0/16', entry]), { instanceOf: UsageError });
    t.regex(err.message, problem);
    t.true(err.message.startsWith(`direct route ${JSON.stringify(entry).slice(0, 60)}`), err.message);
    t.regex(err.message, FORMS);
  });
}

test('a CIDR matches IP literals in it, on its port or any', (t) => {
  const routes = new DirectRoutes(['10.1.0.0/16:443', '192.168.7.7', '[fd00::/64]:443', '[2001:db8::/32]']);
  t.true(routes.matches('10.1.200.3', 443));
  t.false(routes.matches('10.1.200.3', 80));
  t.false(routes.matches('10.2.0.1', 443));
  t.true(routes.matches('192.168.7.7', 1));
  t.false(routes.matches('192.168.7.8', 1));
  t.true(routes.matches('fd00::1', 443));
  t.true(routes.matches('FD00:0:0:0:ffff::1', 443));
  t.false(routes.matches('fd00:0:0:1::1', 443));
  t.false(routes.matches('fd00::1', 80));
  t.true(routes.matches('2001:db8:1::5', 6443));
  t.true(routes.matches('::ffff:10.1.0.9', 443), 'an IPv4-mapped IPv6 address is its IPv4 address');
  t.false(routes.matches('10.1.0.0', 0), 'no port 0');
});

test('a name matches exactly, case-insensitive, trailing dot ignored; a wildcard its leading labels', (t) => {
  const routes = new DirectRoutes(['metrics-server.kube-system.svc:443', 'etcd.local', '*.cp.internal:8443']);
  t.true(routes.matches('metrics-server.kube-system.svc', 443));
  t.true(routes.matches('METRICS-SERVER.kube-system.SVC.', 443));
  t.false(routes.matches('metrics-server.kube-system.svc', 80));
  t.false(routes.matches('x.metrics-server.kube-system.svc', 443), 'a name is exact');
  t.false(routes.matches('metrics-server.kube-system', 443));
  t.true(routes.matches('etcd.local', 2379));
  t.true(routes.matches('a.cp.internal', 8443));
  t.true(routes.matches('a.b.c.CP.internal.', 8443));
  t.false(routes.matches('cp.internal', 8443), '* stands for at least one label');
  t.false(routes.matches('acp.internal', 8443));
  t.false(routes.matches('a.cp.internal', 443));
  t.false(routes.matches('10.1.0.1', 8443), 'a name entry never matches an address');
  t.false(new DirectRoutes(['10.0.0.0/8']).matches('ten.example', 80), 'a CIDR never matches a name');
});

test('replace() swaps the routes; a malformed list leaves them as they were', (t) => {
  const routes = new DirectRoutes(['10.1.0.0/16']);
  routes.replace(['*.cp.internal']);
  t.false(routes.matches('10.1.0.1', 443));
  t.true(routes.matches('api.cp.internal', 443));
  t.throws(() => routes.replace(['10.2.0.0/16', 'fd00::/8']), { instanceOf: UsageError });
  t.deepEqual(routes.list(), ['*.cp.internal']);
  routes.replace([]);
  t.true(routes.empty);
});

/** A TCP server on 127.0.0.1 that writes "hi" to each connection; closed by the test's teardown. */
async function helloServer(t: { teardown(fn: () => void): void }): Promise<number> {
  const server = net.createServer((s) => s.end('hi'));
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  t.teardown(() => server.close());
  return (server.address() as net.AddressInfo).port;
}

/** A port on 127.0.0.1 nothing listens on (one just closed). */
async function closedPort(): Promise<number> {
  const server = net.createServer().listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address() as net.AddressInfo;
  await new Promise((resolve) => server.close(resolve));
  return port;
}

async function readAll(socket: net.Socket): Promise<string> {
  let text = '';
  for await (const chunk of socket) text += String(chunk);
  return text;
}

test('dial() connects to an address route', async (t) => {
  const port = await helloServer(t);
  const socket = await new DirectRoutes(['127.0.0.0/8']).dial(`127.0.0.1:${port}`, 5000);
  t.is(await readAll(socket), 'hi');
});

test("dial() resolves a name with the server's resolver and tries its addresses in turn", async (t) => {
  const port = await helloServer(t);
  const asked: string[] = [];
  const lookup: NameLookup = (name) => {
    asked.push(name);
    // Nothing listens on 127.0.0.2 (the server is bound to 127.0.0.1): refused, then the next address.
    return Promise.resolve(['127.0.0.2', '127.0.0.1']);
  };
  const socket = await new DirectRoutes(['*.cp.internal'], { lookup }).dial(`API.cp.internal:${port}`, 5000);
  t.is(await readAll(socket), 'hi');
  t.deepEqual(asked, ['API.cp.internal']);
});

test('dial() with the system resolver reaches localhost', async (t) => {
  const port = await helloServer(t);
  const socket = await new DirectRoutes([`localhost:${port}`]).dial(`localhost:${port}`, 5000);
  t.is(await readAll(socket), 'hi');
});

test('dial() to a closed port is refused', async (t) => {
  const port = await closedPort();
  const err = await t.throwsAsync(new DirectRoutes(['127.0.0.1']).dial(`127.0.0.1:${port}`, 5000), { instanceOf: DialError });
  t.is(err.failure, 'refused');
  t.regex(err.message, /ECONNREFUSED/);
  const lookup: NameLookup = () => Promise.resolve(['127.0.0.1']);
  const named = await t.throwsAsync(new DirectRoutes(['db.cp.internal'], { lookup }).dial(`db.cp.internal:${port}`, 5000), {
    instanceOf: DialError,
  });
  t.is(named.failure, 'refused');
  t.regex(
    named.message,
    /dial tcp db\.cp\.internal:\d+ \(resolved by the server's resolver to 127\.0\.0\.1\): dial tcp 127\.0\.0\.1:\d+: ECONNREFUSED/,
  );
});

test('dial() of a name that does not resolve is unresolved, naming the name and the resolver', async (t) => {
  const err = await t.throwsAsync(new DirectRoutes(['*.invalid']).dial('nonexistent.invalid:443', 10_000), { instanceOf: DialError });
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /nonexistent\.invalid/);
  t.regex(err.message, /the server's resolver/);
  const nx: NameLookup = () => Promise.reject(Object.assign(new Error('getaddrinfo ENOTFOUND x'), { code: 'ENOTFOUND' }));
  const named = await t.throwsAsync(new DirectRoutes(['x.cp.internal'], { lookup: nx }).dial('x.cp.internal:80', 5000), {
    instanceOf: DialError,
  });
  t.is(named.message, "dial tcp x.cp.internal:80: the server's resolver found no address for x.cp.internal (ENOTFOUND)");
  const none = await t.throwsAsync(
    new DirectRoutes(['x.cp.internal'], { lookup: () => Promise.resolve([]) }).dial('x.cp.internal:80', 5000),
    { instanceOf: DialError },
  );
  t.is(none.failure, 'unresolved');
});

test('dial() of a destination that is no direct route is forbidden', async (t) => {
  const err = await t.throwsAsync(new DirectRoutes(['10.0.0.0/8:443']).dial('127.0.0.1:443', 5000), { instanceOf: DialError });
  t.is(err.failure, 'forbidden');
  t.regex(err.message, /not a direct route \(direct-route: 10\.0\.0\.0\/8:443\)/);
  const bad = await t.throwsAsync(new DirectRoutes(['10.0.0.0/8']).dial('nonsense', 5000), { instanceOf: DialError });
  t.is(bad.failure, 'refused');
});

/** A resolver that never answers, as one whose server is gone. */
const silent: NameLookup = () => new Promise<string[]>(() => {});

test('a resolver that does not answer times the dial out', async (t) => {
  const err = await t.throwsAsync(new DirectRoutes(['slow.cp.internal'], { lookup: silent }).dial('slow.cp.internal:80', 200), {
    instanceOf: DialError,
  });
  t.is(err.failure, 'timeout');
  t.regex(err.message, /the server's resolver did not answer for slow\.cp\.internal within 200 ms/);
});

test('a cancelled dial is cancelled, before it starts and while the name is looked up', async (t) => {
  const port = await helloServer(t);
  const before = new Cancel();
  before.abort();
  const early = await t.throwsAsync(new DirectRoutes(['127.0.0.1']).dial(`127.0.0.1:${port}`, 5000, before), { instanceOf: DialError });
  t.is(early.failure, 'cancelled');
  const during = new Cancel();
  const dialing = new DirectRoutes(['slow.cp.internal'], { lookup: silent }).dial('slow.cp.internal:80', 60_000, during);
  setTimeout(() => during.abort(), 50);
  const late = await t.throwsAsync(dialing, { instanceOf: DialError });
  t.is(late.failure, 'cancelled');
  t.regex(late.message, /cancelled while the server's resolver looked up slow\.cp\.internal/);
});

test('without clients: the kube-apiserver reaches a direct route through the server itself, counted and audited; everything else through the dialer', async (t) => {
  const server = net.createServer((s) => s.end('direct'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => server.close());
  const { port } = server.address() as net.AddressInfo;
  const viaAgents: string[] = [];
  const dialer = {
    dial: (address: string): Promise<never> => {
      viaAgents.push(address);
      return Promise.reject(new DialError('no-backend', 'no agent'));
    },
    resolve: (): Promise<never> => Promise.reject(new DialError('unresolved', 'no agent')),
  };
  const records: AuditRecord[] = [];
  const log = captureLogger('info');
  const registry = new Registry();
  const direct = new DirectDials({
    routes: new DirectRoutes([`127.0.0.1:${port}`, `127.0.0.1:1`]),
    timeoutMs: () => 5000,
    registry,
    log: log.log,
    auditor: new ConnectionAuditor({ side: 'server', log: log.log, sink: { write: (r) => records.push(r) } }),
  });
  const clients = new KasOnlyClients(dialer, direct);
  const kas = await clients.admit({ identity: { address: 'unix:/kas' }, door: 'http-connect' });
  const dialed = await clients.dial(kas, `127.0.0.1:${port}`);
  t.is(dialed.via, 'direct');
  if (dialed.via !== 'direct') return;
  const chunks: Buffer[] = [];
  for await (const c of dialed.socket) chunks.push(c as Buffer);
  t.is(Buffer.concat(chunks).toString(), 'direct');
  if (!dialed.socket.destroyed) await once(dialed.socket, 'close');
  await t.throwsAsync(clients.dial(kas, '10.0.0.1:10250'), { message: 'no agent' });
  t.deepEqual(viaAgents, ['10.0.0.1:10250']);
  // Port 1 on loopback: nothing listens, a refused direct dial (no agent is asked).
  await t.throwsAsync(clients.dial(kas, '127.0.0.1:1'), { instanceOf: DialError });
  t.deepEqual(viaAgents, ['10.0.0.1:10250']);

  const ended = records.find((r) => r.event === 'direct');
  t.like(ended, {
    event: 'direct',
    client: { address: 'unix:/kas' },
    destination: `127.0.0.1:${port}`,
    dial: { result: 'ok' },
    bytes: { toDestination: 0, toClient: 6 },
    closedBy: 'destination',
  });
  t.like(
    records.find((r) => r.event === 'dial'),
    { event: 'dial', via: 'direct', destination: '127.0.0.1:1', dial: { result: 'refused' } },
  );
  t.like(
    log.lines.find((l) => l.msg === 'connection ended'),
    { via: 'direct', destination: `127.0.0.1:${port}`, toClient: 6, closedBy: 'destination' },
  );
  const text = await registry.metrics();
  t.regex(text, /kanal_direct_route_dials_total\{result="ok"\} 1/);
  t.regex(text, /kanal_direct_route_dials_total\{result="refused"\} 1/);
  t.regex(text, /kanal_direct_route_connections 0/);
  t.regex(text, /kanal_direct_route_bytes_total\{flow="to_client"\} 6/);
});
