/**
 * ServerTunnels's life (created -> running -> draining -> stopped, src/agent/server-tunnels.ts):
 * it only moves forward, so a stop() that lands while start() is still opening
 * the health port leaves nothing running, and a stopped agent cannot start again;
 * a second start() is refused, and each move is traced at debug level.
 */
import fs from 'node:fs';
import net from 'node:net';
import test from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { ServerTunnels, type ServerTunnelsOptions } from '../../src/agent/server-tunnels.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { freePort } from '../../kit/launch/kanal-cli.js';
import { captureLogger, makeEnv, startServer, type CapturedLogger } from '../helpers/in-process.js';

/** Whether something accepts TCP connections on 127.0.0.1:port. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, '127.0.0.1');
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

test('stop() during start() leaves nothing running: no tunnel comes up, the health port closes, and it cannot start again', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env);
  const own = await issueAgentCertificate(env.pki, 'node-1');
  const agent = new ServerTunnels({
    agentID: 'node-1',
    agentIdentifiers: '',
    server: {
      hosts: [{ host: '127.0.0.1', port: server.agentPort }],
      tls: { ca: fs.readFileSync(env.pki.caCert), cert: fs.readFileSync(own.cert), key: fs.readFileSync(own.key) },
    },
    dialTimeoutMs: 5000,
    connectTimeoutMs: 5000,
    reconnect: { initialMs: 100, maxMs: 500 },
    health: { host: '127.0.0.1', port: 0 },
    transport: h2Transport,
    log: captureLogger('debug').log,
  });
  t.teardown(() => agent.stop(0));
  const starting = agent.start();
  await agent.stop(0);
  await starting;
  // A running agent connects within milliseconds here; give it ample time to show it is not running.
  await sleep(1500);
  t.is(agent.tunnels().length, 0, 'no tunnel opened after stop()');
  t.is(server.registry.size, 0, 'the server never saw the agent');
  t.false(await listening(agent.healthPort), 'the health port is closed');
  await t.throwsAsync(agent.start(), { message: 'the agent cannot start when stopped' });
});

/** Tunnels to an address that refuses: a lifecycle needs no server. */
async function refusedTunnels(logs: CapturedLogger): Promise<ServerTunnelsOptions> {
  return {
    agentID: 'node-1',
    agentIdentifiers: '',
    server: { hosts: [{ host: '127.0.0.1', port: await freePort() }], tls: { ca: Buffer.alloc(0) } },
    dialTimeoutMs: 5000,
    connectTimeoutMs: 5000,
    reconnect: { initialMs: 100, maxMs: 500 },
    transport: h2Transport,
    log: logs.log,
  };
}

const moves = (logs: CapturedLogger): string[] => logs.matching('agent tunnels state').map((l) => `${String(l.from)}->${String(l.to)}`);

test('a second start() is refused while running; stop() moves through draining to stopped, and each move is traced', async (t) => {
  const logs = captureLogger('debug');
  const agent = new ServerTunnels(await refusedTunnels(logs));
  t.teardown(() => agent.stop(0));
  await agent.start();
  await t.throwsAsync(agent.start(), { message: 'the agent cannot start when running' });
  t.is(agent.snapshot().state, 'running');
  const stopping = agent.stop(0);
  t.is(agent.snapshot().state, 'draining');
  // A stop while draining has nothing more to do.
  await agent.stop(0);
  await stopping;
  t.is(agent.snapshot().state, 'stopped');
  t.deepEqual(moves(logs), ['created->running', 'running->draining', 'draining->stopped']);
  t.is(logs.matching('kanal agent started').length, 1, 'started once');
});

test('stop() before start(): stopped, and start() is refused after', async (t) => {
  const logs = captureLogger('debug');
  const agent = new ServerTunnels(await refusedTunnels(logs));
  await agent.stop(0);
  t.is(agent.snapshot().state, 'stopped');
  await t.throwsAsync(agent.start(), { message: 'the agent cannot start when stopped' });
  t.deepEqual(moves(logs), ['created->stopped']);
  t.is(logs.matching('kanal agent started').length, 0);
});
