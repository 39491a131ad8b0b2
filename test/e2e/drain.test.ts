/**
 * DRAIN means "prefer other agents", never "refuse" (docs/operations.md), through
 * real processes: a draining agent keeps serving every dial it receives until
 * it exits. Against a Kanal server and upstream's proxy-server v0.36.0 (which
 * skips draining agents but falls back to them when no other is left), with
 * two agents (one draining) and with the draining agent the last one; and
 * upstream's proxy-agent draining (its first SIGTERM) under a Kanal server.
 * The upstream cases skip with the reason when the binaries are absent.
 */
import test, { type ExecutionContext } from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import { randomBytes } from 'node:crypto';
import type net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  connectUnix,
  echoRoundTrip,
  httpConnect,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  waitMetrics,
  type Backend,
  type KanalAgentProcess,
} from '../helpers/kanal-processes.js';
import { startUpstreamAgent, startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';

const DIALS = 8;
const unavailable = upstreamUnavailableReason();
const withUpstream = unavailable ? test.skip : test;
if (unavailable) skippedBecause('upstream DRAIN interop', unavailable);

/** CONNECTs through a frontend Unix socket to the echo backend and checks the bytes come back. */
async function dialAll(t: ExecutionContext, uds: string, backend: Backend, n: number): Promise<void> {
  const sockets = await Promise.all(Array.from({ length: n }, async () => httpConnect(await connectUnix(uds), backend.address)));
  t.teardown(() => sockets.forEach((s) => s.destroy()));
  for (const s of sockets) t.true(await echoRoundTrip(s, randomBytes(4096)));
  sockets.forEach((s) => s.destroy());
}

/** Control plane -> node dials this Kanal agent performed successfully. */
async function dialsServed(agent: KanalAgentProcess): Promise<number> {
  return (await scrapeMetrics(agent.healthPort)).get('kanal_dials_total{direction="cp_to_node",result="ok"}') ?? 0;
}

/** A connection through `uds` held open (so a draining agent that carries it stays until it closes). */
async function holdOne(t: ExecutionContext, uds: string, backend: Backend): Promise<net.Socket> {
  const s = await httpConnect(await connectUnix(uds), backend.address);
  t.teardown(() => s.destroy());
  t.true(await echoRoundTrip(s, Buffer.from('held')));
  return s;
}

/**
 * Agent `draining` (serving one held connection, so it stays) has sent DRAIN;
 * `fresh` has not. Dials go to `fresh`; once `fresh` is gone they go to
 * `draining`, and all succeed.
 */
async function drainScenario(
  t: ExecutionContext,
  opts: {
    uds: string;
    backend: Backend;
    draining: KanalAgentProcess;
    fresh: KanalAgentProcess;
    drainSeen: () => Promise<unknown>;
    freshGone: () => Promise<unknown>;
  },
): Promise<void> {
  const { uds, backend, draining, fresh } = opts;
  const before = await dialsServed(draining);
  draining.signal('SIGTERM');
  await opts.drainSeen();

  await dialAll(t, uds, backend, DIALS);
  t.is(await dialsServed(draining), before, 'the server preferred the agent that is not draining');
  t.is(await dialsServed(fresh), DIALS);

  t.is(await fresh.stop('SIGTERM'), 0);
  await opts.freshGone();
  await dialAll(t, uds, backend, DIALS);
  t.is(await dialsServed(draining), before + DIALS, 'the last agent, draining, served every dial');
  t.true(draining.running(), 'still serving its held connection');
}

test('Kanal server: a draining agent is avoided while another is there, and serves every dial once it is the last', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect'] });
  const grace = ['--shutdown-grace-period', '60s'];
  const draining = await startAgent(t, ws, server, { agentID: 'draining', extraArgs: grace });
  const held = await holdOne(t, server.uds, backend);
  const fresh = await startAgent(t, ws, server, { agentID: 'fresh' });
  await waitMetrics(server.healthPort, { kanal_server_agents: 2 }, 10_000);
  await drainScenario(t, {
    uds: server.uds,
    backend,
    draining,
    fresh,
    drainSeen: () => server.waitForLog((l) => l.msg === 'peer requested drain' && l.agentID === 'draining', 10_000, 'DRAIN from the agent'),
    freshGone: () => waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000),
  });
  held.destroy();
  t.is((await draining.exited).code, 0, 'exits once its connections are done');
});

/** Upstream's count of the agents it routes new dials to (draining ones left out). */
async function waitUpstreamRoutable(healthPort: number, n: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const m = await scrapeMetrics(healthPort).catch(() => new Map<string, number>());
    const ready = m.get('konnectivity_network_proxy_server_ready_backend_connections');
    if (ready === n) return;
    if (Date.now() >= deadline) throw new Error(`upstream server: ${ready} routable agents, want ${n}`);
    await sleep(100);
  }
}

withUpstream('upstream proxy-server v0.36.0: skips a draining Kanal agent, falls back to it when it is the last', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startUpstreamServer(t, ws, { mode: 'http-connect', verbosity: 4 });
  const grace = ['--shutdown-grace-period', '60s'];
  const draining = await startAgent(t, ws, server, { agentID: 'draining', extraArgs: grace });
  const held = await holdOne(t, server.uds, backend);
  const fresh = await startAgent(t, ws, server, { agentID: 'fresh' });
  await waitUpstreamRoutable(server.healthPort, 2);
  await drainScenario(t, {
    uds: server.uds,
    backend,
    draining,
    fresh,
    drainSeen: () => server.waitForLog(/marked backend as draining.*agentID="draining"/, 10_000, 'DRAIN from the agent'),
    freshGone: () => server.waitForLog(/"Close backend of agent" agentID="fresh"/, 10_000, 'the other agent gone'),
  });
  held.destroy();
  t.is((await draining.exited).code, 0);
});

withUpstream(
  "upstream proxy-agent's DRAIN (first SIGTERM) under a Kanal server: served while it is the last agent, avoided once another is there",
  async (t) => {
    const ws = await makeWorkspace(t);
    const backend = await startEchoBackend(t);
    const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect'] });
    const upstream = await startUpstreamAgent(t, ws, server, { agentID: 'upstream-draining' });
    await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);

    upstream.signal('SIGTERM');
    // v0.36.0's agent sends DRAIN from its receive loop, so only once a packet
    // arrives after it handled the signal (later upstream versions send it at
    // once): dials, which it serves as the last agent, bring it out.
    const accepted = backend.accepted();
    const drained = (): boolean => server.logLines().some((l) => l.msg === 'peer requested drain' && l.agentID === 'upstream-draining');
    let dials = 0;
    for (; dials < 20 && !drained(); dials++) {
      await dialAll(t, server.uds, backend, 1);
      await sleep(200);
    }
    await server.waitForLog(
      (l) => l.msg === 'peer requested drain' && l.agentID === 'upstream-draining',
      10_000,
      'DRAIN from the upstream agent',
    );
    await dialAll(t, server.uds, backend, DIALS);
    t.is(backend.accepted() - accepted, dials + DIALS, 'the draining upstream agent, the last one, served every dial');

    const fresh = await startAgent(t, ws, server, { agentID: 'fresh' });
    await waitMetrics(server.healthPort, { kanal_server_agents: 2 }, 10_000);
    await dialAll(t, server.uds, backend, DIALS);
    t.is(await dialsServed(fresh), DIALS, 'every dial went to the agent that is not draining');
    t.true(upstream.running(), 'upstream agent still up (it exits on its second SIGTERM)');
  },
);
