/**
 * The server's sockets: the agent port (mTLS, gRPC only) and the frontend
 * (Unix socket or mTLS TCP, gRPC and/or HTTP CONNECT on one listener).
 * Refusals are decided and logged here, before any protocol library sees
 * the bytes.
 */
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import type http from 'node:http';
import type { Logger } from 'pino';
import type { GrpcServerTransport } from '../transport/transport.js';
import { sniffProtocol } from './protocol-sniffer.js';
import { verifyClientCertificate } from './tls-policy.js';
import type { AgentCredential } from './agent-credential.js';
import { ClientRoles } from './client-roles.js';
import { sizeTunnelSendBuffer, sizeUnixFrontendSendBuffer, type SendBufferResult } from '../transport/socket-send-buffer.js';
import { closeWhenPeerGone } from '../transport/peer-gone-watch.js';

export interface TlsFiles {
  cert: Buffer;
  key: Buffer;
  /** CA for client certificates; absent means clients cannot be verified. */
  ca?: Buffer;
}

export interface Listener {
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
}

const SNIFF_TIMEOUT_MS = 30_000;
const HANDSHAKE_TIMEOUT_MS = 15_000;

function closeServer(server: net.Server, sockets: Set<net.Socket>): Promise<void> {
  return new Promise<void>((resolve) => {
    server.close(() => resolve());
    for (const s of sockets) s.destroy();
  });
}

function track(server: net.Server, sockets: Set<net.Socket>): void {
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
}

/**
 * Sizes each accepted socket's send buffer with `size`; says once, at info,
 * when the kernel grants less (an unprivileged server under a low
 * net.core.wmem_max): it still works, only less well.
 */
function sendBufferSizer(size: (s: net.Socket) => SendBufferResult, log: Logger, what: string): (s: net.Socket) => void {
  let reported = false;
  return (s) => {
    const { have, want } = size(s);
    if (have >= 0 && have < want && !reported) {
      reported = true;
      log.info({ have, want }, `${what} get a smaller send buffer than asked for (raise net.core.wmem_max or grant CAP_NET_ADMIN)`);
    }
  };
}

/**
 * Logs, counts and closes connections whose TLS handshake failed. Node
 * destroys the socket itself after a protocol error, but after
 * `handshakeTimeout` it only emits the error: a client that sent half a
 * record, or nothing, kept its connection (and a file descriptor) for as long
 * as it liked.
 */
function closeFailedHandshakes(server: tls.Server, log: Logger, what: string, refused: () => void): void {
  server.on('tlsClientError', (err: NodeJS.ErrnoException, socket: tls.TLSSocket) => {
    log.warn({ peer: `${socket.remoteAddress}:${socket.remotePort}`, err: err.code ?? err.message }, `refused ${what} connection: TLS handshake failed`);
    refused();
    socket.destroy();
  });
}

function listen(server: net.Server, opts: net.ListenOptions): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

export interface AgentListenerOptions {
  host: string;
  port: number;
  tls: TlsFiles;
  allowUnauthenticated: boolean;
  /** Role pins of client certificates (default: none; separate CAs keep the roles apart). */
  roles?: ClientRoles;
  /** Streams learn who authenticated their connection from the context. */
  grpc: GrpcServerTransport<AgentCredential>;
  log: Logger;
  refused?: (reason: string) => void;
  /** Default HANDSHAKE_TIMEOUT_MS. */
  handshakeTimeoutMs?: number;
}

export async function listenForAgents(opts: AgentListenerOptions): Promise<Listener> {
  const sockets = new Set<net.Socket>();
  const server = tls.createServer({
    cert: opts.tls.cert,
    key: opts.tls.key,
    ca: opts.tls.ca,
    requestCert: true,
    // Verified below so the refusal can be logged with its reason.
    rejectUnauthorized: false,
    ALPNProtocols: ['h2'],
    handshakeTimeout: opts.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
    allowHalfOpen: false,
  });
  track(server, sockets);
  // Agents that size their own side rule the HTTP/2 stall out even when this one is short.
  server.on('connection', sendBufferSizer(sizeTunnelSendBuffer, opts.log, 'agent sockets'));
  server.on('secureConnection', (socket: tls.TLSSocket) => {
    const verdict = verifyClientCertificate(socket, 'agent', opts.roles ?? new ClientRoles(), opts.allowUnauthenticated);
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    if (!verdict.ok) {
      const what = verdict.refusal === 'role' ? 'not an agent credential' : 'no valid client certificate';
      opts.log.warn({ peer, reason: verdict.detail }, `refused agent connection: ${what}`);
      opts.refused?.(`agent_${verdict.refusal}`);
      socket.destroy();
      return;
    }
    opts.log.debug({ peer, credential: verdict.credential.subject, identity: verdict.detail }, 'agent TLS connection accepted');
    closeWhenPeerGone(socket, (reason) => opts.log.warn({ peer, reason }, 'closing agent connection: its peer is gone and HTTP/2 had not noticed'));
    opts.grpc.injectConnection(socket, verdict.credential);
  });
  closeFailedHandshakes(server, opts.log, 'agent', () => opts.refused?.('agent_tls_handshake'));
  await listen(server, { host: opts.host, port: opts.port });
  const port = (server.address() as net.AddressInfo).port;
  opts.log.info({ address: `${opts.host}:${port}`, mtls: !!opts.tls.ca, allowUnauthenticated: opts.allowUnauthenticated }, 'agent listener ready');
  return { address: `${opts.host}:${port}`, port, close: () => closeServer(server, sockets) };
}

export type FrontendMode = 'both' | 'grpc' | 'http-connect';

export interface FrontendListenerOptions {
  mode: FrontendMode;
  uds?: { path: string; deleteExisting: boolean };
  tcp?: { host: string; port: number; tls: TlsFiles; handshakeTimeoutMs?: number; roles?: ClientRoles };
  grpc: GrpcServerTransport;
  httpConnect: http.Server;
  log: Logger;
  refused?: (reason: string) => void;
}

function dispatch(socket: net.Socket, opts: FrontendListenerOptions, peer: string): void {
  sniffProtocol(socket, SNIFF_TIMEOUT_MS).then((proto) => {
    if (proto === 'closed' || proto === 'timeout') {
      if (proto === 'timeout') opts.log.warn({ peer }, 'closed frontend connection: no request in time');
      socket.destroy();
      return;
    }
    if (proto === 'h2' && opts.mode !== 'http-connect') {
      // Only HTTP/2 sessions can miss a dead peer (see peer-gone-watch.ts); Unix sockets are skipped.
      closeWhenPeerGone(socket, (reason) => opts.log.warn({ peer, reason }, 'closing frontend connection: its peer is gone and HTTP/2 had not noticed'));
      opts.grpc.injectConnection(socket);
      socket.resume();
    } else if (proto === 'http1' && opts.mode !== 'grpc') {
      opts.httpConnect.emit('connection', socket);
      socket.resume();
    } else {
      opts.log.warn({ peer, protocol: proto, mode: opts.mode }, 'refused frontend connection: protocol not served in this --mode');
      opts.refused?.('frontend_protocol');
      socket.destroy();
    }
  });
}

export async function listenForFrontends(opts: FrontendListenerOptions): Promise<Listener> {
  const sockets = new Set<net.Socket>();
  let server: net.Server;
  if (opts.uds) {
    const path = opts.uds.path;
    if (fs.existsSync(path)) {
      if (!opts.uds.deleteExisting) throw new Error(`${path} already exists; pass --delete-existing-uds-file to replace it`);
      fs.rmSync(path);
    }
    server = net.createServer({ allowHalfOpen: true }, (socket) => dispatch(socket, opts, `unix:${path}`));
    track(server, sockets);
    server.on('connection', sendBufferSizer(sizeUnixFrontendSendBuffer, opts.log, 'frontend Unix sockets'));
    await listen(server, { path });
    // The KAS runs as another user in some setups; the directory guards access.
    fs.chmodSync(path, 0o660);
    opts.log.info({ uds: path, mode: opts.mode }, 'frontend listener ready');
    return { address: `unix://${path}`, port: 0, close: () => closeServer(server, sockets) };
  }
  const tcp = opts.tcp;
  if (!tcp) throw new Error('frontend needs --uds-name or --server-port');
  const tlsServer = tls.createServer({
    cert: tcp.tls.cert,
    key: tcp.tls.key,
    ca: tcp.tls.ca,
    requestCert: !!tcp.tls.ca,
    rejectUnauthorized: false,
    ALPNProtocols: ['h2', 'http/1.1'],
    handshakeTimeout: tcp.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
    allowHalfOpen: true,
  });
  server = tlsServer;
  track(server, sockets);
  tlsServer.on('secureConnection', (socket: tls.TLSSocket) => {
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    if (tcp.tls.ca) {
      const verdict = verifyClientCertificate(socket, 'frontend', tcp.roles ?? new ClientRoles());
      if (!verdict.ok) {
        const what = verdict.refusal === 'role' ? 'not a frontend credential' : 'no valid client certificate';
        opts.log.warn({ peer, reason: verdict.detail }, `refused frontend connection: ${what}`);
        opts.refused?.(`frontend_${verdict.refusal}`);
        socket.destroy();
        return;
      }
    }
    dispatch(socket, opts, peer);
  });
  closeFailedHandshakes(tlsServer, opts.log, 'frontend', () => opts.refused?.('frontend_tls_handshake'));
  await listen(server, { host: tcp.host, port: tcp.port });
  const port = (server.address() as net.AddressInfo).port;
  opts.log.info({ address: `${tcp.host}:${port}`, mode: opts.mode, mtls: !!tcp.tls.ca }, 'frontend listener ready');
  return { address: `${tcp.host}:${port}`, port, close: () => closeServer(server, sockets) };
}
