/**
 * --proxy-strategies with `kanal server` and `kanal agent` processes (#14):
 * a destination's agent that stops answering PINGs yields to the next
 * strategy rather than receiving dials it cannot answer.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { connectThrough, echoRoundTrip, makeWorkspace, startAgent, startEchoBackend, startServer, waitMetrics, type KanalServerProcess } from './helpers/kanal-processes.js';

function carriedBy(server: KanalServerProcess, address: string): string[] {
  return server.logLines().filter((l) => l.msg === 'dial established' && l.address === address).map((l) => `${String(l.agentID)} by ${String(l.strategy)}`);
}

async function dialTimes(server: KanalServerProcess, address: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    const s = await connectThrough(server, address);
    try {
      if (!(await echoRoundTrip(s, randomBytes(1024)))) throw new Error(`echo through ${address} failed`);
    } finally {
      s.destroy();
    }
  }
}

test('a quiet destHost agent yields to the next strategy; once it answers again it gets its destination back', async (t) => {
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    extraArgs: ['--keepalive-time', '1s', '--keepalive-timeout', '30s', '--proxy-strategies', 'destHost,default', '--log-level', 'debug'],
  });
  const owner = await startAgent(t, ws, server, { agentID: 'owner', extraArgs: ['--agent-identifiers', 'ipv4=127.0.0.1'] });
  await startAgent(t, ws, server, { agentID: 'other' });
  await waitMetrics(server.healthPort, { kanal_server_agents: 2 }, 10_000);
  await dialTimes(server, echo.address, 3);
  t.deepEqual(carriedBy(server, echo.address), Array<string>(3).fill('owner by destHost'));

  owner.pause();
  await server.waitForLog((l) => l.msg.startsWith('agent tunnel quiet') && l.agentID === 'owner', 10_000, 'owner quiet');
  await dialTimes(server, echo.address, 3);
  t.deepEqual(carriedBy(server, echo.address).slice(3), Array<string>(3).fill('other by default'));

  owner.resume();
  await server.waitForLog((l) => l.msg === 'agent tunnel answers PINGs again' && l.agentID === 'owner', 10_000, 'owner alive');
  await dialTimes(server, echo.address, 2);
  t.deepEqual(carriedBy(server, echo.address).slice(6), ['owner by destHost', 'owner by destHost']);
});
