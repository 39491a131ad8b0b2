/**
 * A server of one cluster in this process with both SOCKS5 listeners
 * (--socks5-port on loopback, --socks5-uds-name), an agent connected to it,
 * and HTTP backends on loopback: what the SOCKS5 tests dial through.
 */
import type { ExecutionContext } from 'ava';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { startServerInProcess } from '../../kit/launch/in-process.js';
import { captureLogger, closedPort, oneClusterFlags, startAgent, waitFor, type TestEnv } from './in-process.js';
import type { KanalServer } from '../../src/server/server.js';

/** An HTTP server on `host` answering every request with its own name and the path. */
export async function httpBackend(t: ExecutionContext, host: string): Promise<number> {
  const server = http.createServer((req, res) => res.end(`hello from ${host} ${req.url ?? ''}`));
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return (server.address() as net.AddressInfo).port;
}

/** A port nothing listens on now, for the SOCKS5 listener (the server reports no port of an extra listener). */
const freePort = closedPort;

export interface Started {
  server: KanalServer;
  socksPort: number;
  socksPath: string;
}

export async function startWithSocks(t: ExecutionContext, env: TestEnv): Promise<Started> {
  const socksPort = await freePort();
  const socksPath = path.join(env.dir, 'socks.sock');
  const logs = captureLogger('debug');
  const flags = [
    '--server-id',
    'socks-test',
    ...oneClusterFlags(env.pki, env.udsPath),
    '--health-port',
    '0',
    '--admin-port',
    '0',
    '--backend-dial-timeout',
    '5s',
    '--socks5-port',
    String(socksPort),
    '--socks5-uds-name',
    socksPath,
  ];
  const { server, close } = await startServerInProcess(flags, { log: logs.log, ephemeralHealthHost: '127.0.0.1' });
  t.teardown(close);
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  return { server, socksPort, socksPath };
}
