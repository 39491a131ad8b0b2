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
import { randomBytes } from 'node:crypto';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';
import { httpConnect } from '../../kit/demo/proxy-client.js';
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
