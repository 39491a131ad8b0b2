/**
 * KanalServer and ServerTunnels in the test process: throwaway PKI in a temp
 * dir, agent port on 127.0.0.1:0 with mTLS, frontend on a Unix socket,
 * health on 127.0.0.1:0, logs captured into arrays. Options become `kanal`
 * flags, assembled by the CLI's own functions (kit/launch/in-process.ts).
 */
import net from 'node:net';
import path from 'node:path';
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ExecutionContext } from 'ava';
import { issueAgentCertificate, writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import type { KanalServer, ServerOptions } from '../../src/server/server.js';
import type { ServerTunnels } from '../../src/agent/server-tunnels.js';
import type { ProxyStrategy } from '../../src/server/routing/proxy-strategies.js';
import { startAgentInProcess, startServerInProcess } from '../../kit/launch/in-process.js';
import { CleanupStack, scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import type { NodeSideOptions } from '../../src/agent/node-side-config.js';
import { grpcJsTransport } from '../../src/transport/grpc-js/index.js';
import type { TransportName } from '../../src/transport/choice.js';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { PROXY_SERVICE_PROXY, MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import { formatFeatures, parseFeatures, type FeatureSet } from '../../src/wire/features.js';
import { captureLogger, type CapturedLogger } from './memory-stream.js';
import { formatHostPort } from '../../src/common/host-port.js';

export { captureLogger, waitFor, type CapturedLogger } from './memory-stream.js';

/** The flags of one cluster's server on loopback, its agent port on `agentPort` and its frontend on `udsPath`: what every in-process server starts from. */
export function oneClusterFlags(pki: Pick<ThrowawayPki, 'serverCert' | 'serverKey' | 'caCert'>, udsPath: string, agentPort = 0): string[] {
  return [
    '--cluster-cert',
    pki.serverCert,
    '--cluster-key',
    pki.serverKey,
    '--cluster-ca-cert',
    pki.caCert,
    '--agent-bind-address',
    '127.0.0.1',
    '--agent-port',
    String(agentPort),
    '--uds-name',
    udsPath,
  ];
}

export interface TestEnv {
  dir: string;
  pki: ThrowawayPki;
  udsPath: string;
}

let sharedPki: Promise<ThrowawayPki> | undefined;
/** Holds the shared PKI's directory; never run, so the directory goes at exit (kit/launch/exit-cleanup.ts). */
const processScope = new CleanupStack();

/** One throwaway PKI per test process (key generation is the slow part), removed at exit. */
function pkiOnce(): Promise<ThrowawayPki> {
  sharedPki ??= writeThrowawayPki(scopedTempDir(processScope, 'kanal-pki-'));
  return sharedPki;
}

/** A temp dir (for Unix sockets) and the throwaway certificates; the dir is removed at teardown. */
export async function makeEnv(t: ExecutionContext): Promise<TestEnv> {
  const dir = scopedTempDir(t, 'kanal-inproc-');
  const pki = await pkiOnce();
  return { dir, pki, udsPath: path.join(dir, 'frontend.sock') };
}

export interface StartedServer {
  server: KanalServer;
  logs: CapturedLogger;
  options: Readonly<ServerOptions>;
}

/** `kanal server` in this process (kit/launch/in-process.ts): these options become its flags. */
export async function startServer(
  t: ExecutionContext,
  env: TestEnv,
  opts: {
    serverID?: string;
    allowedDestinations?: string[];
    allowUnauthenticated?: boolean;
    health?: boolean;
    udsPath?: string;
    agentPort?: number;
    proxyStrategies?: ProxyStrategy[];
    maxAgentsPerCredential?: number;
    transport?: TransportName;
    /** More `kanal server` flags, as given. */
    extraFlags?: string[];
  } = {},
): Promise<StartedServer> {
  const logs = captureLogger('debug');
  const flags = [
    '--server-id',
    opts.serverID ?? 'test-server',
    ...oneClusterFlags(env.pki, opts.udsPath ?? env.udsPath, opts.agentPort),
    '--health-port',
    '0',
    '--admin-port',
    '0',
    '--backend-dial-timeout',
    '5s',
    '--destination-dial-timeout',
    '5s',
    '--transport',
    opts.transport ?? 'h2',
    ...(opts.allowUnauthenticated ? ['--allow-unauthenticated-agents'] : []),
    ...(opts.proxyStrategies ? ['--proxy-strategies', opts.proxyStrategies.join(',')] : []),
    ...(opts.maxAgentsPerCredential === undefined ? [] : ['--max-agents-per-credential', String(opts.maxAgentsPerCredential)]),
    ...(opts.allowedDestinations ?? []).flatMap((d) => ['--allowed-destination', d]),
    ...(opts.extraFlags ?? []),
  ];
  const { server, options, close } = await startServerInProcess(flags, {
    log: logs.log,
    ...(opts.health === false ? {} : { ephemeralHealthHost: '127.0.0.1' }),
  });
  t.teardown(close);
  return { server, logs, options };
}

export interface StartedAgent {
  agent: ServerTunnels;
  logs: CapturedLogger;
  stopped: boolean;
  stop(graceMs?: number): Promise<void>;
}

/** `kanal agent` in this process (kit/launch/in-process.ts): these options become its flags. */
export async function startAgent(
  t: ExecutionContext,
  env: TestEnv,
  port: number,
  /** `credential`: name of the agent's own certificate (default: its agentID); agents given one name share a credential. */
  opts: {
    agentID?: string;
    credential?: string;
    /** What the agent offers (no flag: stands for an agent without Kanal's extensions). */
    features?: FeatureSet;
    clientCert?: 'valid' | 'none' | 'rogue';
    identifiers?: string;
    health?: boolean;
    transport?: TransportName;
    /** Node -> control plane listeners, given as the assembled options (e.g. on 127.0.0.2 with interfaceType 'none'). */
    node?: NodeSideOptions;
    /** More flags, after the ones above (e.g. --cluster-dns). */
    extraFlags?: readonly string[];
  } = {},
): Promise<StartedAgent> {
  const logs = captureLogger('debug');
  const cert = opts.clientCert ?? 'valid';
  const agentID = opts.agentID ?? 'node-1';
  // Each agent holds a credential of its own, as each node does.
  const own = await issueAgentCertificate(env.pki, opts.credential ?? agentID);
  const pair: [cert: string, key: string] | undefined =
    cert === 'valid' ? [own.cert, own.key] : cert === 'rogue' ? [env.pki.rogueAgentCert, env.pki.rogueAgentKey] : undefined;
  const flags = [
    '--agent-id',
    agentID,
    '--agent-identifiers',
    opts.identifiers ?? 'host=node-1&ipv4=10.0.0.5',
    '--proxy-server-host',
    '127.0.0.1',
    '--proxy-server-port',
    String(port),
    '--ca-cert',
    env.pki.caCert,
    ...(pair ? ['--agent-cert', pair[0], '--agent-key', pair[1]] : []),
    '--dial-timeout',
    '5s',
    '--connect-timeout',
    '5s',
    '--sync-interval',
    '100ms',
    '--sync-interval-cap',
    '500ms',
    '--health-server-port',
    '0',
    '--admin-server-port',
    '0',
    '--transport',
    opts.transport ?? 'h2',
    ...(opts.extraFlags ?? []),
  ];
  const assembled = await startAgentInProcess(flags, {
    log: logs.log,
    ...(opts.health === false ? {} : { ephemeralHealthHost: '127.0.0.1' }),
    ...(opts.features ? { features: opts.features } : {}),
    ...(opts.node ? { node: opts.node } : {}),
  });
  const started: StartedAgent = {
    agent: assembled.tunnels,
    logs,
    stopped: false,
    async stop(graceMs = 1000) {
      if (started.stopped) return;
      started.stopped = true;
      await assembled.stop(graceMs);
    },
  };
  t.teardown(() => started.stop(0));
  return started;
}

// ---------- destinations ----------

export interface EchoServer {
  port: number;
  address: string;
  /** Sockets currently open on the echo server. */
  readonly open: number;
  readonly accepted: number;
  close(): Promise<void>;
}

/** A TCP echo server on 127.0.0.1:0 (half-close aware: ends after the client ends). */
/** `host`: any 127.0.0.0/8 address or ::1 (loopback only). */
export async function startEchoServer(t: ExecutionContext, host = '127.0.0.1'): Promise<EchoServer> {
  const sockets = new Set<net.Socket>();
  let accepted = 0;
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    accepted++;
    sockets.add(s);
    s.on('error', () => undefined);
    s.once('close', () => sockets.delete(s));
    s.pipe(s);
  });
  await new Promise<void>((resolve) => server.listen(0, host, resolve));
  const port = (server.address() as net.AddressInfo).port;
  const close = (): Promise<void> =>
    new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    });
  t.teardown(close);
  return {
    port,
    address: formatHostPort({ host, port }),
    get open() {
      return sockets.size;
    },
    get accepted() {
      return accepted;
    },
    close,
  };
}

/** A port on 127.0.0.1 where nothing listens (connection refused). */
export async function closedPort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => s.close(() => resolve()));
  return port;
}

// ---------- frontend clients ----------

export interface ConnectReply {
  status: number;
  head: string;
  socket: net.Socket;
}

/** Sends `CONNECT target` (or another request line) on the frontend socket and reads the response head. */
export function httpConnect(udsPath: string, target: string, method = 'CONNECT'): Promise<ConnectReply> {
  return new Promise<ConnectReply>((resolve, reject) => {
    const socket = net.connect({ path: udsPath, allowHalfOpen: true });
    let buf = Buffer.alloc(0);
    const onData = (chunk: Buffer): void => {
      buf = Buffer.concat([buf, chunk]);
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      socket.off('data', onData);
      socket.off('error', reject);
      socket.pause();
      const head = buf.subarray(0, end).toString('latin1');
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0);
      resolve({ status, head, socket });
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.once('connect', () => socket.write(`${method} ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`));
  });
}

/** Writes `text` and reads back exactly as many bytes. */
export function echoRoundTrip(socket: Duplex, text: string): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    let got = '';
    const onData = (c: Buffer): void => {
      got += c.toString();
      if (got.length >= text.length) {
        socket.off('data', onData);
        socket.off('error', reject);
        resolve(got);
      }
    };
    socket.on('data', onData);
    socket.once('error', reject);
    socket.resume();
    socket.write(text);
  });
}

export interface GrpcFrontendClient {
  tunnel: Tunnel;
  close(): void;
}

/** Opens a ProxyService/Proxy stream on the frontend (the KAS's konnectivity-client, in-process). */
/** `metadata`: more of the stream's metadata (an `authorization` token, as a client's per-RPC credentials send it). */
export async function grpcFrontendClient(
  t: ExecutionContext,
  udsPath: string,
  features: FeatureSet,
  metadata: Record<string, string> = {},
): Promise<GrpcFrontendClient> {
  const channel = grpcJsTransport.createChannel({ target: `unix://${udsPath}` });
  const md: Record<string, string> = { ...metadata };
  if (features.size > 0) md[MD_KANAL_FEATURES] = formatFeatures(features);
  const stream = await channel.openStream(PROXY_SERVICE_PROXY, md, 5000);
  const negotiated = parseFeatures(stream.metadata.get(MD_KANAL_FEATURES)?.[0]);
  // The client never performs dials; 'agent' parity is irrelevant here.
  const tunnel = new Tunnel(stream, { side: 'agent', features: negotiated, log: captureLogger('silent').log });
  const close = (): void => {
    tunnel.close();
    channel.close();
  };
  t.teardown(close);
  return { tunnel, close };
}

/** GET on the health port; resolves with status and body. */
export function httpGet(port: number, urlPath: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get({ host: '127.0.0.1', port, path: urlPath, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
  });
}
