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
  echoRoundTrip,
  freePort,
  httpConnect,
  httpGet,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  waitMetrics,
  waitStatus,
  waitUntil,
  warnLine,
  type Scope,
} from '../helpers/kanal-processes.js';

/** Opens `n` node connections to host:port and keeps them; counts those the agent closes. */
async function openNodeConnections(scope: Scope, host: string, port: number, n: number): Promise<{ sockets: net.Socket[]; closed(): number }> {
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

async function nodeEcho(host: string, port: number): Promise<boolean> {
  const s = net.connect({ host, port });
  try {
    await new Promise<void>((resolve, reject) => s.once('connect', resolve).once('error', reject));
    return await echoRoundTrip(s, randomBytes(1000));
  } finally {
    s.destroy();
  }
}

test.serial('one agent holding 600 node -> control plane connections takes at most half the descriptors; CONNECTs and /healthz keep answering', async (t) => {
  t.timeout(120_000);
  const openFiles = 512;
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { openFilesLimit: openFiles, extraArgs: ['--allowed-destination', echo.address] });
  const localPort = await freePort('127.0.0.2');
  await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: ['--bind-address', '127.0.0.2', '--bind-interface-type', 'none', '--target', `${localPort}:${echo.address}`] });
  await waitStatus(server.readyzUrl(), 200, 10_000);

  const held = await openNodeConnections(t, '127.0.0.2', localPort, 600);
  const cap = openFiles / 2;
  await waitUntil(() => held.closed() === 600 - cap, `the agent closed the ${600 - cap} refused connections (closed so far: ${held.closed()})`, 30_000);
  const m = await waitMetrics(server.healthPort, { kanal_server_node_to_cp_connections: cap }, 10_000);
  t.is(m.get('kanal_refusals_total{reason="node_to_cp_connections"}'), 600 - cap);
  const refusal = await server.waitForLog(warnLine('refused node dial: the server holds as many node -> control plane connections as it may'), 5000, 'refusal logged');
  t.is(refusal.flag, '--max-node-to-cp-connections');
  t.is(refusal.limit, cap);
  t.true(fs.readdirSync(`/proc/${server.pid}/fd`).length < openFiles - 100, 'descriptors to spare');

  // The kube-apiserver's path and health still answer.
  t.is((await httpGet(`http://127.0.0.1:${server.healthPort}/healthz`)).status, 200);
  for (let i = 0; i < 5; i++) {
    const s = await connectThrough(server, echo.address);
    t.true(await echoRoundTrip(s, randomBytes(64 * 1024)), `CONNECT ${i + 1}`);
    s.destroy();
  }
  for (const s of held.sockets) s.destroy();
  await waitMetrics(server.healthPort, { kanal_server_node_to_cp_connections: 0, kanal_server_connections_open: 0 }, 20_000);
});

test.serial('--max-node-to-cp-connections-per-agent: one agent gets its share and no more; another agent is unaffected', async (t) => {
  t.timeout(90_000);
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--allowed-destination', echo.address, '--max-node-to-cp-connections-per-agent', '40'] });
  const port1 = await freePort('127.0.0.2');
  const port2 = await freePort('127.0.0.3');
  const node = (address: string, port: number): string[] => ['--bind-address', address, '--bind-interface-type', 'none', '--target', `${port}:${echo.address}`];
  await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: node('127.0.0.2', port1) });
  await startAgent(t, ws, server, { agentID: 'node-2', extraArgs: node('127.0.0.3', port2) });

  const greedy = await openNodeConnections(t, '127.0.0.2', port1, 60);
  await waitUntil(() => greedy.closed() === 20, `20 of node-1's connections refused (so far ${greedy.closed()})`, 20_000);
  await sleep(300);
  t.is(greedy.closed(), 20, 'the other 40 stay');
  for (let i = 0; i < 10; i++) t.true(await nodeEcho('127.0.0.3', port2), `node-2 connection ${i + 1}`);
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_refusals_total{reason="agent_node_to_cp_connections"}'), 20);
  const refusal = await server.waitForLog(warnLine('refusing dial request', (l) => l.agentID === 'node-1'), 5000, 'refusal logged');
  t.regex(String(refusal.reason), /too many connections open or being dialled for the peer: 40, limit 40 \(--max-node-to-cp-connections-per-agent\)/);
});

test.serial('the agent\'s --max-cp-to-node-connections: dials beyond its cap are refused naming the flag and counted; closing one makes room', async (t) => {
  t.timeout(60_000);
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws);
  const agent = await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: ['--max-cp-to-node-connections', '3'] });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  const open = [];
  for (let i = 0; i < 3; i++) open.push(await connectThrough(server, echo.address));
  const err = await t.throwsAsync(httpConnect(await connectUnix(server.uds), echo.address));
  t.regex(err?.message ?? '', /^HTTP\/1\.1 502 Bad Gateway: too many connections open or being dialled for the peer: 3, limit 3 \(--max-cp-to-node-connections\)/);
  t.is((await scrapeMetrics(agent.adminPort)).get('kanal_refusals_total{reason="cp_to_node_connections"}'), 1);
  open.pop()!.destroy();
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 2 }, 10_000);
  const again = await connectThrough(server, echo.address);
  t.true(await echoRoundTrip(again, randomBytes(1000)));
  for (const s of [...open, again]) s.destroy();
});

test.serial('--max-cp-to-node-connections-per-agent: CONNECTs beyond the cap get 503 naming the flag; closing one makes room', async (t) => {
  t.timeout(60_000);
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--max-cp-to-node-connections-per-agent', '5'] });
  await startAgent(t, ws, server, { agentID: 'node-1' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  const open = [];
  for (let i = 0; i < 5; i++) open.push(await connectThrough(server, echo.address));
  const err = await t.throwsAsync(httpConnect(await connectUnix(server.uds), echo.address));
  t.regex(err?.message ?? '', /^HTTP\/1\.1 503 Service Unavailable: too many connections open or being dialled through this tunnel: 5, limit 5 \(--max-cp-to-node-connections-per-agent\)/);
  t.is((await scrapeMetrics(server.healthPort)).get('kanal_refusals_total{reason="agent_cp_to_node_connections"}'), 1);
  open.pop()!.destroy();
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 4 }, 10_000);
  const again = await connectThrough(server, echo.address);
  t.true(await echoRoundTrip(again, randomBytes(1000)));
  for (const s of [...open, again]) s.destroy();
});
