/**
 * The HTTP forward proxy end to end in process: a server and an agent over
 * real sockets, clients on the frontend's Unix socket and on the plain-TCP
 * listener (--http-proxy-port), an HTTP origin behind the agent. Keep-alive
 * on both sides (asserted by the origin's connection count), chunked
 * request bodies, HEAD, 304, refusals that reach no destination, curl.
 */
import test from 'ava';
import net from 'node:net';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { closedPort, makeEnv, startAgent, startServer, waitFor } from '../helpers/in-process.js';
import { rawRequest } from '../helpers/frontend-clients.js';
import { ProxyAgent, proxyRequest, startOrigin, type Route } from '../helpers/http-origin.js';
import { skippedBecause } from '../helpers/skipped.js';
import { spawnSync } from 'node:child_process';
import type { ExecutionContext } from 'ava';

const run = promisify(execFile);

const route: Route = (req, res, body) => {
  if (req.url === '/not-modified') {
    res.writeHead(304, { ETag: '"v1"' });
    res.end();
  } else if (req.url === '/echo') {
    // No length given: node chunks the answer.
    res.writeHead(200, { 'Content-Type': 'text/plain' });
    res.write(`got ${body.length} bytes: `);
    res.end(body);
  } else {
    res.writeHead(200, {
      'Content-Type': 'text/plain',
      'Content-Length': String(`hello ${req.url}`.length),
      Connection: 'X-Origin-Hop',
      'X-Origin-Hop': 'drop',
    });
    res.end(req.method === 'HEAD' ? undefined : `hello ${req.url}`);
  }
};

async function proxyPair(t: ExecutionContext, extraFlags: string[] = []) {
  const env = await makeEnv(t);
  const origin = await startOrigin(t, route);
  const { server } = await startServer(t, env, { extraFlags });
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const connections = (): number => server.stats().agentTunnels.reduce((n, x) => n + x.connections, 0);
  return { env, origin, server, connections };
}

test('absolute-form GETs on one client connection reuse one tunnelled connection; hop-by-hop fields go, Via and Host are set', async (t) => {
  const { env, origin, connections } = await proxyPair(t);
  const agent = new ProxyAgent(() => net.connect(env.udsPath));
  t.teardown(() => agent.destroy());
  const a = await proxyRequest(agent, 'GET', `http://${origin.address}/one`, {
    headers: { 'Proxy-Authorization': 'Bearer not-for-the-origin', Connection: 'X-Client-Hop', 'X-Client-Hop': 'drop', 'X-Kept': 'yes' },
  });
  const b = await proxyRequest(agent, 'GET', `http://${origin.address}/two?q=1`);
  t.is(a.status, 200);
  t.is(a.body, 'hello /one');
  t.is(b.body, 'hello /two?q=1');
  t.is(a.headers.via, '1.1 kanal');
  t.is(a.headers['x-origin-hop'], undefined, 'a field the origin named in Connection is hop-by-hop');
  t.is(agent.opened, 1, 'one client connection');
  t.is(origin.connections, 1, 'one connection to the origin, reused');
  t.is(connections(), 1, 'one tunnelled connection');
  const [first, second] = origin.seen;
  t.is(first.url, '/one', 'the origin gets origin form');
  t.is(first.headers.host, origin.address);
  t.is(first.headers.via, '1.1 kanal');
  t.is(first.headers['x-kept'], 'yes');
  t.is(first.headers['proxy-authorization'], undefined);
  t.is(first.headers['x-client-hop'], undefined);
  t.is(first.headers.connection, undefined);
  t.is(second.connection, first.connection);
});

test('a chunked POST goes on chunked; a chunked answer comes back whole; HEAD and 304 have no body; the connection goes on', async (t) => {
  const { env, origin } = await proxyPair(t);
  const agent = new ProxyAgent(() => net.connect(env.udsPath));
  t.teardown(() => agent.destroy());
  const parts = [Buffer.from('a'.repeat(70_000)), Buffer.from('b'.repeat(5)), Buffer.from('c')];
  const post = await proxyRequest(agent, 'POST', `http://${origin.address}/echo`, { body: parts });
  t.is(post.status, 200);
  t.is(post.headers['transfer-encoding'], 'chunked');
  t.is(post.body, `got 70006 bytes: ${'a'.repeat(70_000)}bbbbbc`);
  t.is(origin.seen[0].headers['transfer-encoding'], 'chunked');
  const head = await proxyRequest(agent, 'HEAD', `http://${origin.address}/head`);
  t.is(head.status, 200);
  t.is(head.headers['content-length'], String('hello /head'.length));
  t.is(head.body, '');
  const notModified = await proxyRequest(agent, 'GET', `http://${origin.address}/not-modified`);
  t.is(notModified.status, 304);
  t.is(notModified.headers.etag, '"v1"');
  const after = await proxyRequest(agent, 'GET', `http://${origin.address}/after`);
  t.is(after.body, 'hello /after');
  t.is(agent.opened, 1);
  t.is(origin.connections, 1);
});

test('requests the proxy refuses reach no destination, nor does one pipelined after them', async (t) => {
  const { env, origin } = await proxyPair(t);
  const host = `Host: ${origin.address}\r\n`;
  const next = `GET http://${origin.address}/smuggled HTTP/1.1\r\n${host}\r\n`;
  const cases: [string, string, number, RegExp][] = [
    [
      'CL and TE',
      `POST http://${origin.address}/x HTTP/1.1\r\n${host}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n`,
      400,
      /both Transfer-Encoding and Content-Length/,
    ],
    [
      'two lengths',
      `POST http://${origin.address}/x HTTP/1.1\r\n${host}Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcd`,
      400,
      /differing Content-Length/,
    ],
    [
      'TE not chunked last',
      `POST http://${origin.address}/x HTTP/1.1\r\n${host}Transfer-Encoding: chunked, identity\r\n\r\n`,
      400,
      /must end in chunked/,
    ],
    ['TE gzip', `POST http://${origin.address}/x HTTP/1.1\r\n${host}Transfer-Encoding: gzip, chunked\r\n\r\n`, 501, /not implemented/],
    ['obs-fold', `GET http://${origin.address}/x HTTP/1.1\r\n${host}X-A: b\r\n c\r\n\r\n`, 400, /obs-fold/],
    ['bare LF', `GET http://${origin.address}/x HTTP/1.1\n${host}\r\n`, 400, /bare CR|LF|CRLF/],
    ['control character', `GET http://${origin.address}/x HTTP/1.1\r\n${host}X-A: b\x01\r\n\r\n`, 400, /invalid character/],
    ['two Host lines', `GET http://${origin.address}/x HTTP/1.1\r\n${host}${host}\r\n`, 400, /more than one Host/],
    ['no Host', `GET http://${origin.address}/x HTTP/1.1\r\n\r\n`, 400, /without Host/],
    ['https URI', `GET https://${origin.address}/x HTTP/1.1\r\n${host}\r\n`, 400, /CONNECT/],
    ['bad chunk', `POST http://${origin.address}/x HTTP/1.1\r\n${host}Transfer-Encoding: chunked\r\n\r\nzz\r\n`, 400, /chunk/],
  ];
  for (const [what, request, status, reason] of cases) {
    const answer = await rawRequest(env.udsPath, request + next);
    t.is(answer.status, status, what);
    t.regex(answer.body, reason, what);
    t.regex(answer.raw, /Connection: close/, what);
    t.is((answer.raw.match(/^HTTP\/1\.1 \d{3} /gm) ?? []).length, 1, `${what}: one answer only`);
  }
  // The chunked one's head went on before its body turned out bad: the origin got no complete request.
  t.deepEqual(
    origin.seen.map((r) => r.url),
    [],
  );
  // The Host of an absolute-form request is the URI's (RFC 9112 section 3.2.2), whatever the client's says.
  const mismatch = await rawRequest(
    env.udsPath,
    `GET http://${origin.address}/host HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n`,
  );
  t.is(mismatch.status, 200);
  t.is(origin.seen.at(-1)?.headers.host, origin.address);
});

test('a destination that fails mid-answer closes the client connection after the part sent; a refused dial is a 502', async (t) => {
  const env = await makeEnv(t);
  const half = net.createServer((s) => {
    s.once('data', () => {
      s.write('HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part');
      setTimeout(() => s.destroy(), 50);
    });
  });
  await new Promise<void>((resolve) => half.listen(0, '127.0.0.1', resolve));
  t.teardown(() => half.close());
  const port = (half.address() as net.AddressInfo).port;
  const { server } = await startServer(t, env);
  await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1, 'agent connected');
  const cut = await rawRequest(
    env.udsPath,
    `GET http://127.0.0.1:${port}/ HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\n\r\nGET http://127.0.0.1:${port}/again HTTP/1.1\r\nHost: x\r\n\r\n`,
  );
  t.is(cut.status, 200);
  t.true(cut.raw.endsWith('only part'), 'the part sent, then the close');
  const refused = await rawRequest(env.udsPath, `GET http://127.0.0.1:${await closedPort()}/ HTTP/1.1\r\nHost: x\r\n\r\n`);
  t.is(refused.status, 502);
});

const HAVE_CURL = spawnSync('curl', ['--version']).status === 0;

const curlTest = HAVE_CURL ? test : (title: string): void => skippedBecause(title, 'curl is not installed');

curlTest('curl -x (absolute form) and curl -p -x (CONNECT) through the plain-TCP listener', async (t) => {
  const port = await closedPort();
  const { origin } = await proxyPair(t, ['--http-proxy-port', String(port)]);
  const forward = await run('curl', [
    '-sS',
    '--max-time',
    '20',
    '-x',
    `http://127.0.0.1:${port}`,
    `http://${origin.address}/a`,
    `http://${origin.address}/b`,
  ]);
  t.is(forward.stdout, 'hello /ahello /b');
  t.is(origin.seen[0].headers.via, '1.1 kanal');
  t.is(origin.connections, 1, 'curl reused its proxy connection and the proxy its origin connection');
  const tunnel = await run('curl', ['-sS', '--max-time', '20', '-p', '-x', `http://127.0.0.1:${port}`, `http://${origin.address}/c`]);
  t.is(tunnel.stdout, 'hello /c');
  t.is(origin.seen.at(-1)?.headers.via, undefined, 'through CONNECT the proxy sees no HTTP');
  const refused = await run('curl', [
    '-sS',
    '--max-time',
    '20',
    '-o',
    '/dev/null',
    '-w',
    '%{http_code}',
    '-x',
    `http://127.0.0.1:${port}`,
    `http://127.0.0.1:${await closedPort()}/`,
  ]);
  t.is(refused.stdout, '502');
});
