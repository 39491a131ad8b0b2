/**
 * The HTTP door (CONNECT and the forward proxy) against a stub
 * FrontendClients, on real listeners: the token each request presents reaches
 * admit(), a refusal is a 407 with Proxy-Authenticate or a 403, dials go
 * where dial() says (here direct sockets of the test's), and the mTLS
 * frontend's ALPN picks http/1.1 whenever a client offers it.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { listenForFrontends, selectFrontendAlpn, type Listener } from '../../src/server/listeners.js';
import { HttpConnectFrontend } from '../../src/server/frontends/http-connect-frontend.js';
import {
  ClientRefused,
  type ClientCredentials,
  type Dialed,
  type FrontendClient,
  type FrontendClients,
} from '../../src/server/clients/frontend-client.js';
import { DialError } from '../../src/tunnel/errors.js';
import { Refusals } from '../../src/domain/refusal-log.js';
import type { GrpcServerTransport } from '../../src/transport/transport.js';
import { throwawayTls } from '../helpers/grpc-js-peer.js';
import { captureLogger } from '../helpers/in-process.js';
import { ProxyAgent, proxyRequest, startOrigin } from '../helpers/http-origin.js';
import { readToEnd } from '../helpers/byte-streams.js';

function unusedGrpc<C>(): GrpcServerTransport<C> {
  return { injectConnection: (connection: Duplex) => connection.destroy(), close: () => Promise.resolve() };
}

/** Admits the token "good" as client "prometheus", refuses "bad" (403) and no token (407); dials directly, or refuses port 1 as forbidden. */
class StubClients implements FrontendClients {
  readonly admitted: ClientCredentials[] = [];
  readonly dials: string[] = [];

  admit(credentials: ClientCredentials): Promise<FrontendClient> {
    this.admitted.push(credentials);
    if (credentials.token === 'good') return Promise.resolve({ name: 'prometheus', identity: credentials.identity });
    if (credentials.token === undefined) return Promise.reject(new ClientRefused(407, 'no client entry matches: present a token'));
    return Promise.reject(new ClientRefused(403, 'no client entry matches this token'));
  }

  dial(_client: FrontendClient, address: string): Promise<Dialed> {
    this.dials.push(address);
    if (address.endsWith(':1')) return Promise.reject(new DialError('forbidden', `${address} is not allowed for prometheus by rule set x`));
    const [host, port] = [address.slice(0, address.lastIndexOf(':')), Number(address.slice(address.lastIndexOf(':') + 1))];
    return new Promise((resolve, reject) => {
      const socket = net.connect({ host, port });
      socket.once('connect', () => resolve({ via: 'direct', socket }));
      socket.once('error', reject);
    });
  }
}

async function door(t: ExecutionContext): Promise<{ clients: StubClients; listener: Listener; frontend: HttpConnectFrontend }> {
  const logs = captureLogger();
  const refusals = new Refusals(logs.log);
  const clients = new StubClients();
  const frontend = new HttpConnectFrontend(clients, refusals, {}, logs.log);
  const listener = await listenForFrontends({
    mode: 'http-connect',
    plain: { host: '127.0.0.1', port: 0 },
    services: { grpc: unusedGrpc(), tenantFrontend: () => frontend, log: logs.log },
    log: logs.log,
    refusals,
  });
  t.teardown(async () => {
    frontend.close();
    await listener.close();
  });
  return { clients, listener, frontend };
}

/** Sends `request` on a new connection and reads to the close. */
async function exchange(port: number, request: string): Promise<string> {
  const s = net.connect({ host: '127.0.0.1', port });
  s.on('error', () => undefined);
  const reading = readToEnd(s, 10_000);
  s.write(request);
  try {
    return (await reading).toString('latin1');
  } finally {
    s.destroy();
  }
}

test('forward requests: the Bearer or Basic token reaches admit; no token is a 407 with Proxy-Authenticate, a bad one a 403', async (t) => {
  const { clients, listener } = await door(t);
  const origin = await startOrigin(t, (_req, res) => res.end('ok'));
  const url = `http://${origin.address}/`;
  const noToken = await exchange(listener.port, `GET ${url} HTTP/1.1\r\nHost: ${origin.address}\r\n\r\n`);
  t.regex(noToken, /^HTTP\/1\.1 407 Proxy Authentication Required\r\n/);
  t.regex(noToken, /\r\nProxy-Authenticate: Bearer realm="kanal"\r\n/);
  t.regex(noToken, /present a token/);
  const bad = await exchange(listener.port, `GET ${url} HTTP/1.1\r\nHost: ${origin.address}\r\nProxy-Authorization: Bearer nope\r\n\r\n`);
  t.regex(bad, /^HTTP\/1\.1 403 Forbidden\r\n/);
  t.notRegex(bad, /Proxy-Authenticate/);
  t.is(origin.seen.length, 0, 'a refused client reaches nothing');
  const agent = new ProxyAgent(() => net.connect({ host: '127.0.0.1', port: listener.port }));
  t.teardown(() => agent.destroy());
  const basic = `Basic ${Buffer.from('prometheus:good').toString('base64')}`;
  const a = await proxyRequest(agent, 'GET', url, { headers: { 'Proxy-Authorization': basic } });
  const b = await proxyRequest(agent, 'GET', url, { headers: { 'Proxy-Authorization': 'Bearer good' } });
  t.is(a.status, 200);
  t.is(b.body, 'ok');
  t.is(origin.connections, 1, 'a direct dial is pooled like a tunnelled one');
  t.deepEqual(
    clients.admitted.map((c) => [c.token, c.door]),
    [
      [undefined, 'http-connect'],
      ['nope', 'http-connect'],
      ['good', 'http-connect'],
    ],
    'the same token on one connection is admitted once',
  );
  t.regex(clients.admitted[0].identity.address, /^127\.0\.0\.1:\d+$/, 'a plain-TCP client is known by its address');
  const forbidden = await exchange(
    listener.port,
    `GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer good\r\n\r\n`,
  );
  t.regex(forbidden, /^HTTP\/1\.1 403 Forbidden\r\n[\s\S]*not allowed for prometheus by rule set x/);
});

test('CONNECT goes through admit and dial too: 407, 403, a forbidden destination, then a joined connection', async (t) => {
  const { clients, listener } = await door(t);
  const echo = net.createServer((s) => s.pipe(s));
  await new Promise<void>((resolve) => echo.listen(0, '127.0.0.1', resolve));
  t.teardown(() => echo.close());
  const address = `127.0.0.1:${(echo.address() as net.AddressInfo).port}`;
  const noToken = await exchange(listener.port, `CONNECT ${address} HTTP/1.1\r\nHost: ${address}\r\n\r\n`);
  t.regex(noToken, /^HTTP\/1\.1 407 [\s\S]*Proxy-Authenticate: Bearer realm="kanal"/);
  const bad = await exchange(listener.port, `CONNECT ${address} HTTP/1.1\r\nProxy-Authorization: Bearer nope\r\n\r\n`);
  t.regex(bad, /^HTTP\/1\.1 403 /);
  const forbidden = await exchange(listener.port, `CONNECT 127.0.0.1:1 HTTP/1.1\r\nProxy-Authorization: Bearer good\r\n\r\n`);
  t.regex(forbidden, /^HTTP\/1\.1 403 [\s\S]*rule set x/);
  // Early bytes and a half-close after them, on a direct dial: all of it comes back, then the close.
  const s = net.connect({ host: '127.0.0.1', port: listener.port });
  const reading = readToEnd(s, 10_000);
  s.end(`CONNECT ${address} HTTP/1.1\r\nProxy-Authorization: Bearer good\r\n\r\nearly bytes`);
  const answer = (await reading).toString('latin1');
  t.is(answer, 'HTTP/1.1 200 Connection Established\r\n\r\nearly bytes');
  t.deepEqual(clients.dials, ['127.0.0.1:1', address]);
});

test('a CONNECT after forward requests on one connection is served as a CONNECT', async (t) => {
  const { listener } = await door(t);
  const origin = await startOrigin(t, (_req, res) => res.end('ok'));
  const s = net.connect({ host: '127.0.0.1', port: listener.port });
  const reading = readToEnd(s, 10_000);
  s.write(`GET http://${origin.address}/ HTTP/1.1\r\nHost: ${origin.address}\r\nProxy-Authorization: Bearer good\r\n\r\n`);
  s.end(
    `CONNECT ${origin.address} HTTP/1.1\r\nProxy-Authorization: Bearer good\r\n\r\nGET / HTTP/1.1\r\nHost: o\r\nConnection: close\r\n\r\n`,
  );
  const answer = (await reading).toString('latin1');
  t.regex(answer, /^HTTP\/1\.1 200 OK\r\n[\s\S]*\r\n\r\nokHTTP\/1\.1 200 Connection Established\r\n\r\nHTTP\/1\.1 200 OK\r\n[\s\S]*ok$/);
});

test('ALPN on the mTLS frontend: http/1.1 whenever offered, h2 when offered alone', async (t) => {
  t.is(selectFrontendAlpn({ protocols: ['h2', 'http/1.1'] }), 'http/1.1');
  t.is(selectFrontendAlpn({ protocols: ['http/1.1', 'h2'] }), 'http/1.1');
  t.is(selectFrontendAlpn({ protocols: ['h2'] }), 'h2');
  t.is(selectFrontendAlpn({ protocols: ['spdy/3'] }), undefined);
  const files = await throwawayTls();
  const logs = captureLogger();
  const refusals = new Refusals(logs.log);
  const frontend = new HttpConnectFrontend(new StubClients(), refusals, {}, logs.log);
  const listener = await listenForFrontends({
    mode: 'both',
    tcp: { host: '127.0.0.1', port: 0, tls: { cert: files.serverCert, key: files.serverKey } },
    services: { grpc: unusedGrpc(), tenantFrontend: () => frontend, log: logs.log },
    log: logs.log,
    refusals,
  });
  t.teardown(() => listener.close());
  const negotiated = (offer: string[] | undefined): Promise<string | false> =>
    new Promise((resolve, reject) => {
      const s = tls.connect({ host: '127.0.0.1', port: listener.port, ca: files.ca, servername: 'localhost', ALPNProtocols: offer }, () => {
        resolve(s.alpnProtocol ?? false);
        s.destroy();
      });
      s.once('error', reject);
    });
  t.is(await negotiated(['h2', 'http/1.1']), 'http/1.1', "Go's net/http with an https:// proxy");
  t.is(await negotiated(['h2']), 'h2', 'gRPC clients');
  t.is(await negotiated(['http/1.1']), 'http/1.1');
  t.is(await negotiated(undefined), false);
});
