/**
 * --proxy-strategies with upstream's own agents (#14): upstream proxy-agents
 * announcing --agent-identifiers under a `kanal server --proxy-strategies
 * destHost,default`. Skips with the reason when ../shared/upstream is absent.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { connectThrough, echoRoundTrip, makeWorkspace, startEchoBackend, startServer, waitUntil, type KanalServerProcess } from './helpers/kanal-processes.js';
import { startUpstreamAgent, upstreamUnavailableReason } from './helpers/upstream.js';

const unavailable = upstreamUnavailableReason();
const maybe = unavailable ? test.skip : test.serial;
if (unavailable) test('upstream routing interop skipped', (t) => t.log(unavailable));

/** Agents and strategies the server logged for dials to `address`, in order. */
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

maybe('upstream agents with --agent-identifiers under a Kanal server with --proxy-strategies destHost,default', async (t) => {
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect', '--proxy-strategies', 'destHost,default', '--log-level', 'debug'] });
  const byAddress = await startUpstreamAgent(t, ws, server, { agentID: 'up-ipv4', extraArgs: ['--agent-identifiers=ipv4=127.0.0.1'] });
  await startUpstreamAgent(t, ws, server, { agentID: 'up-host', extraArgs: ['--agent-identifiers=host=localhost'] });
  await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'up-host', 10_000, 'up-host connected');
  await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'up-ipv4', 10_000, 'up-ipv4 connected');

  await dialTimes(server, echo.address, 5);
  t.deepEqual(carriedBy(server, echo.address), Array<string>(5).fill('up-ipv4 by destHost'));
  const byName = `localhost:${echo.port}`;
  await dialTimes(server, byName, 5);
  t.deepEqual(carriedBy(server, byName), Array<string>(5).fill('up-host by destHost'));

  // The agent that announced the address leaves: its destination falls to `default`.
  await byAddress.stop('SIGKILL');
  await waitUntil(() => server.logLines().some((l) => l.msg === 'agent disconnected' && l.agentID === 'up-ipv4'), 'up-ipv4 gone', 15_000);
  await dialTimes(server, echo.address, 2);
  t.deepEqual(carriedBy(server, echo.address).slice(5), ['up-host by default', 'up-host by default']);
});
