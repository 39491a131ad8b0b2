/**
 * KanalServer's life (ServerState in src/server/server.ts): a server starts
 * once; stop() is safe before start, during start and twice; a failed start
 * leaves it stopped; its gauges are registered once, whatever happens.
 */
import net from 'node:net';
import fs from 'node:fs';
import path from 'node:path';
import test, { type ExecutionContext } from 'ava';
import type { KanalServer } from '../../src/server/server.js';
import { newServerFromFlags } from '../../kit/launch/in-process.js';
import { captureLogger, httpGet, makeEnv, oneClusterFlags, type CapturedLogger, type TestEnv } from '../helpers/in-process.js';

interface Unstarted {
  server: KanalServer;
  logs: CapturedLogger;
  udsPath: string;
}

/** A KanalServer built from flags as `kanal server` builds it, not started; stopped at teardown. */
async function newServer(t: ExecutionContext, env: TestEnv, name: string): Promise<Unstarted> {
  const logs = captureLogger('debug');
  const udsPath = path.join(env.dir, `${name}.sock`);
  const flags = ['--server-id', name, ...oneClusterFlags(env.pki, udsPath), '--health-port', '0'];
  const { server, close } = await newServerFromFlags(flags, { log: logs.log, ephemeralHealthHost: '127.0.0.1' });
  t.teardown(close);
  return { server, logs, udsPath };
}

/** Whether a TCP connect to 127.0.0.1:port is accepted. */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

/** How many times `name` is declared in the metrics exposition. */
async function declared(server: KanalServer, name: string): Promise<number> {
  const text = await server.metrics.registry.metrics();
  return text.split('\n').filter((l) => l.startsWith(`# TYPE ${name} `)).length;
}

test('a second start() is refused with a clear error and leaves the running server serving', async (t) => {
  const env = await makeEnv(t);
  const { server } = await newServer(t, env, 'twice');
  t.is(server.state, 'created');
  t.is(await declared(server, 'kanal_server_agents'), 1, 'gauges registered at construction');
  await server.start();
  t.is(server.state, 'listening');
  const err = await t.throwsAsync(server.start());
  t.is(err?.message, 'the server cannot start when listening: a KanalServer starts once (create a new one)');
  t.is(server.state, 'listening');
  t.true(await accepts(server.agentPort));
  t.is((await httpGet(server.healthPort, '/healthz')).status, 200);
  t.is(await declared(server, 'kanal_server_agents'), 1);
  t.is(await declared(server, 'kanal_server_node_to_cp_connections'), 1);
});

test('stop() before start() stops a server that never bound anything; start() is then refused', async (t) => {
  const env = await makeEnv(t);
  const { server, logs, udsPath } = await newServer(t, env, 'never');
  await server.stop();
  t.is(server.state, 'stopped');
  t.is(server.agentPort, 0);
  t.false(fs.existsSync(udsPath));
  const err = await t.throwsAsync(server.start());
  t.is(err?.message, 'the server cannot start when stopped: a KanalServer starts once (create a new one)');
  await server.stop();
  t.is(logs.matching('kanal server started').length, 0);
});

test('two stop() calls at once both wait for one shutdown; the ports and the socket file are released', async (t) => {
  const env = await makeEnv(t);
  const { server, logs, udsPath } = await newServer(t, env, 'stop-twice');
  await server.start();
  const port = server.agentPort;
  t.true(fs.existsSync(udsPath));
  const first = server.stop();
  t.is(server.state, 'stopping');
  const second = server.stop();
  await Promise.all([first, second]);
  t.is(server.state, 'stopped');
  t.is(logs.matching('kanal server stopped').length, 1);
  t.false(await accepts(port));
  t.false(fs.existsSync(udsPath));
  await server.stop();
  t.is(logs.matching('kanal server stopped').length, 1, 'a stop after the end does nothing');
});

test('stop() during start() waits for it, then stops what it started', async (t) => {
  const env = await makeEnv(t);
  const { server, logs, udsPath } = await newServer(t, env, 'racing');
  const starting = server.start();
  t.is(server.state, 'starting');
  const stopping = server.stop();
  await starting;
  await stopping;
  t.is(server.state, 'stopped');
  t.true(server.agentPort > 0, 'the start got as far as binding');
  t.false(await accepts(server.agentPort));
  t.false(fs.existsSync(udsPath));
  t.deepEqual(
    logs.lines.map((l) => l.msg).filter((m) => m === 'kanal server started' || m === 'kanal server stopped'),
    ['kanal server started', 'kanal server stopped'],
  );
});

test('a start() that fails leaves the server stopped: a retry is refused, stop() is a no-op', async (t) => {
  const env = await makeEnv(t);
  const { server, logs, udsPath } = await newServer(t, env, 'failing');
  // The socket file's directory does not exist: the frontend cannot listen.
  fs.rmSync(env.dir, { recursive: true, force: true });
  const err = await t.throwsAsync(server.start());
  t.regex(err?.message ?? '', /failing.sock/, 'the error names the socket');
  t.is(server.state, 'stopped');
  t.false(fs.existsSync(udsPath));
  await t.throwsAsync(server.start(), { message: /cannot start when stopped/ });
  await server.stop();
  t.is(logs.matching('kanal server stopped').length, 0);
});
