/**
 * --proxy-strategies (docs/routing.md): which agent a control plane -> node dial goes to,
 * with a real server and real agents in process (mTLS, gRPC, loopback). Echo
 * servers on distinct loopback addresses stand for distinct nodes; every
 * agent reaches all of them, so only routing decides who carries a dial.
 */
import test from 'ava';
import type { KanalServer } from '../../src/server/server.js';
import type { ProxyStrategy } from '../../src/server/routing/proxy-strategies.js';
import { NO_FEATURES } from '../../src/wire/features.js';
import {
  echoRoundTrip,
  grpcFrontendClient,
  httpConnect,
  makeEnv,
  startAgent,
  startEchoServer,
  startServer,
  waitFor,
  type ConnectReply,
  type TestEnv,
} from '../helpers/in-process.js';
import { dialStream } from '../helpers/connection-stream.js';

/** Which agent the server logged as carrying the dial to `address`, and by which strategy. */
function carriedBy(lines: ReadonlyArray<Record<string, unknown>>, address: string): Array<{ agentID: unknown; strategy: unknown }> {
  return lines
    .filter((l) => l.msg === 'dial established' && l.address === address)
    .map((l) => ({ agentID: l.agentID, strategy: l.strategy }));
}

function agentOf(server: KanalServer, host: string, strategies: ProxyStrategy[]): string | undefined {
  const outcome = server.registry.pick({ strategies, host });
  return outcome.ok ? outcome.backend.agentID : undefined;
}

async function connectAndEcho(env: TestEnv, address: string): Promise<ConnectReply> {
  const reply = await httpConnect(env.udsPath, address);
  if (reply.status === 200) await echoRoundTrip(reply.socket, 'ping');
  return reply;
}

function closeAll(replies: ConnectReply[]): void {
  for (const r of replies) r.socket.destroy();
}

test('destHost routes by host name, ipv4, ipv6 and cidr; what no agent announces falls to defaultRoute, then default', async (t) => {
  const env = await makeEnv(t);
  const [nodeA, nodeB, cidrNode, elsewhere] = await Promise.all([
    startEchoServer(t, '127.0.0.2'),
    startEchoServer(t, '::1'),
    startEchoServer(t, '127.0.1.9'),
    startEchoServer(t, '127.0.0.3'),
  ]);
  const { server, logs } = await startServer(t, env, { proxyStrategies: ['destHost', 'defaultRoute', 'default'] });
  await startAgent(t, env, server.agentPort, { agentID: 'node-a', identifiers: 'host=Node-A.example&ipv4=127.0.0.2' });
  await startAgent(t, env, server.agentPort, {
    agentID: 'node-b',
    identifiers: 'host=node-b.example&ipv6=0:0:0:0:0:0:0:1&cidr=127.0.1.0/24',
  });
  await startAgent(t, env, server.agentPort, { agentID: 'gateway', identifiers: 'default-route=true' });
  await startAgent(t, env, server.agentPort, { agentID: 'plain', identifiers: '' });
  await waitFor(() => server.registry.size === 4, 'four agents');

  // Names are compared case-insensitively (no DNS here: the routing decision itself).
  t.is(agentOf(server, 'node-a.EXAMPLE', ['destHost']), 'node-a');
  t.is(agentOf(server, 'node-b.example', ['destHost']), 'node-b');
  t.is(agentOf(server, 'node-c.example', ['destHost']), undefined);

  const replies: ConnectReply[] = [];
  t.teardown(() => closeAll(replies));
  for (let i = 0; i < 4; i++) {
    for (const echo of [nodeA, nodeB, cidrNode, elsewhere]) replies.push(await connectAndEcho(env, echo.address));
  }
  t.true(replies.every((r) => r.status === 200));
  t.deepEqual(
    new Set(carriedBy(logs.lines, nodeA.address).map((c) => JSON.stringify(c))),
    new Set([JSON.stringify({ agentID: 'node-a', strategy: 'destHost' })]),
  );
  t.deepEqual(
    new Set(carriedBy(logs.lines, nodeB.address).map((c) => JSON.stringify(c))),
    new Set([JSON.stringify({ agentID: 'node-b', strategy: 'destHost' })]),
  );
  t.deepEqual(
    new Set(carriedBy(logs.lines, cidrNode.address).map((c) => JSON.stringify(c))),
    new Set([JSON.stringify({ agentID: 'node-b', strategy: 'destHost' })]),
  );
  t.deepEqual(
    new Set(carriedBy(logs.lines, elsewhere.address).map((c) => JSON.stringify(c))),
    new Set([JSON.stringify({ agentID: 'gateway', strategy: 'defaultRoute' })]),
  );
  t.is(carriedBy(logs.lines, nodeA.address).length, 4);

  // The gRPC frontend (the kube-apiserver's konnectivity client) routes the same way.
  const client = await grpcFrontendClient(t, env.udsPath, NO_FEATURES);
  const viaGrpc = await dialStream(client.tunnel, nodeB.address, { timeoutMs: 5000 });
  t.is(await echoRoundTrip(viaGrpc, 'grpc'), 'grpc');
  viaGrpc.destroy();
  t.is(carriedBy(logs.lines, nodeB.address).length, 5);
  t.deepEqual(carriedBy(logs.lines, nodeB.address).at(-1), { agentID: 'node-b', strategy: 'destHost' });

  // In order: with defaultRoute first, the gateway takes what destHost would have routed.
  t.is(agentOf(server, '127.0.0.2', ['defaultRoute', 'destHost']), 'gateway');
  // Without defaultRoute, an unannounced destination goes to any agent (default).
  t.truthy(agentOf(server, '127.0.0.3', ['destHost', 'default']));
});

test('the longest cidr wins and an exact address beats any cidr (one credential)', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env, { proxyStrategies: ['destHost'], maxAgentsPerCredential: 3 });
  const shared = { credential: 'shared-daemonset' };
  await startAgent(t, env, server.agentPort, { ...shared, agentID: 'wide', identifiers: 'cidr=10.0.0.0/8' });
  await startAgent(t, env, server.agentPort, { ...shared, agentID: 'narrow', identifiers: 'cidr=10.1.0.0/16&cidr=fd00::/64' });
  await startAgent(t, env, server.agentPort, { ...shared, agentID: 'exact', identifiers: 'ipv4=10.1.2.3&ipv6=fd00::5' });
  await waitFor(() => server.registry.size === 3, 'three agents');
  t.is(agentOf(server, '10.9.9.9', ['destHost']), 'wide');
  t.is(agentOf(server, '10.1.9.9', ['destHost']), 'narrow');
  t.is(agentOf(server, '10.1.2.3', ['destHost']), 'exact');
  t.is(agentOf(server, 'fd00::7', ['destHost']), 'narrow');
  t.is(agentOf(server, 'fd00:0::5', ['destHost']), 'exact');
  t.is(agentOf(server, '11.0.0.1', ['destHost']), undefined);
});

test('a destination announced by agents of two credentials goes to neither by destHost, with a warning', async (t) => {
  const env = await makeEnv(t);
  const victim = await startEchoServer(t, '127.0.0.4');
  const { server, logs } = await startServer(t, env, { proxyStrategies: ['destHost', 'defaultRoute'] });
  await startAgent(t, env, server.agentPort, { agentID: 'node-1', identifiers: 'ipv4=127.0.0.4' });
  // Another node's credential claims node-1's address, more specifically than any cidr could.
  await startAgent(t, env, server.agentPort, { agentID: 'node-2', identifiers: 'ipv4=127.0.0.4&cidr=127.0.0.4/32' });
  await startAgent(t, env, server.agentPort, { agentID: 'gateway', identifiers: 'default-route=true' });
  await waitFor(() => server.registry.size === 3, 'three agents');
  const replies: ConnectReply[] = [];
  t.teardown(() => closeAll(replies));
  for (let i = 0; i < 4; i++) replies.push(await connectAndEcho(env, victim.address));
  t.true(replies.every((r) => r.status === 200));
  t.deepEqual(new Set(carriedBy(logs.lines, victim.address).map((c) => c.agentID)), new Set(['gateway']));
  const warning = logs.matching('agents of several credentials announce the same destination');
  t.is(warning.length, 1, 'rate-limited: one line for four dials');
  t.is(new Set(warning[0].credentials as string[]).size, 2);
});

test('a dial no strategy serves is answered 500 naming the strategies', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env, { proxyStrategies: ['destHost', 'defaultRoute'] });
  await startAgent(t, env, server.agentPort, { agentID: 'node-a', identifiers: 'ipv4=127.0.0.2' });
  await waitFor(() => server.registry.size === 1, 'agent');
  const reply = await httpConnect(env.udsPath, '127.0.0.3:80');
  t.teardown(() => reply.socket.destroy());
  t.is(reply.status, 500);
  const body = await new Promise<string>((resolve) => {
    let text = '';
    reply.socket.on('data', (c: Buffer) => (text += c.toString()));
    reply.socket.once('end', () => resolve(text));
    reply.socket.resume();
  });
  t.regex(
    body,
    /no agent serves 127\.0\.0\.3:80 under --proxy-strategies destHost,defaultRoute: destHost: no agent announces 127\.0\.0\.3; defaultRoute: no agent announces default-route=true/,
  );
});

test('destHost prefers an agent of the destination that is not draining, and falls back to a draining one', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t, '127.0.2.1');
  const { server, logs } = await startServer(t, env, {
    proxyStrategies: ['destHost', 'default'],
    maxAgentsPerCredential: 2,
    allowedDestinations: [echo.address],
  });
  const shared = { credential: 'zone-b', identifiers: 'cidr=127.0.2.0/24' };
  const leaving = await startAgent(t, env, server.agentPort, { ...shared, agentID: 'zone-b-1' });
  const staying = await startAgent(t, env, server.agentPort, { ...shared, agentID: 'zone-b-2' });
  await startAgent(t, env, server.agentPort, { agentID: 'elsewhere', identifiers: '' });
  await waitFor(() => server.registry.size === 3, 'three agents');
  // zone-b-1 keeps a connection (node -> control plane) open, so its stop waits after DRAIN.
  const held = await dialStream(leaving.agent.tunnels()[0], echo.address, { timeoutMs: 5000 });
  t.teardown(() => held.destroy());
  const stopping = leaving.stop(30_000);
  await waitFor(() => server.registry.list().find((b) => b.agentID === 'zone-b-1')?.tunnel.drainRequested === true, 'DRAIN seen');

  const replies: ConnectReply[] = [];
  t.teardown(() => closeAll(replies));
  for (let i = 0; i < 6; i++) replies.push(await connectAndEcho(env, echo.address));
  t.true(replies.every((r) => r.status === 200));
  t.deepEqual(new Set(carriedBy(logs.lines, echo.address).map((c) => c.agentID)), new Set(['zone-b-2']));

  // With zone-b-2 gone, the draining agent of the destination still wins over `default`.
  await staying.stop(0);
  await waitFor(() => server.registry.size === 2, 'zone-b-2 gone');
  t.is(agentOf(server, '127.0.2.1', ['destHost', 'default']), 'zone-b-1');
  held.destroy();
  await stopping;
});

test('among the agents a strategy allows, the least loaded gets the dial', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  await startAgent(t, env, server.agentPort, { agentID: 'busy' });
  await startAgent(t, env, server.agentPort, { agentID: 'idle' });
  await waitFor(() => server.registry.size === 2, 'two agents');
  const backendOf = (id: string) => server.registry.list().find((b) => b.agentID === id)!;
  // Eight connections already open through `busy` (dialled by the server directly).
  const held = await Promise.all(Array.from({ length: 8 }, () => dialStream(backendOf('busy').tunnel, echo.address, { timeoutMs: 5000 })));
  t.teardown(() => held.forEach((c) => c.destroy()));
  const replies: ConnectReply[] = [];
  t.teardown(() => closeAll(replies));
  for (let i = 0; i < 8; i++) replies.push(await connectAndEcho(env, echo.address));
  t.true(replies.every((r) => r.status === 200));
  t.is(backendOf('idle').tunnel.stats().connections, 8, 'every new dial went to the idle agent');
  t.is(backendOf('busy').tunnel.stats().connections, 8);
  // Level now: the next dials spread over both.
  for (let i = 0; i < 4; i++) replies.push(await connectAndEcho(env, echo.address));
  const [busy, idle] = [backendOf('busy').tunnel.stats().connections, backendOf('idle').tunnel.stats().connections];
  t.is(busy + idle, 20);
  t.true(Math.abs(busy - idle) <= 1, `balanced: busy ${busy}, idle ${idle}`);
});
