/**
 * ServerTunnels's life (created -> running -> draining -> stopped, src/agent/server-tunnels.ts):
 * it only moves forward, so a stop() that lands while start() is still opening
 * the health port leaves nothing running, and a stopped agent cannot start again.
 */
import fs from 'node:fs';
import net from 'node:net';
import test from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { ServerTunnels } from '../../src/agent/server-tunnels.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { captureLogger, makeEnv, startServer } from '../helpers/in-process.js';

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
