/**
 * KanalServer and ServerTunnels constructed directly in the test process, over
 * real sockets (agent port with mTLS on 127.0.0.1, frontend on a Unix
 * socket): traffic in both directions, tables back to zero, DRAIN on agent
 * stop, refusals, readiness.
 */
import test from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { DialError } from '../../src/tunnel/errors.js';
import { Feature, NO_FEATURES } from '../../src/wire/features.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_AGENT_IDENTIFIERS } from '../../src/wire/metadata.js';
import { GrpcStatus, GrpcStatusError } from '../../src/transport/transport.js';
import { grpcJsTransport } from '../../src/transport/grpc-js/index.js';
import type { KanalServer } from '../../src/server/server.js';
import type { ServerTunnels } from '../../src/agent/server-tunnels.js';
import fs from 'node:fs';
import {
  closedPort,
  echoRoundTrip,
  grpcFrontendClient,
  httpConnect,
  httpGet,
  makeEnv,
  startAgent,
  startEchoServer,
  startServer,
  waitFor,
} from '../helpers/in-process.js';
import { dialStream } from '../helpers/connection-stream.js';

function serverIdle(server: KanalServer): boolean {
  const s = server.stats();
  return [...s.agentTunnels, ...s.frontendTunnels].every((x) => x.connections === 0 && x.pendingDials === 0 && x.inboundDials === 0);
}

/** The agent a default-strategy dial would go to now. */
function pickedAgentID(server: KanalServer): string | undefined {
  const outcome = server.registry.pick();
  return outcome.ok ? outcome.backend.agentID : undefined;
}

function agentIdle(agent: ServerTunnels): boolean {
  return agent.stats().tunnels.every((x) => x.connections === 0 && x.pendingDials === 0 && x.inboundDials === 0);
}

function closeSocket(s: { destroy(): void; once(e: 'close', l: () => void): unknown; destroyed: boolean }): Promise<void> {
  return new Promise((resolve) => {
    s.once('close', () => resolve());
    s.destroy();
  });
}

test('control plane -> node: HTTP CONNECT and gRPC frontend through the agent; tables return to zero', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const backend = server.registry.list()[0];
  t.is(backend.agentID, 'node-1');
  t.deepEqual(backend.identifiers.hosts, ['node-1']);
  t.deepEqual(backend.identifiers.ipv4, ['10.0.0.5']);
  t.deepEqual([...backend.tunnel.features].sort(), ['half-close', 'node-dial', 'resolve', 'resume', 'window']);
  t.deepEqual(
    agent.stats().tunnels.map((x) => x.serverID),
    ['test-server'],
  );

  // HTTP CONNECT, ten at once.
  const replies = await Promise.all(Array.from({ length: 10 }, () => httpConnect(env.udsPath, echo.address)));
  for (const r of replies) {
    t.is(r.status, 200);
    t.regex(r.head, /^HTTP\/1\.1 200 Connection Established/);
  }
  for (const [i, r] of replies.entries()) t.is(await echoRoundTrip(r.socket, `hello ${i}`), `hello ${i}`);
  t.is(server.stats().agentTunnels[0].connections, 10);
  t.is(agent.stats().tunnels[0].connections, 10);
  t.is(echo.open, 10);

  // The gRPC frontend, with Kanal features negotiated.
  const client = await grpcFrontendClient(t, env.udsPath, new Set([Feature.Window, Feature.HalfClose]));
  t.deepEqual([...client.tunnel.features].sort(), ['half-close', 'window']);
  const conns = await Promise.all([1, 2, 3].map(() => dialStream(client.tunnel, echo.address, { timeoutMs: 5000 })));
  for (const [i, c] of conns.entries()) t.is(await echoRoundTrip(c, `grpc ${i}`), `grpc ${i}`);
  t.is(server.stats().frontendStreams, 1);
  t.is(server.stats().frontendTunnels[0].connections, 3);
  t.is(server.stats().agentTunnels[0].connections, 13);

  // Close everything from the client side; every table empties.
  await Promise.all(replies.map((r) => closeSocket(r.socket)));
  for (const c of conns) c.destroy();
  await waitFor(() => serverIdle(server) && agentIdle(agent) && echo.open === 0, 'tables empty after traffic', 10_000);
  client.close();
  await waitFor(() => server.stats().frontendStreams === 0, 'frontend stream gone');
  t.is(server.stats().agents, 1);
});

test('HTTP CONNECT refusals use upstream status codes: 500 no agent, 502 dial error, 405 method, 400 authority', async (t) => {
  const env = await makeEnv(t);
  const { server, logs } = await startServer(t, env);
  const noAgent = await httpConnect(env.udsPath, '127.0.0.1:1');
  t.is(noAgent.status, 500);
  noAgent.socket.destroy();
  const get = await httpConnect(env.udsPath, '/', 'GET');
  t.is(get.status, 405);
  get.socket.destroy();
  t.true(logs.matching('refused non-CONNECT request').length >= 1);

  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1, 'agent connected');
  const refused = await httpConnect(env.udsPath, `127.0.0.1:${await closedPort()}`);
  t.is(refused.status, 502);
  refused.socket.destroy();
  const bad = await httpConnect(env.udsPath, 'no-port-here');
  t.is(bad.status, 400);
  bad.socket.destroy();
  await waitFor(() => serverIdle(server) && agentIdle(agent), 'tables empty');
});

test('node -> control plane: the server dials allow-listed destinations only', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server, logs } = await startServer(t, env, { allowedDestinations: [echo.address] });
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => agent.tunnels().length === 1 && server.registry.size === 1, 'tunnel up');
  const tunnel = agent.tunnels()[0];
  t.true(tunnel.features.has(Feature.NodeDial));

  const conn = await dialStream(tunnel, echo.address, { timeoutMs: 5000 });
  t.is(conn.connection.connectID % 2, 0, 'the server assigns even connectIDs');
  t.is(await echoRoundTrip(conn, 'kubelet says hi'), 'kubelet says hi');
  t.is(server.stats().agentTunnels[0].connections, 1);

  const other = await closedPort();
  const err = await t.throwsAsync(tunnel.dial(`127.0.0.1:${other}`, { timeoutMs: 5000 }));
  t.true(err instanceof DialError);
  t.regex(err.message, /not allowed/);
  t.is(logs.matching('refused node dial: destination not on the allow-list').length, 1);

  conn.destroy();
  await waitFor(() => serverIdle(server) && agentIdle(agent) && echo.open === 0, 'tables empty');
});

test('a server without --allowed-destination refuses every node dial; an agent without features gets plain Konnectivity', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server, logs } = await startServer(t, env);
  t.is(logs.matching('every node -> control plane dial will be refused').length, 1);
  const plain = await startAgent(t, env, server.agentPort, { agentID: 'plain', features: NO_FEATURES });
  await waitFor(() => plain.agent.tunnels().length === 1, 'tunnel up');
  const tunnel = plain.agent.tunnels()[0];
  t.is(tunnel.features.size, 0);
  t.is(server.registry.list()[0].tunnel.features.size, 0);
  // Node -> CP was not negotiated: the server refuses it explicitly.
  const err = await t.throwsAsync(tunnel.dial(echo.address, { timeoutMs: 5000 }));
  t.regex(err.message, /not negotiated/);
  // Control plane -> node still works.
  const r = await httpConnect(env.udsPath, echo.address);
  t.is(r.status, 200);
  t.is(await echoRoundTrip(r.socket, 'plain'), 'plain');
  await closeSocket(r.socket);
  await waitFor(() => serverIdle(server) && agentIdle(plain.agent), 'tables empty');
});

test('agent.stop(grace) sends DRAIN: the server prefers the other agent, and the agent waits for open connections', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server, logs } = await startServer(t, env, { allowedDestinations: [echo.address] });
  const a1 = await startAgent(t, env, server.agentPort, { agentID: 'node-a' });
  const a2 = await startAgent(t, env, server.agentPort, { agentID: 'node-b' });
  await waitFor(() => server.registry.size === 2 && a1.agent.tunnels().length === 1 && a2.agent.tunnels().length === 1, 'two agents');
  const backendOf = (id: string) => server.registry.list().find((b) => b.agentID === id);

  // Keep one connection open through node-a (node -> CP) so its stop has to wait.
  const held = await dialStream(a1.agent.tunnels()[0], echo.address, { timeoutMs: 5000 });
  t.is(await echoRoundTrip(held, 'held'), 'held');

  let stopped = false;
  const stopping = a1.stop(30_000).then(() => (stopped = true));
  await waitFor(() => backendOf('node-a')?.tunnel.drainRequested === true, 'server saw DRAIN');
  t.is(logs.matching('peer requested drain').length, 1);
  t.false(backendOf('node-b')!.tunnel.drainRequested);
  for (let i = 0; i < 50; i++) t.is(pickedAgentID(server), 'node-b');

  // New control plane -> node dials all go to node-b.
  const replies = await Promise.all(Array.from({ length: 8 }, () => httpConnect(env.udsPath, echo.address)));
  t.true(replies.every((r) => r.status === 200));
  t.is(backendOf('node-b')!.tunnel.stats().connections, 8);
  t.is(backendOf('node-a')!.tunnel.stats().connections, 1, 'only the held connection');
  // DRAIN means "prefer others": a draining agent still serves a dial it is asked for (docs/operations.md).
  const direct = await dialStream(backendOf('node-a')!.tunnel, echo.address, { timeoutMs: 5000 });
  t.is(await echoRoundTrip(direct, 'direct'), 'direct');
  await closeSocket(direct);

  await sleep(100);
  t.false(stopped, 'stop waits while a connection is open');
  t.true(server.readiness().ready);
  held.destroy();
  await stopping;
  await waitFor(() => server.registry.size === 1, 'node-a gone');
  t.is(server.registry.list()[0].agentID, 'node-b');
  t.true(server.readiness().ready, 'still ready with node-b');
  await Promise.all(replies.map((r) => closeSocket(r.socket)));
  await waitFor(() => serverIdle(server) && agentIdle(a2.agent), 'tables empty');
  t.is(server.stats().agents, 1);
});

test('when only draining agents are left, the server still uses them', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env, { allowedDestinations: [echo.address] });
  const a1 = await startAgent(t, env, server.agentPort, { agentID: 'only' });
  await waitFor(() => server.registry.size === 1 && a1.agent.tunnels().length === 1, 'agent');
  const held = await dialStream(a1.agent.tunnels()[0], echo.address, { timeoutMs: 5000 });
  const stopping = a1.stop(30_000);
  await waitFor(() => server.registry.list()[0].tunnel.drainRequested, 'drain');
  t.is(pickedAgentID(server), 'only');
  held.destroy();
  await stopping;
});

test('agent.stop(grace) closes what is still open when the grace period ends; server tables empty', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  const a = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1, 'agent');
  const r = await httpConnect(env.udsPath, echo.address);
  t.is(r.status, 200);
  // The client sees EOF (its socket is half-open capable, so it does not close by itself).
  const socketEnded = new Promise<void>((resolve) => r.socket.once('end', () => resolve()));
  r.socket.resume();
  await a.stop(200);
  await socketEnded;
  r.socket.destroy();
  await waitFor(() => server.stats().agents === 0 && server.stats().agentTunnels.length === 0, 'agent gone from the server');
  t.is(a.agent.tunnels().length, 0);
  t.true(a.logs.matching('grace period over').length === 1);
  await waitFor(() => echo.open === 0, 'destination socket closed');
});

test('the server refuses agent streams without exactly one agentID (INVALID_ARGUMENT) or with bad identifiers', async (t) => {
  const env = await makeEnv(t);
  const { server, logs } = await startServer(t, env);
  const channel = grpcJsTransport.createChannel({
    target: `127.0.0.1:${server.agentPort}`,
    tls: { ca: fs.readFileSync(env.pki.caCert), cert: fs.readFileSync(env.pki.agentCert), key: fs.readFileSync(env.pki.agentKey) },
  });
  t.teardown(() => channel.close());

  const noID = await t.throwsAsync(channel.openStream(AGENT_SERVICE_CONNECT, {}, 5000));
  t.true(noID instanceof GrpcStatusError);
  t.is((noID as GrpcStatusError).code, GrpcStatus.INVALID_ARGUMENT);
  t.regex(noID.message, /exactly one agentID/);
  t.is(logs.matching('refused agent stream: expected exactly one agentID').length, 1);

  const badIdentifiers = await t.throwsAsync(
    channel.openStream(AGENT_SERVICE_CONNECT, { [MD_AGENT_ID]: 'x', [MD_AGENT_IDENTIFIERS]: 'planet=mars' }, 5000),
  );
  t.is((badIdentifiers as GrpcStatusError).code, GrpcStatus.INVALID_ARGUMENT);
  t.regex(badIdentifiers.message, /unknown agent identifier "planet"/);
  // A malformed value would silently misroute: refused as well, naming it.
  const badCidr = await t.throwsAsync(
    channel.openStream(AGENT_SERVICE_CONNECT, { [MD_AGENT_ID]: 'x', [MD_AGENT_IDENTIFIERS]: 'cidr=10.0.0.0/40' }, 5000),
  );
  t.is((badCidr as GrpcStatusError).code, GrpcStatus.INVALID_ARGUMENT);
  t.regex(badCidr.message, /cidr "10\.0\.0\.0\/40" is not an address block/);
  t.is(server.registry.size, 0);
  t.false(server.readiness().ready);
});

test('agents without a valid client certificate are refused at the TLS layer and never become ready', async (t) => {
  const env = await makeEnv(t);
  const { server, logs } = await startServer(t, env);
  const none = await startAgent(t, env, server.agentPort, { agentID: 'no-cert', clientCert: 'none', health: false });
  const rogue = await startAgent(t, env, server.agentPort, { agentID: 'rogue', clientCert: 'rogue', health: false });
  await waitFor(() => logs.matching('refused agent connection').length >= 2, 'two refusals logged');
  await sleep(300);
  t.is(server.registry.size, 0);
  t.false(none.agent.readiness().ready);
  t.false(rogue.agent.readiness().ready);
  t.regex(none.agent.readiness().detail, /no tunnel/);
  await waitFor(() => none.logs.matching('cannot connect to proxy server').length >= 1, 'the agent logs why', 10_000);
  t.is(server.registry.size, 0);
});

test('readiness: server and agent, in process and on /readyz, follow the tunnel', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env);
  t.deepEqual(server.readiness(), { ready: false, detail: 'no agent connected' });
  t.is((await httpGet(server.healthPort, '/readyz')).status, 503);
  t.is((await httpGet(server.healthPort, '/healthz')).status, 200);

  const a = await startAgent(t, env, server.agentPort);
  await waitFor(() => a.agent.readiness().ready && server.readiness().ready, 'both ready');
  const ready = await httpGet(server.healthPort, '/readyz');
  t.is(ready.status, 200);
  t.regex(ready.body, /1 agent\(s\) connected/);
  const agentReady = await httpGet(a.agent.healthPort, '/readyz');
  t.is(agentReady.status, 200);
  t.regex(agentReady.body, /1\/1 server tunnel\(s\) up: test-server/);

  // The server goes away: the agent is no longer ready and says why.
  await server.stop();
  await waitFor(() => !a.agent.readiness().ready, 'agent not ready');
  t.is((await httpGet(a.agent.healthPort, '/readyz')).status, 503);
  t.is((await httpGet(a.agent.healthPort, '/healthz')).status, 200, 'alive while not ready');

  t.regex(a.agent.readiness().detail, /no tunnel to a proxy server/);

  // A new server on the same port: the agent reconnects by itself and is ready again.
  const again = await startServer(t, env, { serverID: 'test-server-2', udsPath: `${env.udsPath}.2`, agentPort: server.agentPort });
  await waitFor(() => a.agent.readiness().ready && again.server.readiness().ready, 'ready again', 10_000);
  t.regex(a.agent.readiness().detail, /test-server-2/);
  await a.stop(1000);
  await waitFor(() => !again.server.readiness().ready, 'server not ready after the agent left');
  t.is((await httpGet(again.server.healthPort, '/readyz')).status, 503);
  t.deepEqual(again.server.stats(), { agents: 0, frontendStreams: 0, agentTunnels: [], frontendTunnels: [] });
});

test('half-close end to end: a client FIN through HTTP CONNECT and the gRPC frontend still gets the whole reply', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const payload = 'x'.repeat(300_000);

  // HTTP CONNECT: write, FIN, then read the echo until EOF.
  const r = await httpConnect(env.udsPath, echo.address);
  t.is(r.status, 200);
  const got = new Promise<string>((resolve, reject) => {
    let s = '';
    r.socket.setEncoding('utf8');
    r.socket.on('data', (c: string) => (s += c));
    r.socket.once('end', () => resolve(s));
    r.socket.once('error', reject);
  });
  r.socket.resume();
  r.socket.end(payload);
  t.is((await got).length, payload.length, 'HTTP CONNECT: the reply after our FIN arrives in full');

  // gRPC frontend with the half-close feature.
  const client = await grpcFrontendClient(t, env.udsPath, new Set([Feature.Window, Feature.HalfClose]));
  const conn = await dialStream(client.tunnel, echo.address, { timeoutMs: 5000 });
  const back = new Promise<number>((resolve, reject) => {
    let n = 0;
    conn.on('data', (c: Buffer) => (n += c.length));
    conn.once('end', () => resolve(n));
    conn.once('error', reject);
  });
  conn.end(payload);
  t.is(await back, payload.length, 'gRPC frontend: the reply after our half-close arrives in full');
  r.socket.destroy();
  await waitFor(() => serverIdle(server) && agentIdle(agent) && echo.open === 0, 'tables empty', 10_000);
});

test('hundreds of CONNECT cycles and agent restarts leave every table empty', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  for (let round = 0; round < 3; round++) {
    const a = await startAgent(t, env, server.agentPort, { agentID: `node-${round}`, health: false });
    await waitFor(() => server.registry.size === 1 && a.agent.tunnels().length === 1, 'agent connected');
    for (let batch = 0; batch < 10; batch++) {
      await Promise.all(
        Array.from({ length: 10 }, async (_, i) => {
          const r = await httpConnect(env.udsPath, echo.address);
          if (r.status !== 200) throw new Error(`CONNECT answered ${r.status}`);
          const text = `round ${round} batch ${batch} conn ${i}`;
          if ((await echoRoundTrip(r.socket, text)) !== text) throw new Error('bad echo');
          await closeSocket(r.socket);
        }),
      );
    }
    await waitFor(() => serverIdle(server) && agentIdle(a.agent), `tables empty after round ${round}`, 10_000);
    await a.stop(1000);
    await waitFor(() => server.stats().agents === 0, `agent ${round} gone`);
  }
  await waitFor(() => echo.open === 0, 'destination sockets closed');
  t.is(echo.accepted, 300);
  t.deepEqual(server.stats(), { agents: 0, frontendStreams: 0, agentTunnels: [], frontendTunnels: [] });
});

test('an abruptly dropped tunnel closes its connections on the server and the agent reconnects', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const { server } = await startServer(t, env);
  const { agent, logs } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const replies = await Promise.all([1, 2, 3].map(() => httpConnect(env.udsPath, echo.address)));
  t.true(replies.every((r) => r.status === 200));
  const ended = replies.map(
    (r) => new Promise<void>((resolve) => (r.socket.once('end', () => resolve()), r.socket.once('close', () => resolve()))),
  );
  for (const r of replies) r.socket.resume();
  const first = agent.tunnels()[0];

  first.close(new Error('simulated network failure')); // cancels the gRPC call
  await Promise.all(ended);
  await waitFor(() => echo.open === 0, 'destination sockets closed');
  await waitFor(() => agent.tunnels().length === 1 && agent.tunnels()[0] !== first && server.registry.size === 1, 'reconnected', 10_000);
  t.true(logs.matching('tunnel down').length >= 1);
  t.is(server.registry.list()[0].agentID, 'node-1');
  // The new tunnel works.
  const again = await httpConnect(env.udsPath, echo.address);
  t.is(again.status, 200);
  t.is(await echoRoundTrip(again.socket, 'back'), 'back');
  await closeSocket(again.socket);
  for (const r of replies) r.socket.destroy();
  await waitFor(() => serverIdle(server) && agentIdle(agent), 'tables empty');
});
