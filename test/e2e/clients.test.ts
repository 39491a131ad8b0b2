/**
 * Control plane -> node with real clients against the real CLI: curl through
 * HTTP CONNECT over the mTLS TCP frontend, a Node CONNECT client over the
 * Unix socket, and a gRPC ProxyService client (grpc-js, upstream style).
 */
import anyTest, { type TestFn } from 'ava';
import * as grpc from '@grpc/grpc-js';
import { randomBytes } from 'node:crypto';
import { PacketType } from '../../src/wire/packet.js';
import {
  echoRoundTrip,
  fileScope,
  frontendProxyStream,
  makeWorkspace,
  readToEnd,
  runCurl,
  startEchoBackend,
  startHttpBackend,
  startPair,
  tunnelThrough,
  warnLine,
  type Backend,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { setTimeout as sleep } from 'node:timers/promises';

interface Ctx {
  ws: Workspace;
  tcpServer: KanalServerProcess;
  udsServer: KanalServerProcess;
  web: Backend;
  echo: Backend;
}

const test = anyTest as TestFn<Ctx>;
const shared = fileScope(test);
const BODY = `hello from the node ${randomBytes(8).toString('hex')}\n`;

test.before(async (t) => {
  const ws = await makeWorkspace(shared);
  const [tcp, uds, web, echo] = await Promise.all([
    startPair(shared, ws, { server: { frontend: 'tcp', name: 'server-tcp' }, agent: { agentID: 'agent-tcp' } }),
    startPair(shared, ws, { server: { frontend: 'uds', name: 'server-uds' }, agent: { agentID: 'agent-uds' } }),
    startHttpBackend(shared, BODY),
    startEchoBackend(shared),
  ]);
  t.context = { ws, tcpServer: tcp.server, udsServer: uds.server, web, echo };
});

function curlArgs(ws: Workspace, server: KanalServerProcess, opts: { clientCert: boolean }): string[] {
  const { pki } = ws;
  const args = [
    '-sS',
    '-v',
    '--max-time',
    '20',
    '-p',
    '--proxy',
    `https://127.0.0.1:${server.frontendPort}`,
    '--proxy-cacert',
    pki.frontendCaCert,
  ];
  if (opts.clientCert) args.push('--proxy-cert', pki.frontendClientCert, '--proxy-key', pki.frontendClientKey);
  return args;
}

test('curl: HTTP CONNECT over the mTLS TCP frontend reaches a node backend', async (t) => {
  const { ws, tcpServer, web } = t.context;
  const res = await runCurl([...curlArgs(ws, tcpServer, { clientCert: true }), `http://${web.address}/through/kanal`]);
  t.is(res.code, 0, res.stderr);
  t.is(res.stdout, BODY);
  t.regex(res.stderr, /HTTP\/1\.1 200 Connection Established/);
  t.regex(res.stderr, /x-path: \/through\/kanal/i);
});

test('curl: several requests in a row each get their own tunnel', async (t) => {
  const { ws, tcpServer, web } = t.context;
  for (let i = 0; i < 3; i++) {
    const res = await runCurl([...curlArgs(ws, tcpServer, { clientCert: true }), `http://${web.address}/n/${i}`]);
    t.is(res.code, 0, res.stderr);
    t.is(res.stdout, BODY);
  }
});

test('curl: the TCP frontend refuses a client without a certificate and logs why', async (t) => {
  const { ws, tcpServer, web } = t.context;
  const res = await runCurl([...curlArgs(ws, tcpServer, { clientCert: false }), `http://${web.address}/`]);
  t.not(res.code, 0);
  t.not(res.stdout, BODY);
  const line = await tcpServer.waitForLog(
    warnLine('refused frontend connection: no valid client certificate'),
    10_000,
    'client certificate refusal',
  );
  t.is(line.reason, 'no client certificate presented');
  // Still serving authenticated clients.
  const ok = await runCurl([...curlArgs(ws, tcpServer, { clientCert: true }), `http://${web.address}/`]);
  t.is(ok.code, 0, ok.stderr);
  t.is(ok.stdout, BODY);
});

test('Node CONNECT client over the Unix socket: echo and HTTP through the tunnel', async (t) => {
  const { udsServer, echo, web } = t.context;
  const s = await tunnelThrough(t, udsServer, echo.address);
  t.true(await echoRoundTrip(s, randomBytes(200_000)));
  t.true(await echoRoundTrip(s, Buffer.from('second round on the same tunnel')));
  // Half-close: our FIN reaches the echo backend, whose FIN comes back.
  s.end();
  t.is((await readToEnd(s, 10_000)).length, 0);

  const h = await tunnelThrough(t, udsServer, web.address);
  h.write(`GET /uds HTTP/1.1\r\nHost: ${web.address}\r\nConnection: close\r\n\r\n`);
  const raw = (await readToEnd(h, 10_000)).toString('utf8');
  t.regex(raw, /^HTTP\/1\.1 200 OK\r\n/);
  t.true(raw.endsWith(BODY));
});

test('gRPC ProxyService client (grpc-js): DIAL_REQ, DIAL_RSP, DATA both ways, CLOSE_REQ, CLOSE_RSP', async (t) => {
  const { udsServer } = t.context;
  const echo = await startEchoBackend(t); // its own, to count its connections
  const stream = frontendProxyStream(t, udsServer);
  const before = echo.accepted();

  const dial = await stream.dial(echo.address);
  t.is(dial.error, '');
  t.true(dial.connectID > 0);
  // The agent dialled the backend (its accept may trail the DIAL_RSP a little).
  for (let i = 0; i < 100 && echo.accepted() < before + 1; i++) await sleep(20);
  t.is(echo.accepted(), before + 1);

  for (const size of [1, 1000, 300_000]) t.true(await stream.echoes(dial.connectID, randomBytes(size), 15_000), `echo of ${size} bytes`);

  const rsp = await stream.closeConnection(dial.connectID);
  t.is(rsp.error, '');
  // The agent closed its end: the backend sees the connection go away (bounded wait).
  for (let i = 0; i < 100 && echo.open() > 0; i++) await sleep(50);
  t.is(echo.open(), 0);

  // The same stream can dial again after the close.
  const again = await stream.dial(echo.address);
  t.is(again.error, '');
  t.not(again.connectID, dial.connectID);
  t.true(await stream.echoes(again.connectID, randomBytes(5000), 10_000));
  t.is((await stream.closeConnection(again.connectID)).error, '');

  stream.close();
  const status = await stream.status;
  t.is(status.code, grpc.status.OK);
});

test('gRPC ProxyService client over the mTLS TCP frontend', async (t) => {
  const { ws, tcpServer, echo } = t.context;
  const stream = frontendProxyStream(t, tcpServer, ws);
  const dial = await stream.dial(echo.address);
  t.is(dial.error, '');
  t.true(await stream.echoes(dial.connectID, randomBytes(100_000), 15_000));
  t.is((await stream.closeConnection(dial.connectID)).error, '');
  stream.close();
  t.is((await stream.status).code, grpc.status.OK);
});

test('gRPC client: the backend closing first arrives as CLOSE_RSP', async (t) => {
  const { udsServer, web } = t.context;
  const stream = frontendProxyStream(t, udsServer);
  const dial = await stream.dial(web.address);
  t.is(dial.error, '');
  await stream.write(dial.connectID, Buffer.from(`GET /grpc HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
  // The web backend answers and closes; the server reports the closed endpoint.
  const closed = await stream.take(PacketType.CLOSE_RSP, (p) => p.connectID === dial.connectID, 15_000);
  t.is(closed.connectID, dial.connectID);
  const answer = Buffer.concat(
    stream
      .pending()
      .filter((p) => p.type === PacketType.DATA && p.connectID === dial.connectID)
      .map((p) => Buffer.from((p as { data: Uint8Array }).data)),
  ).toString('utf8');
  t.regex(answer, /^HTTP\/1\.1 200 OK/);
  t.true(answer.endsWith(BODY));
  stream.close();
  t.is((await stream.status).code, grpc.status.OK);
});
