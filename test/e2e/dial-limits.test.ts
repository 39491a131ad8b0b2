/**
 * Per-agent dial rates on real processes (docs/limits.md, "Dial rate"):
 * the server's --dial-rate-per-agent holds each agent to its rate in both
 * directions, the agent's --dial-rate holds its node's dials before they
 * reach the server. Exactly the burst gets through a concurrent flood, the
 * rest is refused at once (CONNECT 503, a node connection closed), counted as
 * throttled; the bucket refills when the load stops.
 */
import test from 'ava';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoRoundTrip,
  nodeListener,
  scrapeMetrics,
  startEchoBackend,
  startProxy,
  type NodeListener,
  type Scope,
} from '../helpers/kanal-processes.js';
import { httpConnect } from '../helpers/in-process.js';

/** `n` CONNECTs at once; the status of each. */
async function connectStatuses(scope: Scope, uds: string, address: string, n: number): Promise<number[]> {
  const replies = await Promise.all(Array.from({ length: n }, () => httpConnect(uds, address)));
  scope.teardown(() => {
    for (const r of replies) r.socket.destroy();
  });
  return replies.map((r) => r.status);
}

/** `n` node connections at once; how many echo (the rest are closed by the agent). */
async function nodeEchoes(scope: Scope, listener: NodeListener, n: number): Promise<number> {
  const sockets: net.Socket[] = [];
  scope.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  const results = await Promise.all(
    Array.from({ length: n }, async () => {
      const s = await listener.connect();
      sockets.push(s);
      s.on('error', () => undefined);
      return echoRoundTrip(s, randomBytes(100), 5_000).catch(() => false);
    }),
  );
  return results.filter(Boolean).length;
}

function count(m: Map<string, number>, series: string): number {
  return m.get(series) ?? 0;
}

test('--dial-rate-per-agent: exactly the burst of a flood gets through in each direction, the rest is refused as throttled, and the rate refills', async (t) => {
  t.timeout(90_000);
  const echo = await startEchoBackend(t);
  const listener = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  const { server } = await startProxy(t, {
    server: { extraArgs: ['--allowed-destination', echo.address, '--dial-rate-per-agent', '1', '--dial-burst-per-agent', '3'] },
    agents: [{ agentID: 'node-1', extraArgs: listener.args }],
    ready: 'every-agent',
  });

  const statuses = await connectStatuses(t, server.uds, echo.address, 8);
  const emptied = Date.now();
  t.is(statuses.filter((s) => s === 200).length, 3, `statuses ${statuses.join(' ')}`);
  t.is(statuses.filter((s) => s === 503).length, 5, `statuses ${statuses.join(' ')}`);
  t.is(await nodeEchoes(t, listener, 8), 3, 'node -> control plane: the burst, no more');

  const m = await scrapeMetrics(server.healthPort);
  t.is(count(m, 'kanal_refusals_total{reason="throttled"}'), 10);
  t.is(count(m, 'kanal_dials_total{direction="cp_to_node",result="ok"}'), 3);
  t.is(count(m, 'kanal_dials_total{direction="node_to_cp",result="ok"}'), 3);

  // Load stops: 2.5 s after the flood emptied the bucket two tokens have come back, not three.
  await sleep(2500 - (Date.now() - emptied));
  const again = await connectStatuses(t, server.uds, echo.address, 4);
  t.is(again.filter((s) => s === 200).length, 2, `statuses ${again.join(' ')}`);
});

test('--dial-rate on the agent: node dials over it are refused on the node and never reach the server', async (t) => {
  t.timeout(90_000);
  const echo = await startEchoBackend(t);
  const listener = await nodeListener({ host: '127.0.0.3', destination: echo.address });
  const { server, agents } = await startProxy(t, {
    server: { extraArgs: ['--allowed-destination', echo.address] },
    agents: [{ agentID: 'node-1', extraArgs: [...listener.args, '--dial-rate', '1', '--dial-burst', '3'] }],
    ready: 'every-agent',
  });
  t.is(await nodeEchoes(t, listener, 8), 3);
  const onAgent = await scrapeMetrics(agents[0].healthPort);
  t.is(count(onAgent, 'kanal_refusals_total{reason="throttled"}'), 5);
  const onServer = await scrapeMetrics(server.healthPort);
  t.is(count(onServer, 'kanal_dials_total{direction="node_to_cp",result="ok"}'), 3);
  t.is(
    [...onServer].filter(([k]) => k.startsWith('kanal_dials_total{direction="node_to_cp"')).reduce((n, [, v]) => n + v, 0),
    3,
    'the server saw only the dials the agent let through',
  );
});
