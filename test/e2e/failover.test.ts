/**
 * Processes dying and coming back, through the real CLI: an agent killed
 * mid-transfer (resume off) releases every connection it carried and leaves
 * the server's tables empty; a server killed mid-transfer has the agent
 * release what it carried as soon as its port refuses; a restarted server
 * gets its agent back and traffic resumes.
 */
import test, { type ExecutionContext } from 'ava';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { PacketType } from '../../src/wire/packet.js';
import { ConnectRefused } from '../../kit/demo/proxy-client.js';
import {
  connectThrough,
  echoesThrough,
  echoRoundTrip,
  frontendProxyStream,
  httpGet,
  logTail,
  receiveAtLeast,
  restartServer,
  startAgent,
  startEchoBackend,
  startFirehoseBackend,
  startProxy,
  tunnelThrough,
  waitClosed,
  waitMetrics,
  waitStatus,
  waitUntil,
  type Backend,
  type KanalAgentProcess,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';

/** A server and agent, a backend, and one CONNECT through them to it. */
async function pairWithConnection(t: ExecutionContext, startBackend: (t: ExecutionContext) => Promise<Backend>) {
  const { server, agent } = await startProxy(t);
  const backend = await startBackend(t);
  const socket = await tunnelThrough(t, server, backend.address);
  return { server, agent, backend, socket };
}

/** Starts the stopped `server` again and waits until the agent's tunnel to it is up. */
async function restartAndReconnect(t: ExecutionContext, server: KanalServerProcess, agent: KanalAgentProcess): Promise<KanalServerProcess> {
  const restarted = await restartServer(t, server);
  // Reconnect back-off is 200 ms doubling to a 1 s cap: well within this bound.
  await waitStatus(agent.readyzUrl(), 200, 15_000);
  await waitStatus(restarted.readyzUrl(), 200, 10_000);
  return restarted;
}

test('agent SIGKILLed mid-transfer, resume off: client connections close promptly and the server tables empty', async (t) => {
  // With resume (the default) the server cannot tell a killed agent from a cut path: the connections wait for it (test/e2e/resume.test.ts).
  const { ws, server, agent } = await startProxy(t, { server: { extraArgs: ['--resume-timeout', '0'] }, agents: [{ agentID: 'doomed' }] });
  const firehose = await startFirehoseBackend(t);

  // One CONNECT and one gRPC connection, both streaming node -> control plane.
  const s = await tunnelThrough(t, server, firehose.address);
  const flowing = receiveAtLeast(s, 2 * 1024 * 1024, 15_000);
  const stream = frontendProxyStream(t, server);
  const dial = await stream.dial(firehose.address);
  t.is(dial.error, '');
  await flowing;
  await stream.take(PacketType.DATA, (p) => p.connectID === dial.connectID, 10_000);
  await waitMetrics(server.healthPort, { kanal_server_agents: 1, kanal_server_connections_open: 2 }, 10_000);

  const killedAt = Date.now();
  await agent.kill();
  t.is((await agent.exited).signal, 'SIGKILL');

  // Both clients learn at once (bounded wait), not after some idle timeout.
  await waitClosed(s, 10_000).catch((err: Error) => {
    // Seen once in many runs and never reproduced: keep what the server knew.
    throw new Error(`${err.message}\nserver log tail:\n${logTail(server.logFile, 30)}\nagent log tail:\n${logTail(agent.logFile, 10)}`);
  });
  const closed = await stream.take(PacketType.CLOSE_RSP, (p) => p.connectID === dial.connectID, 10_000);
  t.regex(closed.error, /tunnel closed/);
  t.log(`clients saw the close ${Date.now() - killedAt} ms after SIGKILL`);

  await server.waitForLog((l) => l.msg === 'agent disconnected' && l.agentID === 'doomed', 10_000, 'agent disconnected');
  await waitMetrics(server.healthPort, { kanal_server_agents: 0, kanal_server_connections_open: 0, kanal_server_pending_dials: 0 }, 10_000);
  await waitStatus(server.readyzUrl(), 503, 10_000);
  t.regex((await httpGet(server.readyzUrl())).body, /no agent/);
  const refusal = await t.throwsAsync(connectThrough(server, firehose.address), { instanceOf: ConnectRefused });
  t.is(refusal?.status, 500);
  // The gRPC stream itself survives its connection; a new dial there fails cleanly too.
  const again = await stream.dial(firehose.address);
  t.regex(again.error, /no agent/);
  stream.close();

  // The server still works once an agent comes back.
  await startAgent(t, ws, server, { agentID: 'doomed-2' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  const echo = await startEchoBackend(t);
  t.true(await echoesThrough(server, echo.address, randomBytes(10_000)));
});

test('server SIGKILLed mid-transfer: the agent closes what it carried at once and reconnects to the restarted server', async (t) => {
  const { server, agent, backend: firehose, socket: s } = await pairWithConnection(t, startFirehoseBackend);
  // The agent is mid-send (firehose -> agent -> server) when the server dies.
  await receiveAtLeast(s, 2 * 1024 * 1024, 15_000);
  t.is(firehose.open(), 1);

  const killedAt = Date.now();
  await server.kill();
  // Bounded: not after some keepalive timeout (60 s + 20 s by default).
  for (let i = 0; i < 200 && firehose.open() > 0; i++) await sleep(50);
  t.is(firehose.open(), 0, `the backend connection the agent carried is still open ${Date.now() - killedAt} ms after SIGKILL`);
  t.log(`agent closed the backend connection ${Date.now() - killedAt} ms after SIGKILL`);
  await agent.waitForLog((l) => l.msg === 'tunnel down', 10_000, 'tunnel down');
  await waitStatus(agent.readyzUrl(), 503, 10_000);

  const restarted = await restartAndReconnect(t, server, agent);
  const echo = await startEchoBackend(t);
  t.true(await echoesThrough(restarted, echo.address, randomBytes(10_000)));
});

test('server restarted on the same ports: the agent reconnects and traffic resumes', async (t) => {
  const { server, agent, backend: echo, socket: before } = await pairWithConnection(t, startEchoBackend);
  t.true(await echoRoundTrip(before, Buffer.from('before the restart')));

  t.is(await server.stop('SIGTERM'), 0, 'graceful exit');
  await server.waitForLog((l) => l.msg === 'kanal server stopped', 1000, 'stopped');
  // The tunnelled connection went with the server; the agent notices its tunnel is gone.
  await waitClosed(before, 10_000);
  await waitStatus(agent.readyzUrl(), 503, 10_000);
  await agent.waitForLog((l) => l.msg === 'tunnel down', 10_000, 'tunnel down');

  const restarted = await restartAndReconnect(t, server, agent);
  // Ready can be seen before the agent's line is written: its log lines reach stdout in batches.
  const ups = (): number => agent.logLines().filter((l) => l.msg === 'tunnel up').length;
  await waitUntil(() => ups() >= 2, "the agent's second `tunnel up` line", 5_000).catch(() => undefined);
  t.is(ups(), 2, 'one tunnel before, one after the restart');

  const after = await tunnelThrough(t, restarted, echo.address);
  t.true(await echoRoundTrip(after, randomBytes(100_000)));
  const stream = frontendProxyStream(t, restarted);
  const dial = await stream.dial(echo.address);
  t.is(dial.error, '');
  t.true(await stream.echoes(dial.connectID, randomBytes(2000), 10_000));
  stream.close();
});
