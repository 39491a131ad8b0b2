/**
 * The agent's own check of its tunnels (docs/ha.md, "Liveness"): with its
 * default --keepalive-time 2s and --keepalive-timeout 5s it PINGs each server
 * connection, so a path that drops everything silently (no FIN, no RST) or a
 * server frozen with SIGSTOP is noticed within 7 s: `tunnel down` with the
 * PING as the reason, and a new tunnel once a path works again. The servers
 * keep their slow default check (10 s / 20 s), so what is measured is the
 * agent's. Upstream's server polices PINGs (one per 30 s): the agent PINGs it
 * no more often, and is never sent away for it.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoesThrough,
  makeWorkspace,
  startAgent,
  startEchoBackend,
  startServer,
  waitStatus,
  type KanalAgentProcess,
  type LogLine,
} from '../helpers/kanal-processes.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';
import { startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';

/** The defaults' worst case (a PING just missed, then its timeout: 2 s + 5 s), and room for a loaded machine. */
const NOTICED_WITHIN_MS = 7000 + 3000;
const pingReason = /no answer to an HTTP\/2 PING within 5000 ms/;

const tunnelsUp = (agent: KanalAgentProcess): LogLine[] => agent.logLines().filter((l) => l.msg === 'tunnel up');
/** When a line was logged (Kanal logs ISO times), in ms since the epoch. */
const loggedAt = (l: LogLine): number => Date.parse(String(l.time));

/** A tunnel given up (`tunnel down`) or kept for a resume (`tunnel lost…`, docs/operations.md). */
const lostLine = (l: LogLine): boolean => l.msg === 'tunnel down' || l.msg.startsWith('tunnel lost');
/** A tunnel new, or resumed on a new stream. */
const upLine = (l: LogLine): boolean => l.msg === 'tunnel up' || l.msg === 'tunnel resumed';

/** Waits for the agent's `tunnel down` (or `tunnel lost`, with resume) caused by its PING; how long it took from `since`. */
async function noticed(agent: KanalAgentProcess, since: number): Promise<{ ms: number; line: LogLine }> {
  const line = await agent.waitForLog((l) => lostLine(l) && pingReason.test(String(l.reason)), 15_000, 'tunnel down by PING');
  return { ms: loggedAt(line) - since, line };
}

test('a black-holed path: the agent notices within its keepalive, and has a new tunnel once the path works again', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--allowed-destination', backend.address] });
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  // The agent's defaults for reconnects too, over startAgent's faster test timing.
  const agent = await startAgent(t, ws, { agentPort: relay.port }, { extraArgs: ['--sync-interval', '1s', '--sync-interval-cap', '30s'] });
  t.true(await echoesThrough(server, backend.address, randomBytes(4096)));
  // Idle for a few PINGs: answered, nothing happens.
  await sleep(5000);
  t.is(tunnelsUp(agent).length, 1);
  t.deepEqual(agent.logLines().filter(lostLine), []);

  relay.blackhole();
  const cutAt = Date.now();
  const down = await noticed(agent, cutAt);
  t.log(`black hole noticed after ${down.ms} ms (keepalive 2s / 5s)`);
  t.true(down.ms <= NOTICED_WITHIN_MS, `${down.ms} ms`);
  t.is(down.line.level, 'warn', 'a tunnel lost while running is a warning');
  await waitStatus(agent.readyzUrl(), 503, 5000);

  relay.restore();
  const restoredAt = Date.now();
  await agent.waitForLog((l) => upLine(l) && loggedAt(l) > restoredAt, 15_000, 'a new tunnel after the path works again');
  t.log(`new tunnel ${Date.now() - restoredAt} ms after the path was restored`);
  await waitStatus(agent.readyzUrl(), 200, 5000);
  await waitStatus(server.readyzUrl(), 200, 5000);
  t.true(await echoesThrough(server, backend.address, randomBytes(4096)));
});

test('a server frozen with SIGSTOP: the agent notices within its keepalive and moves to the other server behind the same names', async (t) => {
  const ws = await makeWorkspace(t);
  const frozen = await startServer(t, ws, { name: 'frozen', extraArgs: ['--server-count', '2'] });
  // Registered after the server's own stop: teardowns run newest first, so it is running again before it is stopped.
  t.teardown(() => frozen.resume());
  const other = await startServer(t, ws, { name: 'other', extraArgs: ['--server-count', '2'] });
  const agent = await startAgent(t, ws, frozen, { extraArgs: ['--proxy-server-host', `127.0.0.1:${other.agentPort}`] });
  await waitStatus(agent.readyzUrl(), 200, 5000);
  await agent.waitForLog((l) => l.msg === 'tunnel up' && l.serverID === 'other', 5000, 'a tunnel to the other server');
  await agent.waitForLog((l) => l.msg === 'tunnel up' && l.serverID === 'frozen', 5000, 'a tunnel to the frozen server');

  frozen.pause();
  const stoppedAt = Date.now();
  const down = await noticed(agent, stoppedAt);
  t.log(`frozen server noticed after ${down.ms} ms (keepalive 2s / 5s)`);
  t.true(down.ms <= NOTICED_WITHIN_MS, `${down.ms} ms`);
  t.is(down.line.serverID, 'frozen');
  // Still ready through the other; the frozen one's address is retried (each connect times out meanwhile).
  await waitStatus(agent.readyzUrl(), 200, 1000);

  frozen.resume();
  const resumedAt = Date.now();
  await agent.waitForLog(
    (l) => upLine(l) && l.serverID === 'frozen' && loggedAt(l) > resumedAt,
    20_000,
    'a new tunnel to the server once it runs again',
  );
  t.log(`new tunnel to the thawed server ${Date.now() - resumedAt} ms after SIGCONT`);
});

test('an agent frozen while its PING was unanswered keeps its tunnel: the answer that waited in its socket counts', async (t) => {
  const ws = await makeWorkspace(t);
  // The server's own check (10 s / 20 s by default) lets all this pass.
  const server = await startServer(t, ws);
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const agent = await startAgent(t, ws, { agentPort: relay.port });
  t.teardown(() => agent.resume());
  // A PING goes out within 2 s and waits for its answer; the agent freezes before its 5 s are up.
  relay.blackhole();
  await sleep(2500);
  agent.pause();
  // The answer reaches the frozen agent's socket; its deadline passes while it is frozen.
  relay.restore();
  await sleep(6000);
  agent.resume();
  await sleep(2000);
  t.is(tunnelsUp(agent).length, 1);
  t.deepEqual(agent.logLines().filter(lostLine), []);
  await waitStatus(agent.readyzUrl(), 200, 1000);
});

const upstreamMissing = upstreamUnavailableReason();
(upstreamMissing ? test.skip : test)("upstream's server is PINGed at its policy's pace: no GOAWAY for too many PINGs", async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startUpstreamServer(t, ws);
  const agent = await startAgent(t, ws, server, { agentID: 'kanal-node' });
  // grpc-go sends GOAWAY at the third PING within 30 s of the last without data: at 2 s that is 6 s in.
  await sleep(9000);
  t.is(tunnelsUp(agent).length, 1);
  t.deepEqual(agent.logLines().filter(lostLine), []);
  t.notRegex(agent.log(), /too_many_pings|ENHANCE_YOUR_CALM/);
  t.notRegex(server.log(), /too many pings/i);
});
