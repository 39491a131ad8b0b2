/**
 * Per-agent and server-wide caps on tunnelled connections (docs/limits.md):
 * one agent opening node -> control plane connections it never closes must
 * not take the file descriptors the frontends and the health endpoint need,
 * nor another agent's share; control plane -> node connections through one
 * agent are capped too. Every refusal is counted and names its flag.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  connectThrough,
  connectUnix,
  echoesThrough,
  echoRoundTrip,
  httpConnect,
  httpGet,
  nodeListener,
  scrapeMetrics,
  startEchoBackend,
  startProxy,
  waitMetrics,
  waitUntil,
  warnLine,
  type NodeListener,
  type Scope,
} from '../helpers/kanal-processes.js';

/** Opens `n` connections to a node listener and keeps them; counts those the agent closes. */
async function openNodeConnections(
  scope: Scope,
  { host, port }: NodeListener,
  n: number,
): Promise<{ sockets: net.Socket[]; closed(): number }> {
  const sockets: net.Socket[] = [];
  let closed = 0;
  scope.teardown(() => {
    for (const s of sockets) s.destroy();
  });
  for (let i = 0; i < n; i++) {
    const s = net.connect({ host, port });
    s.on('error', () => undefined);
    s.once('close', () => closed++);
    sockets.push(s);
    if (i % 100 === 99) await sleep(50);
  }
  return { sockets, closed: () => closed };
}

async function nodeEcho(listener: NodeListener): Promise<boolean> {
  const s = await listener.connect();
  try {
    return await echoRoundTrip(s, randomBytes(1000));
  } finally {
    s.destroy();
  }
}

test.serial(
  'one agent holding 600 node -> control plane connections takes at most half the descriptors; CONNECTs and /healthz keep answering',
  async (t) => {
    t.timeout(120_000);
    const openFiles = 512;
    const echo = await startEchoBackend(t);
    const listener = await nodeListener({ host: '127.0.0.2', destination: echo.address });
    const { server } = await startProxy(t, {
      server: { openFilesLimit: openFiles, extraArgs: ['--allowed-destination', echo.address] },
      agents: [{ agentID: 'node-1', extraArgs: listener.args }],
    });

    const held = await openNodeConnections(t, listener, 600);
    const cap = openFiles / 2;
    await waitUntil(
      () => held.closed() === 600 - cap,
      `the agent closed the ${600 - cap} refused connections (closed so far: ${held.closed()})`,
      30_000,
    );
    const m = await waitMetrics(server.healthPort, { kanal_server_node_to_cp_connections: cap }, 10_000);
    t.is(m.get('kanal_refusals_total{reason="node_to_cp_connections"}'), 600 - cap);
    const refusal = await server.waitForLog(
      warnLine('refused node dial: the server holds as many node -> control plane connections as it may'),
      5000,
      'refusal logged',
    );
    t.is(refusal.flag, '--max-node-to-cp-connections');
    t.is(refusal.limit, cap);
    t.true(fs.readdirSync(`/proc/${server.pid}/fd`).length < openFiles - 100, 'descriptors to spare');

    // The kube-apiserver's path and health still answer.
    t.is((await httpGet(`http://127.0.0.1:${server.healthPort}/healthz`)).status, 200);
    for (let i = 0; i < 5; i++) t.true(await echoesThrough(server, echo.address, randomBytes(64 * 1024)), `CONNECT ${i + 1}`);
    for (const s of held.sockets) s.destroy();
    await waitMetrics(server.healthPort, { kanal_server_node_to_cp_connections: 0, kanal_server_connections_open: 0 }, 20_000);
  },
);

test.serial('--max-node-to-cp-connections-per-agent: one agent gets its share and no more; another agent is unaffected', async (t) => {
  t.timeout(90_000);
  const echo = await startEchoBackend(t);
  const node1 = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  const node2 = await nodeListener({ host: '127.0.0.3', destination: echo.address });
  const { server } = await startProxy(t, {
    server: { extraArgs: ['--allowed-destination', echo.address, '--max-node-to-cp-connections-per-agent', '40'] },
    agents: [
      { agentID: 'node-1', extraArgs: node1.args },
      { agentID: 'node-2', extraArgs: node2.args },
    ],
    ready: 'agents-ready',
  });

  const greedy = await openNodeConnections(t, node1, 60);
  await waitUntil(() => greedy.closed() === 20, `20 of node-1's connections refused (so far ${greedy.closed()})`, 20_000);
  await sleep(300);
  t.is(greedy.closed(), 20, 'the other 40 stay');
  for (let i = 0; i < 10; i++) t.true(await nodeEcho(node2), `node-2 connection ${i + 1}`);
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_refusals_total{reason="agent_node_to_cp_connections"}'), 20);
  const refusal = await server.waitForLog(
    warnLine('refusing dial request', (l) => l.agentID === 'node-1'),
    5000,
    'refusal logged',
  );
  t.regex(
    String(refusal.reason),
    /too many connections open or being dialled for the peer: 40, limit 40 \(--max-node-to-cp-connections-per-agent\)/,
  );
});

test.serial(
  "the agent's --max-cp-to-node-connections: dials beyond its cap are refused naming the flag and counted; closing one makes room",
  async (t) => {
    t.timeout(60_000);
    const echo = await startEchoBackend(t);
    const { server, agent } = await startProxy(t, { agents: [{ agentID: 'node-1', extraArgs: ['--max-cp-to-node-connections', '3'] }] });
    const open = [];
    for (let i = 0; i < 3; i++) open.push(await connectThrough(server, echo.address));
    const err = await t.throwsAsync(httpConnect(await connectUnix(server.uds), echo.address));
    t.regex(
      err?.message ?? '',
      /^HTTP\/1\.1 502 Bad Gateway: too many connections open or being dialled for the peer: 3, limit 3 \(--max-cp-to-node-connections\)/,
    );
    t.is((await scrapeMetrics(agent.adminPort)).get('kanal_refusals_total{reason="cp_to_node_connections"}'), 1);
    open.pop()!.destroy();
    await waitMetrics(server.healthPort, { kanal_server_connections_open: 2 }, 10_000);
    t.true(await echoesThrough(server, echo.address, randomBytes(1000)));
    for (const s of open) s.destroy();
  },
);

test.serial(
  '--max-cp-to-node-connections-per-agent: CONNECTs beyond the cap get 503 naming the flag; closing one makes room',
  async (t) => {
    t.timeout(60_000);
    const echo = await startEchoBackend(t);
    const { server } = await startProxy(t, {
      server: { extraArgs: ['--max-cp-to-node-connections-per-agent', '5'] },
      agents: [{ agentID: 'node-1' }],
    });
    const open = [];
    for (let i = 0; i < 5; i++) open.push(await connectThrough(server, echo.address));
    const err = await t.throwsAsync(httpConnect(await connectUnix(server.uds), echo.address));
    t.regex(
      err?.message ?? '',
      /^HTTP\/1\.1 503 Service Unavailable: too many connections open or being dialled through this tunnel: 5, limit 5 \(--max-cp-to-node-connections-per-agent\)/,
    );
    t.is((await scrapeMetrics(server.healthPort)).get('kanal_refusals_total{reason="agent_cp_to_node_connections"}'), 1);
    open.pop()!.destroy();
    await waitMetrics(server.healthPort, { kanal_server_connections_open: 4 }, 10_000);
    t.true(await echoesThrough(server, echo.address, randomBytes(1000)));
    for (const s of open) s.destroy();
  },
);
