/**
 * --proxy-strategies with `kanal server` processes (docs/routing.md): upstream's own
 * proxy-agents announcing --agent-identifiers (skipped with the reason when
 * ../shared/upstream is absent), and a destination's Kanal agent that stops
 * answering PINGs yielding to the next strategy.
 */
import test from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import { randomBytes } from 'node:crypto';
import {
  echoesThrough,
  makeWorkspace,
  startEchoBackend,
  startProxy,
  startServer,
  waitUntil,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';

const unavailable = upstreamUnavailableReason();
const withUpstream = unavailable ? test.skip : test;
if (unavailable) skippedBecause('upstream routing interop', unavailable);

function loggedCarriers(server: KanalServerProcess, address: string): string[] {
  return server
    .logLines()
    .filter((l) => l.msg === 'dial established' && l.address === address)
    .map((l) => `${String(l.agentID)} by ${String(l.strategy)}`);
}

/** The first `n` carriers logged for `address`, waiting for the server's log to catch up (it is written asynchronously). */
async function carriedBy(server: KanalServerProcess, address: string, n: number): Promise<string[]> {
  await waitUntil(() => loggedCarriers(server, address).length >= n, `${n} dials to ${address} logged`, 10_000);
  return loggedCarriers(server, address).slice(0, n);
}

async function dialTimes(server: KanalServerProcess, address: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    if (!(await echoesThrough(server, address, randomBytes(1024)))) throw new Error(`echo through ${address} failed`);
  }
}

test('a quiet destHost agent yields to the next strategy; once it answers again it gets its destination back', async (t) => {
  const echo = await startEchoBackend(t);
  const { server, agent: owner } = await startProxy(t, {
    server: {
      extraArgs: ['--keepalive-time', '1s', '--keepalive-timeout', '30s', '--proxy-strategies', 'destHost,default', '--log-level', 'debug'],
    },
    agents: [{ agentID: 'owner', extraArgs: ['--agent-identifiers', 'ipv4=127.0.0.1'] }, { agentID: 'other' }],
    ready: 'every-agent',
  });
  await dialTimes(server, echo.address, 3);
  t.deepEqual(await carriedBy(server, echo.address, 3), Array<string>(3).fill('owner by destHost'));

  owner.pause();
  await server.waitForLog((l) => l.msg.startsWith('agent tunnel quiet') && l.agentID === 'owner', 10_000, 'owner quiet');
  await dialTimes(server, echo.address, 3);
  t.deepEqual((await carriedBy(server, echo.address, 6)).slice(3), Array<string>(3).fill('other by default'));

  owner.resume();
  await server.waitForLog((l) => l.msg === 'agent tunnel answers PINGs again' && l.agentID === 'owner', 10_000, 'owner alive');
  await dialTimes(server, echo.address, 2);
  t.deepEqual((await carriedBy(server, echo.address, 8)).slice(6), ['owner by destHost', 'owner by destHost']);
});

withUpstream('upstream agents with --agent-identifiers under a Kanal server with --proxy-strategies destHost,default', async (t) => {
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    extraArgs: ['--mode', 'http-connect', '--proxy-strategies', 'destHost,default', '--log-level', 'debug'],
  });
  const byAddress = await startUpstreamAgent(t, ws, server, { agentID: 'up-ipv4', extraArgs: ['--agent-identifiers=ipv4=127.0.0.1'] });
  await startUpstreamAgent(t, ws, server, { agentID: 'up-host', extraArgs: ['--agent-identifiers=host=localhost'] });
  await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'up-host', 10_000, 'up-host connected');
  await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'up-ipv4', 10_000, 'up-ipv4 connected');

  await dialTimes(server, echo.address, 5);
  t.deepEqual(await carriedBy(server, echo.address, 5), Array<string>(5).fill('up-ipv4 by destHost'));
  const byName = `localhost:${echo.port}`;
  await dialTimes(server, byName, 5);
  t.deepEqual(await carriedBy(server, byName, 5), Array<string>(5).fill('up-host by destHost'));

  // The agent that announced the address leaves: its destination falls to `default`.
  await byAddress.stop('SIGKILL');
  await server.waitForLog((l) => l.msg === 'agent disconnected' && l.agentID === 'up-ipv4', 15_000, 'up-ipv4 gone');
  await dialTimes(server, echo.address, 2);
  t.deepEqual((await carriedBy(server, echo.address, 7)).slice(5), ['up-host by default', 'up-host by default']);
});
