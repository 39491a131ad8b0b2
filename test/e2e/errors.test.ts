/**
 * Failure answers of the frontends, end to end through the real CLI:
 * 502 for a refused dial (and a DIAL_RSP error on gRPC), 405 for other
 * methods, 500 without an agent, 504 when the agent never answers, 400 for a
 * malformed CONNECT authority; none of them disturbs other connections.
 */
import anyTest, { type TestFn } from 'ava';
import { randomBytes } from 'node:crypto';
import type net from 'node:net';
import * as grpc from '@grpc/grpc-js';
import {
  connectThrough,
  echoesThrough,
  echoRoundTrip,
  fileScope,
  freePort,
  frontendProxyStream,
  httpGet,
  makeWorkspace,
  rawRequest,
  startAgent,
  startEchoBackend,
  startProxy,
  startServer,
  tunnelThrough,
  waitMetrics,
  waitStatus,
  warnLine,
  type Backend,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { ConnectRefused } from '../../kit/demo/proxy-client.js';

interface Ctx {
  server: KanalServerProcess;
  echo: Backend;
  /** Opened before any bad request; must keep echoing throughout (so the tests using it are serial). */
  longLived: net.Socket;
}

const test = anyTest as TestFn<Ctx>;
const shared = fileScope(test);

test.before(async (t) => {
  const { server } = await startProxy(shared);
  const echo = await startEchoBackend(shared);
  const longLived = await tunnelThrough(shared, server, echo.address);
  t.context = { server, echo, longLived };
});

/** Expects CONNECT `address` to be refused with `status`; returns the refusal. */
async function connectRefused(t: { fail(m: string): void }, server: KanalServerProcess, address: string): Promise<ConnectRefused> {
  try {
    const s = await connectThrough(server, address);
    s.destroy();
  } catch (err) {
    if (err instanceof ConnectRefused) return err;
    throw err;
  }
  t.fail(`CONNECT ${address} was accepted`);
  throw new Error('unreachable');
}

async function stillServing(t: { true(v: boolean, m?: string): void }, ctx: Ctx): Promise<void> {
  t.true(await echoRoundTrip(ctx.longLived, randomBytes(4096)), 'the long-lived connection still echoes');
  t.true(await echoesThrough(ctx.server, ctx.echo.address, Buffer.from('fresh connection')), 'a new connection works');
}

test.serial('CONNECT to a closed port answers 502 with the dial error', async (t) => {
  const closed = await freePort();
  const refusal = await connectRefused(t, t.context.server, `127.0.0.1:${closed}`);
  t.is(refusal.status, 502);
  t.regex(refusal.message, /ECONNREFUSED/);
  await t.context.server.waitForLog(
    warnLine('dial failed', (l) => l.address === `127.0.0.1:${closed}`),
    10_000,
    'dial failed',
  );
  await stillServing(t, t.context);
});

test.serial('gRPC DIAL_REQ to a closed port answers DIAL_RSP with an error; the stream stays usable', async (t) => {
  const { server, echo } = t.context;
  const closed = await freePort();
  const stream = frontendProxyStream(t, server);
  const bad = await stream.dial(`127.0.0.1:${closed}`);
  t.is(bad.connectID, 0);
  t.regex(bad.error, /ECONNREFUSED/);
  const good = await stream.dial(echo.address);
  t.is(good.error, '');
  t.true(await stream.echoes(good.connectID, randomBytes(1000), 10_000));
  t.is((await stream.closeConnection(good.connectID)).error, '');
  stream.close();
  t.is((await stream.status).code, grpc.status.OK);
});

test.serial('a method other than CONNECT answers 405', async (t) => {
  const { server } = t.context;
  for (const method of ['GET', 'POST', 'DELETE']) {
    const res = await rawRequest(server.uds, `${method} /api HTTP/1.1\r\nHost: kanal\r\nContent-Length: 0\r\n\r\n`);
    t.is(res.status, 405, res.raw);
    t.regex(res.raw, /\r\nallow: CONNECT\r\n/i);
    t.regex(res.body, new RegExp(`method ${method} not allowed`));
  }
  // The first is logged; the rest from the same peer within the interval only counted.
  await server.waitForLog(
    warnLine('refused non-CONNECT request', (l) => l.method === 'GET'),
    10_000,
    'non-CONNECT refusal',
  );
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="frontend_method"}': 3 }, 10_000);
  await stillServing(t, t.context);
});

const MALFORMED: [string, RegExp][] = [
  ['foo', /bad CONNECT authority: address "foo": expected host:port/],
  ['[::1:80', /bad CONNECT authority: .*expected \[ipv6\]:port/],
  ['::1:80', /bad CONNECT authority: .*IPv6 hosts must be in brackets/],
  ['127.0.0.1:99999', /bad CONNECT authority: .*out of range/],
  ['127.0.0.1:http', /bad CONNECT authority: .*not a number/],
  ['bad_host!:443', /bad CONNECT authority: .*not a valid host/],
];

test.serial('a malformed CONNECT authority answers 400 with a clear body, and the server keeps serving', async (t) => {
  const { server } = t.context;
  for (const [authority, body] of MALFORMED) {
    const res = await rawRequest(server.uds, `CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
    t.is(res.status, 400, `${authority}: ${res.raw}`);
    t.regex(res.body, body, authority);
  }
  // Logged once per peer and interval, every one counted.
  await server.waitForLog(
    warnLine('refused CONNECT: malformed authority', (l) => l.authority === MALFORMED[0][0]),
    10_000,
    'the first refusal',
  );
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="frontend_bad_authority"}': MALFORMED.length }, 10_000);
  // Also through the CONNECT client used everywhere else.
  const refusal = await connectRefused(t, server, 'foo');
  t.is(refusal.status, 400);
  await stillServing(t, t.context);
});

test('no agent connected: CONNECT answers 500, gRPC answers a DIAL_RSP error, /readyz is 503', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'lonely' });
  const echo = await startEchoBackend(t);
  const ready = await httpGet(server.readyzUrl());
  t.is(ready.status, 503);
  t.regex(ready.body, /no agent/);

  const refusal = await connectRefused(t, server, echo.address);
  t.is(refusal.status, 500);
  t.regex(refusal.message, /no agent/);
  await server.waitForLog(warnLine('no agent available for dial'), 10_000, 'no agent warning');

  const stream = frontendProxyStream(t, server);
  const dial = await stream.dial(echo.address);
  t.is(dial.connectID, 0);
  t.regex(dial.error, /no agent/);
  stream.close();
  t.is(echo.accepted(), 0);

  // Once an agent arrives, the same server dials.
  await startAgent(t, ws, server, { agentID: 'late-agent' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  const s = await tunnelThrough(t, server, echo.address);
  t.true(await echoRoundTrip(s, Buffer.from('now there is an agent')));
});

test('an agent that never answers the dial: CONNECT answers 504 after --backend-dial-timeout', async (t) => {
  const { server, agent } = await startProxy(t, {
    server: { name: 'slow', extraArgs: ['--backend-dial-timeout', '500ms'] },
    agents: [{ agentID: 'frozen-agent' }],
  });
  const echo = await startEchoBackend(t);
  // Stopped, the agent keeps its TCP connection but never sends DIAL_RSP.
  agent.pause();
  t.teardown(() => agent.resume());
  const started = Date.now();
  const refusal = await connectRefused(t, server, echo.address);
  t.is(refusal.status, 504);
  t.regex(refusal.message, /timed out/);
  t.true(Date.now() - started >= 450, 'not before the dial timeout');
  await server.waitForLog(
    warnLine('dial failed', (l) => l.failure === 'timeout'),
    10_000,
    'dial timeout warning',
  );

  const stream = frontendProxyStream(t, server);
  const dial = await stream.dial(echo.address);
  t.is(dial.connectID, 0);
  t.regex(dial.error, /timed out/);
  stream.close();

  // Resumed, the agent serves again and the cancelled dials leave nothing behind.
  // (A loaded machine may need a few tries to beat the deliberately short timeout.)
  agent.resume();
  let s: net.Socket | undefined;
  for (let i = 0; i < 20 && !s; i++) {
    s = await connectThrough(server, echo.address).catch((err: Error) => {
      if (!(err instanceof ConnectRefused && err.status === 504)) throw err;
      return undefined;
    });
  }
  if (!s) return t.fail('no dial succeeded after the agent resumed');
  t.teardown(() => void s.destroy());
  t.true(await echoRoundTrip(s, Buffer.from('thawed')));
  s.destroy();
  await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0, kanal_server_connections_open: 0 }, 10_000);
  t.pass();
});
