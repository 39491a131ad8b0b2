/**
 * Clients of a Kanal server's frontends as the kube-apiserver (or an attacker
 * in its place) uses them: CONNECT on the Unix socket, mTLS on TCP, gRPC
 * ProxyService, raw requests and garbage.
 */
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import * as grpc from '@grpc/grpc-js';
import type { AgentCredential } from '../../kit/pki/throwaway-pki.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';
import { ProxyStream } from './e2e-grpc-client.js';
import { echoRoundTrip, readToEnd, waitClosed } from './byte-streams.js';
import type { KanalServerProcess } from './kanal-children.js';
import type { Workspace } from './workspace.js';

/** CONNECT through a server's Unix-socket frontend; resolves with the tunnelled socket. */
export async function connectThrough(server: KanalServerProcess, address: string, timeoutMs = 15_000): Promise<net.Socket> {
  const s = await connectUnix(server.uds);
  return httpConnect(s, address, timeoutMs);
}

/** connectThrough, the tunnelled socket destroyed by the scope. */
export async function tunnelThrough(scope: Scope, server: KanalServerProcess, address: string, timeoutMs?: number): Promise<net.Socket> {
  const s = await connectThrough(server, address, timeoutMs);
  scope.teardown(() => void s.destroy());
  return s;
}

/** A fresh CONNECT to an echo backend at `address`: whether `data` came back (the socket is closed either way). */
export async function echoesThrough(server: KanalServerProcess, address: string, data: Buffer): Promise<boolean> {
  const s = await connectThrough(server, address);
  try {
    return await echoRoundTrip(s, data);
  } finally {
    s.destroy();
  }
}

/**
 * Opens an mTLS connection to the TCP frontend (HTTP/1.1 via ALPN) with the
 * KAS's client certificate (default), none, or another one (an agent's, to
 * check that roles never mix).
 */
export function tlsToFrontend(
  server: Pick<KanalServerProcess, 'frontendPort'>,
  ws: Workspace,
  opts: { clientCert?: boolean; credential?: AgentCredential; servername?: string } = {},
): Promise<tls.TLSSocket> {
  const { pki } = ws;
  const credential =
    opts.clientCert === false ? undefined : (opts.credential ?? { cert: pki.frontendClientCert, key: pki.frontendClientKey });
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    const s = tls.connect({
      host: '127.0.0.1',
      port: server.frontendPort,
      ca: fs.readFileSync(pki.frontendCaCert),
      cert: credential && fs.readFileSync(credential.cert),
      key: credential && fs.readFileSync(credential.key),
      servername: opts.servername,
      ALPNProtocols: ['http/1.1'],
    });
    s.once('secureConnect', () => resolve(s));
    s.once('error', reject);
  });
}

/** How a frontend client reaches the server: its Unix socket, or the mTLS TCP frontend. */
export type FrontendTransport = 'uds' | 'tcp';

/**
 * A raw frontend connection (inside TLS for TCP) and how to make it vanish:
 * a reset on TCP (of the TCP socket under TLS), a close on a Unix socket (which has no reset).
 */
export async function frontendConnection(
  server: KanalServerProcess,
  ws: Workspace,
  transport: FrontendTransport,
): Promise<{ socket: net.Socket; reset(): void }> {
  if (transport === 'uds') {
    const s = await connectUnix(server.uds);
    s.on('error', () => undefined);
    return { socket: s, reset: () => s.destroy() };
  }
  const { raw, tls: s } = await tlsToFrontendRaw(server, ws);
  s.on('error', () => undefined);
  return { socket: s, reset: () => raw.resetAndDestroy() };
}

/** The TCP frontend over mTLS, with the TCP socket under it (to reset it: `raw.resetAndDestroy()`). */
export function tlsToFrontendRaw(server: KanalServerProcess, ws: Workspace): Promise<{ raw: net.Socket; tls: tls.TLSSocket }> {
  const { pki } = ws;
  return new Promise((resolve, reject) => {
    const raw = net.connect({ host: '127.0.0.1', port: server.frontendPort });
    raw.on('error', () => undefined);
    const s = tls.connect({
      socket: raw,
      servername: 'localhost',
      ca: fs.readFileSync(pki.frontendCaCert),
      cert: fs.readFileSync(pki.frontendClientCert),
      key: fs.readFileSync(pki.frontendClientKey),
    });
    s.once('secureConnect', () => resolve({ raw, tls: s }));
    s.once('error', reject);
  });
}

/**
 * A gRPC ProxyService stream to a server's frontend, cancelled by the scope:
 * its Unix socket, or mTLS TCP with the workspace's frontend client certificate.
 */
export function frontendProxyStream(scope: Scope, server: Pick<KanalServerProcess, 'uds' | 'frontendPort'>, ws?: Workspace): ProxyStream {
  const stream = server.uds ? new ProxyStream(`unix://${server.uds}`) : tlsProxyStream(server.frontendPort, ws);
  scope.teardown(() => stream.cancel());
  return stream;
}

function tlsProxyStream(port: number, ws: Workspace | undefined): ProxyStream {
  if (!ws) throw new Error('a gRPC stream to a TCP frontend needs the workspace (its frontend client certificate)');
  const { pki } = ws;
  return new ProxyStream(`127.0.0.1:${port}`, {
    credentials: grpc.credentials.createSsl(
      fs.readFileSync(pki.frontendCaCert),
      fs.readFileSync(pki.frontendClientKey),
      fs.readFileSync(pki.frontendClientCert),
    ),
    channelOptions: { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' },
  });
}

export interface RawAnswer {
  status: number;
  statusLine: string;
  body: string;
  raw: string;
}

/**
 * Sends `request` as-is on a fresh Unix-socket connection and reads the
 * answer until the server closes (bounded). For refusals (4xx/5xx).
 */
export async function rawRequest(uds: string, request: string | Buffer, timeoutMs = 10_000): Promise<RawAnswer> {
  const s = await connectUnix(uds);
  s.on('error', () => undefined);
  const reading = readToEnd(s, timeoutMs);
  s.write(request);
  let buf: Buffer;
  try {
    buf = await reading;
  } finally {
    s.destroy();
  }
  const raw = buf.toString('utf8');
  const statusLine = raw.split('\r\n', 1)[0] ?? '';
  const end = raw.indexOf('\r\n\r\n');
  return { status: Number(statusLine.split(' ')[1] ?? 0), statusLine, body: end >= 0 ? raw.slice(end + 4) : '', raw };
}

/** Connects to a TCP port, writes `bytes`, and waits (bounded) for the peer to close. */
export async function sendGarbage(port: number, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  const s = net.connect({ host: '127.0.0.1', port });
  s.on('error', () => undefined);
  await new Promise<void>((resolve, reject) => {
    s.once('connect', () => resolve());
    s.once('error', reject);
  });
  return sendAndCollect(s, bytes, timeoutMs);
}

/** Same as sendGarbage for a Unix socket. */
export async function sendGarbageUnix(uds: string, bytes: Buffer, timeoutMs = 10_000): Promise<Buffer> {
  const s = await connectUnix(uds);
  s.on('error', () => undefined);
  return sendAndCollect(s, bytes, timeoutMs);
}

/** Writes `bytes`, then collects whatever comes back until the peer closes (bounded). */
async function sendAndCollect(s: net.Socket, bytes: Buffer, timeoutMs: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  s.on('data', (c: Buffer) => chunks.push(c));
  s.write(bytes);
  try {
    await waitClosed(s, timeoutMs);
  } finally {
    s.destroy();
  }
  return Buffer.concat(chunks);
}
