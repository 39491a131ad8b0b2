/**
 * `kanal server --workers 2` of one cluster (docs/multi-tenant.md, "Workers
 * of one cluster") through the real CLI: each worker is a server of its own
 * to the agents (server ID suffixed, --server-count multiplied), so a real
 * agent, Kanal's and upstream's, converges to a tunnel to each; the primary
 * spreads the kube-apiserver's connections over the workers; a worker killed
 * leaves the other serving and comes back; SIGTERM stops the whole server.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';
import { httpConnect } from '../../kit/demo/proxy-client.js';
import { freePort, withPortRetry } from '../../kit/launch/kanal-cli.js';
import { connectSocks, socks5Handshake } from '../helpers/socks5-client.js';
import {
  echoRoundTrip,
  echoesThrough,
  frontendProxyStream,
  tlsToFrontend,
  httpGet,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  waitUntil,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';

/** CONNECT dials served by each worker, from the primary's merged /metrics. */
async function dialsPerWorker(server: KanalServerProcess): Promise<number[]> {
  const m = await scrapeMetrics(server.healthPort);
  return [0, 1].map((w) =>
    [...m]
      .filter(([k]) => k.startsWith('kanal_dials_total{') && k.includes('result="ok"') && k.includes(`worker="${w}"`))
      .reduce((n, [, v]) => n + v, 0),
  );
}

async function agentsPerWorker(server: KanalServerProcess): Promise<number[]> {
  const m = await scrapeMetrics(server.healthPort);
  return [0, 1].map((w) => m.get(`kanal_server_agents{worker="${w}"}`) ?? 0);
}

async function readyDetail(url: string): Promise<string> {
  return (await httpGet(url).catch(() => ({ status: 0, body: '' }))).body;
}

function workerPids(server: KanalServerProcess): number[] {
  const byIndex = new Map<number, number>();
  for (const l of server.jsonLines()) if (l.msg === 'worker ready') byIndex.set(Number(l.worker), Number(l.pid));
  return [0, 1].map((i) => byIndex.get(i) ?? 0);
}

test.serial('a Kanal agent holds a tunnel to each worker; CONNECTs land on both; a killed worker leaves the other serving', async (t) => {
  t.timeout(120_000);
  const ws = await makeWorkspace(t, 'kanal-cluster-workers-');
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { name: 'cw', extraArgs: ['--workers', '2', '--allowed-destination', echo.address] });
  const agent = await startAgent(t, ws, server);
  await waitUntil(async () => /2\/2 server tunnel\(s\) up/.test(await readyDetail(agent.readyzUrl())), 'the agent holds 2 tunnels', 20_000);
  const detail = await readyDetail(agent.readyzUrl());
  t.regex(detail, /cw-w0/);
  t.regex(detail, /cw-w1/);
  await waitUntil(async () => (await agentsPerWorker(server)).every((n) => n === 1), 'each worker holds the agent', 10_000);
  t.is((await httpGet(server.readyzUrl())).status, 200);

  await echoesThrough(server, echo.address, randomBytes(2000));
  for (let i = 0; i < 19; i++) t.true(await echoesThrough(server, echo.address, randomBytes(2000)), `CONNECT ${i}`);
  const dials = await dialsPerWorker(server);
  t.is(dials[0] + dials[1], 20, `dials per worker: ${dials.join(', ')}`);
  t.true(
    dials.every((n) => n > 0),
    `both workers served dials: ${dials.join(', ')}`,
  );

  // One worker killed: the other serves at once; the primary starts it again and the agent gets back to 2 tunnels.
  const [pid0] = workerPids(server);
  t.true(pid0 > 0);
  process.kill(pid0, 'SIGKILL');
  // A connection handed over in the instant the worker died is closed (primary.ts, handing); from the primary's noticing on, none is lost.
  await waitUntil(() => server.jsonLines().some((l) => l.signal === 'SIGKILL' && l.worker === 0), 'the primary noticed', 10_000);
  for (let i = 0; i < 10; i++) t.true(await echoesThrough(server, echo.address, randomBytes(500)), `CONNECT with one worker gone ${i}`);
  await waitUntil(() => workerPids(server)[0] !== pid0 && workerPids(server)[0] > 0, 'worker 0 started again', 20_000);
  await waitUntil(
    async () => /2\/2 server tunnel\(s\) up/.test(await readyDetail(agent.readyzUrl())),
    'the agent is back to 2 tunnels',
    20_000,
  );
  for (let i = 0; i < 10; i++) t.true(await echoesThrough(server, echo.address, randomBytes(500)), `CONNECT after the restart ${i}`);

  // SIGTERM: the primary stops its workers and exits 0 on its own.
  const pids = workerPids(server);
  t.is(await server.stop('SIGTERM'), 0);
  for (const pid of pids) t.throws(() => process.kill(pid, 0), undefined, `worker ${pid} is gone`);
  t.false(fs.existsSync(server.uds), 'the Unix socket is removed');
  await agent.stop();
});

/** Tunnels an agent holds, as upstream's agent metric names it (Kanal's agent exports it too). */
const OPEN_TUNNELS = 'konnectivity_network_proxy_agent_open_server_connections';

async function tunnelsOf(healthPort: number): Promise<number> {
  return (await scrapeMetrics(healthPort).catch(() => new Map<string, number>())).get(OPEN_TUNNELS) ?? 0;
}

test.serial("upstream's agent converges too; the TCP frontend's CONNECT and gRPC streams are served by both workers", async (t) => {
  t.timeout(120_000);
  const ws = await makeWorkspace(t, 'kanal-cluster-workers-');
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    name: 'cwt',
    frontend: 'tcp',
    extraArgs: ['--workers', '2', '--allowed-destination', echo.address],
  });
  const missing = upstreamUnavailableReason();
  if (missing) t.log(`only Kanal's agent: ${missing}`);
  const agents = [
    await startAgent(t, ws, server, { agentID: 'kanal-node' }),
    ...(missing ? [] : [await startUpstreamAgent(t, ws, server, { agentID: 'upstream-node' })]),
  ];
  for (const a of agents) {
    const since = Date.now();
    await waitUntil(async () => (await tunnelsOf(a.healthPort)) === 2, `${a.agentID} holds a tunnel to each worker`, 20_000);
    // From the agent's first tunnel (startAgent waits for it) to its second: the duplicates it met on the way, at its sync interval.
    t.log(`${a.agentID}: its second tunnel ${Date.now() - since} ms after the first`);
  }
  await waitUntil(async () => (await agentsPerWorker(server)).every((n) => n === agents.length), 'each worker holds every agent', 10_000);

  for (let i = 0; i < 16; i++) {
    const s = await httpConnect(await tlsToFrontend(server, ws), echo.address, 10_000);
    t.true(await echoRoundTrip(s, randomBytes(1000)), `CONNECT over mTLS ${i}`);
    s.destroy();
  }
  for (let i = 0; i < 8; i++) {
    const stream = frontendProxyStream(t, server, ws);
    const dial = await stream.dial(echo.address);
    t.is(dial.error, '');
    t.true(await stream.echoes(dial.connectID, randomBytes(1000), 10_000), `gRPC stream ${i}`);
    stream.close();
  }
  const dials = await dialsPerWorker(server);
  t.is(dials[0] + dials[1], 24, `dials per worker: ${dials.join(', ')}`);
  t.true(
    dials.every((n) => n > 0),
    `both workers served dials: ${dials.join(', ')}`,
  );
  t.is(await server.stop('SIGTERM'), 0);
});

/** CONNECT to `address` through the HTTP proxy port with a bearer token; the status, and the open tunnel on 200. */
async function connectWithToken(port: number, address: string, token: string): Promise<{ status: number; socket: net.Socket }> {
  const socket = net.connect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  const head = await new Promise<Buffer>((resolve, reject) => {
    let got = Buffer.alloc(0);
    const timer = setTimeout(() => reject(new Error(`CONNECT ${address}: no answer within 10 s`)), 10_000);
    socket.on('data', function onData(chunk: Buffer) {
      got = Buffer.concat([got, chunk]);
      if (got.indexOf('\r\n\r\n') < 0) return;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.pause();
      resolve(got);
    });
    socket.once('close', () => reject(new Error(`CONNECT ${address}: closed before an answer`)));
    socket.write(`CONNECT ${address} HTTP/1.1\r\nHost: ${address}\r\nProxy-Authorization: Bearer ${token}\r\n\r\n`);
  });
  const end = head.indexOf('\r\n\r\n');
  if (end + 4 < head.length) socket.unshift(head.subarray(end + 4));
  return { status: Number(head.toString('latin1').split(' ')[1]), socket };
}

test.serial(
  'the HTTP proxy and SOCKS5 ports spread over the workers; a SIGHUP to the primary reaches them, and the primary stays',
  async (t) => {
    t.timeout(120_000);
    const ws = await makeWorkspace(t, 'kanal-cluster-workers-');
    const echo = await startEchoBackend(t);
    const tokenFile = path.join(ws.dir, 'scraper.token');
    fs.writeFileSync(tokenFile, 'first-token\n', { mode: 0o600 });
    const clientsFile = path.join(ws.dir, 'clients.yaml');
    fs.writeFileSync(
      clientsFile,
      `clients:\n- name: scraper\n  token-file: ${JSON.stringify(tokenFile)}\n  allow: all\n- name: kube-apiserver\n  uid: ${process.getuid?.() ?? 0}\n  allow: all\n`,
    );
    // freePort() races other test files, and startServer keeps extra ports across its retries: a start that dies of EADDRINUSE starts again on fresh ones.
    const { server, proxyPort, socksPort } = await withPortRetry(async () => {
      const [proxyPort, socksPort] = [await freePort(), await freePort()];
      const server = await startServer(t, ws, {
        name: 'cwp',
        extraArgs: [
          '--workers',
          'auto',
          '--http-proxy-port',
          String(proxyPort),
          '--socks5-port',
          String(socksPort),
          '--frontend-clients-config',
          clientsFile,
          '--allowed-destination',
          echo.address,
        ],
      });
      return { server, proxyPort, socksPort };
    });
    const workers = workerPids(server).filter((p) => p > 0).length;
    if (workers < 2) {
      t.log(`--workers auto started ${workers} worker(s) on this machine: the spread is not shown`);
    }
    const agent = await startAgent(t, ws, server);
    await waitUntil(
      async () => new RegExp(`${workers}/${workers} server tunnel\\(s\\) up`).test(await readyDetail(agent.readyzUrl())),
      `the agent holds ${workers} tunnels`,
      20_000,
    );
    await waitUntil(
      async () => (await agentsPerWorker(server)).slice(0, workers).every((n) => n === 1),
      'each worker holds the agent',
      10_000,
    );

    for (let i = 0; i < 8; i++) {
      const { status, socket } = await connectWithToken(proxyPort, echo.address, 'first-token');
      t.is(status, 200, `CONNECT through the HTTP proxy port ${i}`);
      t.true(await echoRoundTrip(socket, randomBytes(500)), `echo through the HTTP proxy port ${i}`);
      socket.destroy();
    }
    const [host, port] = [echo.address.split(':')[0], Number(echo.address.split(':')[1])];
    for (let i = 0; i < 4; i++) {
      const s = await connectSocks({ port: socksPort });
      const outcome = await socks5Handshake(s, host, port, { auth: { username: 'scraper', password: 'first-token' } });
      t.deepEqual([outcome.kind, outcome.kind === 'reply' ? outcome.rep : -1], ['reply', 0], `SOCKS5 dial ${i}`);
      t.true(await echoRoundTrip(s, randomBytes(500)), `echo through SOCKS5 ${i}`);
      s.destroy();
    }
    const dials = await dialsPerWorker(server);
    t.is(dials[0] + dials[1], 12, `dials per worker: ${dials.join(', ')}`);
    if (workers >= 2)
      t.true(
        dials.every((n) => n > 0),
        `both workers served the plain listeners' dials: ${dials.join(', ')}`,
      );

    // A token file's change is read at the next reload of the clients file: here the SIGHUP (docs/frontends.md).
    fs.writeFileSync(tokenFile, 'second-token\n');
    const reloadedBefore = server.jsonLines().filter((l) => l.msg === 'frontend clients reloaded').length;
    server.signal('SIGHUP');
    await waitUntil(
      () => server.jsonLines().filter((l) => l.msg === 'frontend clients reloaded').length >= reloadedBefore + workers,
      'every worker read the clients file again',
      15_000,
    );
    for (let i = 0; i < 4; i++) {
      const old = await connectWithToken(proxyPort, echo.address, 'first-token');
      t.is(old.status, 403, `the old token is refused after the SIGHUP ${i}`);
      old.socket.destroy();
      const fresh = await connectWithToken(proxyPort, echo.address, 'second-token');
      t.is(fresh.status, 200, `the new token is taken after the SIGHUP ${i}`);
      fresh.socket.destroy();
    }
    t.true(server.running(), `the primary is still running after SIGHUP: ${server.ended() ?? ''}`);
    t.is(await server.stop('SIGTERM'), 0);
    await agent.stop();
  },
);
