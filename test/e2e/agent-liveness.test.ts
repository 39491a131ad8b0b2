/**
 * The server checks each agent tunnel with HTTP/2 PINGs (docs/trust-model.md): a
 * tunnel cut silently (a relay that stops forwarding: no FIN, no RST) or an
 * agent frozen with SIGSTOP goes quiet (dials avoid it) and is closed at the
 * keepalive timeout; a newer tunnel of the same agent wins over a quiet older
 * one at once; no dial goes to a tunnel known dead. Upstream's grpc-go agent
 * answers the server's PINGs and is never closed for them. Detection times
 * are logged (t.log), not asserted beyond the bounds of their waits.
 */
import test, { type ExecutionContext } from 'ava';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoesThrough,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startProxy,
  startServer,
  waitMetrics,
  waitStatus,
  warnLine,
  type Backend,
  type KanalServerProcess,
  type LogLine,
} from '../helpers/kanal-processes.js';
import { connectStatus, startStallingRelay } from '../helpers/raw-agent.js';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';

/** Short PING timing so the tests run in seconds (the defaults are 10 s / 20 s). */
const FAST_KEEPALIVE = ['--keepalive-time', '1s', '--keepalive-timeout', '4s'];

const quietLine =
  (agentID: string) =>
  (l: LogLine): boolean =>
    l.msg.startsWith('agent tunnel quiet') && l.agentID === agentID;
const deadLine = (l: LogLine): boolean => l.msg === 'closing agent connection: it stopped answering PINGs';

/** `n` CONNECTs to `address`, one after another; their HTTP statuses. */
async function statuses(server: KanalServerProcess, address: string, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) out.push(await connectStatus(server, address));
  return out;
}

/**
 * Silences agent `agentID` (`silence`: cut its path, freeze it) with FAST_KEEPALIVE:
 * its tunnel goes quiet, dials meanwhile go elsewhere, then the server closes it.
 */
async function quietThenClosed(
  t: ExecutionContext,
  o: { server: KanalServerProcess; backend: Backend; agentID: string; silence: () => void; what: string; label: string },
): Promise<void> {
  o.silence();
  const silencedAt = Date.now();
  await o.server.waitForLog(quietLine(o.agentID), 10_000, `${o.what} goes quiet`);
  const quietMs = Date.now() - silencedAt;
  t.deepEqual(await statuses(o.server, o.backend.address, 10), Array(10).fill(200));
  await o.server.waitForLog(deadLine, 15_000, `${o.what} is closed`);
  t.log(`${o.label}: quiet after ${quietMs} ms, closed after ${Date.now() - silencedAt} ms (keepalive 1s/4s)`);
}

test('silent cut between agent and server: the tunnel goes quiet, then is closed; no dial goes to it', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: [...FAST_KEEPALIVE, '--backend-dial-timeout', '3s'] });
  const relay = await startStallingRelay(t, { host: '127.0.0.1', port: server.agentPort });
  // The agent's own PINGs (5-7 s) would reconnect it around the server's close; this measures the server's check.
  await startAgent(t, ws, { agentPort: relay.port }, { agentID: 'cut-off', extraArgs: ['--keepalive-time', '1h'] });
  await startAgent(t, ws, server, { agentID: 'healthy' });
  await waitMetrics(server.healthPort, { kanal_server_agents: 2 }, 10_000);
  await quietThenClosed(t, {
    server,
    backend,
    agentID: 'cut-off',
    silence: () => relay.stall(),
    what: 'the cut tunnel',
    label: 'silent cut',
  });
  const m = await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 5000);
  t.is(m.get('kanal_dead_tunnels_total{reason="keepalive_timeout"}'), 1);
  // With resume (the default) the lost tunnel's connections wait for the agent: the same line's fields, another message.
  const disconnected = await server.waitForLog(
    (l) => (l.msg === 'agent disconnected' || l.msg.startsWith('agent tunnel lost')) && l.agentID === 'cut-off',
    5000,
    'disconnect logged',
  );
  t.regex(String(disconnected.reason), /no answer to an HTTP\/2 PING within 4000 ms/);
  t.regex(String(disconnected.credential), /^CN=cut-off /);
});

test('an agent frozen with SIGSTOP is avoided once quiet and closed at the timeout; after SIGCONT it comes back', async (t) => {
  const backend = await startEchoBackend(t);
  const { server, agent: frozen } = await startProxy(t, {
    server: { extraArgs: [...FAST_KEEPALIVE, '--backend-dial-timeout', '3s'] },
    agents: [{ agentID: 'frozen' }, { agentID: 'healthy' }],
    ready: 'every-agent',
  });
  await quietThenClosed(t, {
    server,
    backend,
    agentID: 'frozen',
    silence: () => frozen.pause(),
    what: 'the frozen agent',
    label: 'SIGSTOP',
  });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 5000);
  frozen.resume();
  await waitMetrics(server.healthPort, { kanal_server_agents: 2 }, 20_000);
  await waitStatus(frozen.readyzUrl(), 200, 10_000);
});

test('a reconnect while the old tunnel is silently dead: dials go to the new tunnel at once (default timing)', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--backend-dial-timeout', '3s'] });
  const relay = await startStallingRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const old = await startAgent(t, ws, { agentPort: relay.port }, { agentID: 'node-1' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  relay.stall();
  // The same node's agent comes back on a path that works (same credential, same agentID).
  await old.kill();
  const again = await startAgent(t, ws, server, { agentID: 'node-1' });
  const arrived = Date.now();
  const codes = await statuses(server, backend.address, 8);
  t.log(`first dial answered ${Date.now() - arrived} ms after the new tunnel was up; the old one was probed on its arrival`);
  t.deepEqual(codes, Array(8).fill(200), 'no dial went to the dead tunnel');
  await server.waitForLog(quietLine('node-1'), 5000, 'the old tunnel is quiet');
  t.true(await echoesThrough(server, backend.address, randomBytes(64 * 1024)));
  t.true(again.running());
});

test('an agent that restarted with a new agentID replaces its own silently dead tunnel under a bound of one', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const relay = await startStallingRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const old = await startAgent(t, ws, { agentPort: relay.port }, { agentID: 'uuid-1', cert: 'shared' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  relay.stall();
  await old.kill();
  await startAgent(t, ws, server, { agentID: 'uuid-2', cert: 'shared' });
  // Logged before the new tunnel was accepted (which startAgent waited for); the bound only allows for a loaded machine's log writes.
  const replaced = await server.waitForLog(warnLine('replaced a stale tunnel of the same credential'), 15_000, 'replacement logged');
  t.is(replaced.agentID, 'uuid-2');
  t.is(replaced.replacedAgentID, 'uuid-1');
  const m = await waitMetrics(server.healthPort, { kanal_server_agents: 1, 'kanal_dead_tunnels_total{reason="replaced"}': 1 }, 5000);
  t.is(m.get('kanal_refusals_total{reason="agent_credential_full"}'), undefined);
});

test('the grpc-js transport closes a frozen agent at the keepalive timeout too', async (t) => {
  const { server, agent: frozen } = await startProxy(t, {
    server: { extraArgs: [...FAST_KEEPALIVE, '--transport', 'grpc-js'] },
    agents: [{ agentID: 'frozen' }],
    ready: 'every-agent',
  });
  frozen.pause();
  const stoppedAt = Date.now();
  const m = await waitMetrics(server.healthPort, { kanal_server_agents: 0 }, 15_000);
  t.log(`grpc-js transport: frozen agent closed after ${Date.now() - stoppedAt} ms (keepalive 1s/4s)`);
  t.is(m.get('kanal_server_agent_identities'), 0);
  frozen.resume();
});

const upstreamMissing = upstreamUnavailableReason();
(upstreamMissing ? test.skip : test)(
  "upstream's grpc-go agent answers 1 s PINGs for as long as it runs; frozen, it is closed",
  async (t) => {
    const ws = await makeWorkspace(t);
    const backend = await startEchoBackend(t);
    const server = await startServer(t, ws, { extraArgs: [...FAST_KEEPALIVE, '--mode', 'http-connect'] });
    const agent = await startUpstreamAgent(t, ws, server, { agentID: 'upstream-node' });
    await waitStatus(server.readyzUrl(), 200, 10_000);
    await sleep(8000);
    t.deepEqual(
      server.logLines().filter((l) => quietLine('upstream-node')(l) || deadLine(l)),
      [],
    );
    t.is((await scrapeMetrics(server.healthPort)).get('kanal_server_agents'), 1);
    t.notRegex(agent.log(), /too_many_pings|ENHANCE_YOUR_CALM/);
    t.true(await echoesThrough(server, backend.address, randomBytes(16 * 1024)));
    agent.signal('SIGSTOP');
    const stoppedAt = Date.now();
    await server.waitForLog(deadLine, 15_000, 'the frozen upstream agent is closed');
    t.log(`upstream agent frozen: closed after ${Date.now() - stoppedAt} ms`);
    agent.signal('SIGCONT');
  },
);
