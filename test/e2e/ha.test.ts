/**
 * HA through the real CLI: two servers (--server-count 2) behind one address
 * (a round-robin TCP balancer, TLS passes through it), one agent. The agent
 * keeps dialing until it holds a tunnel to each server, serves control plane
 * -> node traffic through both, spreads node -> control plane connections
 * over both, and gets back to two tunnels after one server restarts.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoesThrough,
  echoRoundTrip,
  httpGet,
  makeWorkspace,
  nodeListener,
  restartServer,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  waitStatus,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { roundRobin } from '../helpers/round-robin.js';

async function waitReadyDetail(url: string, pattern: RegExp, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    last = (await httpGet(url).catch(() => ({ status: 0, body: '' }))).body;
    if (pattern.test(last)) return last;
    await sleep(100);
  }
  throw new Error(`readyz never matched ${pattern} within ${timeoutMs} ms; last: ${last.trim()}`);
}

function nodeDialsOk(m: Map<string, number>): number {
  return m.get('kanal_dials_total{direction="node_to_cp",result="ok"}') ?? 0;
}

test('one agent holds a tunnel to each of two servers behind one address and uses both', async (t) => {
  t.timeout(90_000);
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const extraArgs = ['--server-count', '2', '--allowed-destination', echo.address];
  const servers: KanalServerProcess[] = [
    await startServer(t, ws, { name: 'server-a', extraArgs }),
    await startServer(t, ws, { name: 'server-b', extraArgs }),
  ];
  const lbPort = await roundRobin(t, () => servers.map((s) => s.agentPort));
  const listener = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  const agent = await startAgent(t, ws, { ...servers[0], agentPort: lbPort }, { extraArgs: listener.args });

  const detail = await waitReadyDetail(agent.readyzUrl(), /2\/2 server tunnel\(s\) up/, 20_000);
  t.regex(detail, /server-a/);
  t.regex(detail, /server-b/);
  for (const s of servers) await waitStatus(s.readyzUrl(), 200, 10_000);

  // Control plane -> node through each server.
  for (const s of servers) t.true(await echoesThrough(s, echo.address, randomBytes(10_000)), `echo through ${s.name}`);

  // Node -> control plane: new connections are spread over both tunnels.
  for (let i = 0; i < 8; i++) {
    const c = await listener.connect();
    t.true(await echoRoundTrip(c, randomBytes(1000)));
    c.destroy();
  }
  const perServer = await Promise.all(servers.map(async (s) => nodeDialsOk(await scrapeMetrics(s.healthPort))));
  t.is(perServer[0] + perServer[1], 8);
  t.true(
    perServer.every((n) => n > 0),
    `node -> control plane dials per server: ${perServer.join(', ')}`,
  );

  // One server goes away: the agent stays ready on the other, then gets back to two.
  t.is(await servers[1].stop('SIGTERM'), 0);
  await waitReadyDetail(agent.readyzUrl(), /1\/2 server tunnel\(s\) up/, 10_000);
  t.true(await echoesThrough(servers[0], echo.address, randomBytes(1000)));
  servers[1] = await restartServer(t, servers[1]);
  await waitReadyDetail(agent.readyzUrl(), /2\/2 server tunnel\(s\) up/, 20_000);
  await waitStatus(servers[1].readyzUrl(), 200, 10_000);
});
