/**
 * Node -> control plane (KEP-2025) through the agent as `kanal agent`
 * assembles it (src/agent/agent.ts), in process and on the
 * default transport (h2): node listeners on 127.0.0.2 with
 * --bind-interface-type none, so no root and no namespace is needed.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { KanalAgent } from '../../src/agent/agent.js';
import type { NodeSideOptions } from '../../src/agent/node-side-config.js';
import { agentOptionsFromFlags } from '../../kit/launch/in-process.js';
import { freePort } from '../../kit/launch/kanal-cli.js';
import {
  captureLogger,
  echoRoundTrip,
  makeEnv,
  startAgent,
  startEchoServer,
  startServer,
  waitFor,
  type TestEnv,
} from '../helpers/in-process.js';

const NODE_ADDRESS = '127.0.0.2';

async function nodeSide(destination: string): Promise<NodeSideOptions> {
  const localPort = await freePort(NODE_ADDRESS);
  return {
    bindAddress: NODE_ADDRESS,
    targets: [{ localPort, destination }],
    interfaceName: 'kanal0',
    interfaceType: 'none',
    tunnelWaitMs: 5000,
  };
}

function connectNode(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: NODE_ADDRESS, port, allowHalfOpen: true });
    s.once('connect', () => {
      s.off('error', reject);
      resolve(s);
    });
    s.once('error', reject);
  });
}

/** Resolves with the socket's error code once it closes ('' for a clean close); bounded by `timeoutMs`. */
function closed(s: net.Socket, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let code = '';
    const timer = setTimeout(() => reject(new Error(`socket still open after ${timeoutMs} ms`)), timeoutMs);
    s.on('error', (err: NodeJS.ErrnoException) => (code = err.code ?? err.message));
    s.once('close', () => {
      clearTimeout(timer);
      resolve(code);
    });
    s.resume();
  });
}

async function started(
  t: ExecutionContext,
  env: TestEnv,
  allowed: string[],
  node: NodeSideOptions,
): Promise<Awaited<ReturnType<typeof startAgent>>> {
  const { server } = await startServer(t, env, { allowedDestinations: allowed, transport: 'h2' });
  const agent = await startAgent(t, env, server.agentPort, { transport: 'h2', node });
  await waitFor(() => agent.agent.tunnels().length === 1, 'the tunnel', 10_000);
  return agent;
}

test('a node connection to the advertise address reaches an allow-listed destination through the tunnel, and half-closes', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const node = await nodeSide(echo.address);
  const agent = await started(t, env, [echo.address], node);
  const s = await connectNode(node.targets[0].localPort);
  t.is(await echoRoundTrip(s, 'node to control plane'), 'node to control plane');
  s.end();
  t.is(await closed(s), '');
  await waitFor(() => echo.open === 0, 'the destination connection to close');
  t.is(agent.logs.matching('node listener ready').length, 1);
});

test('a destination the server does not allow is closed without a byte', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const node = await nodeSide(echo.address);
  await started(t, env, [], node);
  const s = await connectNode(node.targets[0].localPort);
  let received = 0;
  s.on('data', (c: Buffer) => (received += c.length));
  s.write('hello');
  await closed(s);
  t.is(received, 0);
  t.is(echo.accepted, 0);
});

test('stop closes the node listeners: the advertise port refuses afterwards and can be bound again', async (t) => {
  const env = await makeEnv(t);
  const echo = await startEchoServer(t);
  const node = await nodeSide(echo.address);
  const agent = await started(t, env, [echo.address], node);
  const port = node.targets[0].localPort;
  await agent.stop(0);
  await t.throwsAsync(connectNode(port), { code: 'ECONNREFUSED' });
  const again = net.createServer();
  await new Promise<void>((resolve, reject) => again.once('error', reject).listen(port, NODE_ADDRESS, resolve));
  await new Promise<void>((resolve) => again.close(() => resolve()));
});

test('a start that cannot bind a target fails naming the address and releases what it started', async (t) => {
  const env = await makeEnv(t);
  const { server } = await startServer(t, env, { transport: 'h2' });
  const node = await nodeSide('127.0.0.1:1');
  const taken = await freePort(NODE_ADDRESS);
  const holder = net.createServer();
  await new Promise<void>((resolve) => holder.listen(taken, NODE_ADDRESS, resolve));
  t.teardown(() => new Promise<void>((resolve) => holder.close(() => resolve())));
  const first = node.targets[0];
  const logs = captureLogger('debug');
  // Assembled as `kanal agent` assembles it; the node side given as options (a loopback address, no interface).
  const assembled = new KanalAgent(
    await agentOptionsFromFlags(
      [
        '--agent-id',
        'node-1',
        '--proxy-server-host',
        '127.0.0.1',
        '--proxy-server-port',
        String(server.agentPort),
        '--ca-cert',
        env.pki.caCert,
        '--dial-timeout',
        '5s',
        '--connect-timeout',
        '5s',
        '--health-server-port',
        '0',
        '--admin-server-port',
        '0',
        '--transport',
        'h2',
      ],
      { log: logs.log, node: { ...node, targets: [first, { localPort: taken, destination: '127.0.0.1:2' }] } },
    ),
  );
  await t.throwsAsync(assembled.start(), {
    message: `cannot listen on ${NODE_ADDRESS}:${taken} (--bind-address, --target ${taken}:127.0.0.1:2): the address is already in use (another process listens there: stop it or choose another port); EADDRINUSE`,
  });
  t.is(assembled.tunnels.tunnels().length, 0);
  // The first target's listener was closed again.
  await t.throwsAsync(connectNode(first.localPort), { code: 'ECONNREFUSED' });
});
