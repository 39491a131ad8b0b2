/**
 * The server's sockets: the agent port (mTLS, gRPC only) and the frontend
 * (Unix socket or mTLS TCP, its front doors told apart on one listener:
 * frontends/frontend-registry.ts).
 * Refusals are decided here, before any protocol library sees the bytes,
 * and go to Refusals (counted, logged per peer at a bounded rate).
 */
import net from 'node:net';
import tls from 'node:tls';
import type { Logger } from 'pino';
import type { GrpcServerTransport } from '../transport/transport.js';
import { listenError } from '../common/listen-error.js';
import { formatHostPort } from '../common/host-port.js';
import { sniffProtocol } from './frontends/protocol-sniffer.js';
import { verifyClientCertificate } from './identity/tls-policy.js';
import type { AgentConnection } from './identity/agent-credential.js';
import type { Recognition } from './tenants/tenant-directory.js';
import { ClientRoles } from './identity/client-roles.js';
import { sizeTunnelSendBuffer, sizeUnixFrontendSendBuffer, type SendBufferResult } from '../transport/socket-send-buffer.js';
import { closeWhenPeerGone } from '../transport/peer-gone-watch.js';
import type { Refusals } from '../domain/refusal-log.js';
import { frontendClient } from './frontends/client-identity.js';
import type { FrontendConnection, FrontendServices } from './frontends/frontend.js';
import { frontendsServed, frontendsSniffed, type FrontendMode } from './frontends/frontend-registry.js';
import { DEFAULT_UDS_MODE, listenUnix, type UnixSocketFile, type UnixSocketOptions } from './frontends/unix-socket.js';

// The settings these messages name, spelt once here: this module sits below the server's table (src/server/config/settings.ts) in the layers.
const SERVER_PORT = '--server-port';

export interface TlsFiles {
  cert: Buffer;
  key: Buffer;
  /** CA for client certificates; absent means clients cannot be verified. */
  ca?: Buffer;
  /** --tls-min-version and --cipher-suites (src/server/config/tls-flags.ts); absent: Node's defaults. */
  minVersion?: tls.SecureVersion;
  ciphers?: string;
}

export interface Listener {
  readonly address: string;
  readonly port: number;
  close(): Promise<void>;
  /**
   * TLS listeners: serves a connection another process accepted (a worker,
   * docs/multi-tenant.md "Workers"); `head` is what that process read of it already.
   */
  adopt?(socket: net.Socket, head: Buffer): void;
  /** The frontend: serves a connection whose tenant another worker decided (already decrypted). */
  adoptDecided?(socket: net.Socket, connection: FrontendConnection, peer: string): void;
}

/** Gives a TLS server a connection accepted elsewhere, the bytes already read put back first (Node's TLSSocket takes a socket's buffered data). */
function adoptInto(server: tls.Server): (socket: net.Socket, head: Buffer) => void {
  return (socket, head) => {
    if (head.length > 0) socket.unshift(head);
    server.emit('connection', socket);
  };
}

export type { FrontendConnection } from './frontends/frontend.js';
export { FRONTEND_MODES, type FrontendMode } from './frontends/frontend-registry.js';

/** From accept to a complete request head (HTTP/1.1) or HTTP/2 preface. */
export const REQUEST_HEAD_TIMEOUT_MS = 30_000;
const HANDSHAKE_TIMEOUT_MS = 15_000;

function closeServer(server: net.Server, sockets: Set<net.Socket>): Promise<void> {
  return new Promise<void>((resolve) => {
    if (!server.listening) return resolve();
    server.close(() => resolve());
    for (const s of sockets) s.destroy();
  });
}

/** "host:port" of a TCP peer, "[v6]:port" for IPv6; `fallback` when the socket has none. */
export function peerOf(socket: net.Socket, fallback: string): string {
  const { remoteAddress: address, remotePort: port } = socket;
  if (address === undefined) return fallback;
  return formatHostPort({ host: address, port: port ?? 0 });
}

/**
 * Tracks accepted sockets (to close them with the listener) and remembers
 * each one's peer: once a socket is destroyed (a handshake aborted by a
 * reset), Node no longer knows its address (it would be logged as
 * "undefined:undefined").
 */
function track(server: net.Server, sockets: Set<net.Socket>, peers: WeakMap<net.Socket, string>): void {
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    peers.set(s, peerOf(s, 'unknown'));
    s.on('close', () => sockets.delete(s));
  });
}

/** The peer of a TLS socket, even after it was destroyed: Node's TLSSocket keeps the TCP socket it wraps as `_parent` (_tls_wrap.js). */
function tlsPeer(socket: tls.TLSSocket, peers: WeakMap<net.Socket, string>): string {
  const parent: unknown = Reflect.get(socket, '_parent');
  return (parent instanceof net.Socket ? peers.get(parent) : undefined) ?? peerOf(socket, 'unknown');
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
 * A frontend Unix socket's send buffer, sized (sizeUnixFrontendSendBuffer) the
 * first time the kernel's default one filled: Node emits 'drain' only after a
 * write it could not pass on whole. A dial whose answers fit the default
 * (most: a webhook, an exec, a scrape) pays no setsockopt, a download pays one
 * wait for the default buffer to empty, then has the large one.
 */
function sizeWhenFull(size: (s: net.Socket) => void): (s: net.Socket) => void {
  return (s) => {
    s.once('drain', () => {
      if (!s.destroyed) size(s);
    });
  };
}

/**
 * Counts and closes connections whose TLS handshake failed (logged once per
 * interval per peer). Node destroys the socket itself after a protocol
 * error, but after `handshakeTimeout` it only emits the error: a client
 * that sent half a record, or nothing, kept its connection (and a file
 * descriptor) for as long as it liked.
 */
function closeFailedHandshakes(
  server: tls.Server,
  peers: WeakMap<net.Socket, string>,
  refusals: Refusals,
  what: 'agent' | 'frontend',
): void {
  server.on('tlsClientError', (err: NodeJS.ErrnoException, socket: tls.TLSSocket) => {
    const code = err.code ?? err.message;
    refusals.refuse({
      reason: `${what}_tls_handshake`,
      peer: tlsPeer(socket, peers),
      fields: { err: code },
      message: `refused ${what} connection: TLS handshake failed`,
      detail: code,
    });
    socket.destroy();
  });
}

/** Once listening: an 'error' without a listener would end the process, and there is nothing to do but say so. */
function reportErrors(server: net.Server, log: Logger): void {
  server.on('error', (err: Error) => log.error({ err: err.message }, 'listener error'));
}

async function listenTcp(server: net.Server, host: string, port: number, flags: string): Promise<number> {
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen({ host, port }, () => {
        server.off('error', reject);
        resolve();
      });
    });
  } catch (err) {
    throw listenError(err, formatHostPort({ host, port }), flags);
  }
  const address = server.address();
  return address !== null && typeof address === 'object' ? address.port : port;
}

export interface AgentListenerOptions {
  host: string;
  /** Undefined: nothing is bound, connections come in through adopt() (a worker). */
  port: number | undefined;
  tls: TlsFiles;
  allowUnauthenticated: boolean;
  /** Every stream proves itself with a service account token: without a client CA, no certificate is needed. */
  tokenAuthentication?: boolean;
  /** Role pins of client certificates (default: none; separate CAs keep the roles apart). */
  roles?: ClientRoles;
  /** Streams learn who authenticated their connection (and whose it is) from the context. */
  grpc: GrpcServerTransport<AgentConnection>;
  /** A server of many tenants decides whose each connection is (instead of the one CA and `roles`). */
  recognise?: (socket: tls.TLSSocket) => Recognition<AgentConnection>;
  /** The context for a TLS server name (SNI), when one is not the default's. */
  sni?: (serverName: string) => tls.SecureContext | undefined;
  log: Logger;
  refusals: Refusals;
  /** Default HANDSHAKE_TIMEOUT_MS. */
  handshakeTimeoutMs?: number;
}

export async function listenForAgents(opts: AgentListenerOptions): Promise<Listener> {
  const withoutCertificate = opts.allowUnauthenticated
    ? '--allow-unauthenticated-agents'
    : opts.tokenAuthentication && !opts.tls.ca
      ? 'each stream needs a service account token'
      : undefined;
  const sockets = new Set<net.Socket>();
  const peers = new WeakMap<net.Socket, string>();
  const server = tls.createServer({
    ...opts.tls,
    requestCert: true,
    // Verified below so the refusal can be logged with its reason.
    rejectUnauthorized: false,
    ALPNProtocols: ['h2'],
    handshakeTimeout: opts.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
    allowHalfOpen: false,
    ...(opts.sni ? { SNICallback: sniCallback(opts.sni) } : {}),
  });
  track(server, sockets, peers);
  // Agents that size their own side rule the HTTP/2 stall out even when this one is short.
  server.on('connection', sendBufferSizer(sizeTunnelSendBuffer, opts.log, 'agent sockets'));
  const recognise = opts.recognise ?? ((socket: tls.TLSSocket) => oneCluster(socket, opts.roles ?? new ClientRoles(), withoutCertificate));
  server.on('secureConnection', (socket: tls.TLSSocket) => {
    const verdict = recognise(socket);
    const peer = tlsPeer(socket, peers);
    if (!verdict.ok) {
      opts.refusals.refuse({
        reason: verdict.reason,
        peer,
        fields: { ...verdict.fields, reason: verdict.detail },
        message: `refused agent connection: ${verdict.what}`,
        detail: verdict.detail,
      });
      socket.destroy();
      return;
    }
    opts.log.debug({ peer, tenant: verdict.connection.tenant, identity: verdict.identity }, 'agent TLS connection accepted');
    closeWhenPeerGone(socket, (reason) =>
      opts.log.warn({ peer, reason }, 'closing agent connection: its peer is gone and HTTP/2 had not noticed'),
    );
    opts.grpc.injectConnection(socket, verdict.connection);
  });
  closeFailedHandshakes(server, peers, opts.refusals, 'agent');
  const adopt = adoptInto(server);
  if (opts.port === undefined) {
    return {
      address: 'adopted',
      port: 0,
      close: () => closeServer(server, sockets),
      adopt,
    };
  }
  const port = await listenTcp(server, opts.host, opts.port, '--agent-bind-address, --agent-port');
  reportErrors(server, opts.log);
  opts.log.info(
    {
      address: `${opts.host}:${port}`,
      mtls: !!opts.tls.ca,
      tokens: !!opts.tokenAuthentication,
      allowUnauthenticated: opts.allowUnauthenticated,
    },
    'agent listener ready',
  );
  return {
    address: `${opts.host}:${port}`,
    port,
    close: () => closeServer(server, sockets),
    adopt,
  };
}

/** A server of one cluster: its CA and role pins decide (tls-policy.ts). */
function oneCluster(socket: tls.TLSSocket, roles: ClientRoles, withoutCertificate: string | undefined): Recognition<AgentConnection> {
  const verdict = verifyClientCertificate(socket, 'agent', roles, withoutCertificate);
  if (verdict.ok) return { ok: true, connection: { credential: verdict.credential }, identity: verdict.detail };
  return {
    ok: false,
    reason: `agent_${verdict.refusal}`,
    what: verdict.refusal === 'role' ? 'not an agent credential' : 'no valid client certificate',
    detail: verdict.detail,
  };
}

/** Node's SNICallback from a lookup: an unknown name gets the default context (undefined). */
function sniCallback(
  lookup: (serverName: string) => tls.SecureContext | undefined,
): (serverName: string, cb: (err: Error | null, ctx?: tls.SecureContext) => void) => void {
  return (serverName, cb) => cb(null, lookup(serverName));
}

export interface FrontendListenerOptions {
  mode: FrontendMode;
  /**
   * Read each client's certificate subject or Unix uid/pid (client-identity.ts) for the audit log and clients: lists:
   * a cost per connection, so only with one of them. A function is asked per connection (a list may come with a reload).
   */
  identifyClients?: boolean | (() => boolean);
  uds?: UnixSocketOptions;
  /**
   * The Unix socket at `path` that another process binds (the primary of a
   * cluster's workers, docs/multi-tenant.md "Workers of one cluster"):
   * nothing is bound, its connections come in through adopt().
   */
  adoptedUds?: { path: string };
  /** The plain TCP listener at `address` that the primary of a cluster's workers binds: its connections come in through adopt(). */
  adoptedPlain?: { address: string };
  /**
   * Plain TCP, no TLS (a forward proxy or SOCKS5 for clients without a certificate, docs/frontends.md):
   * bound to loopback or a pod IP; a client is known by its address and what it presents.
   */
  plain?: { host: string; port: number };
  /** The flags that bind it, for a listen error (default: the frontend's). */
  listenFlags?: string;
  tcp?: {
    host: string;
    /** Undefined: nothing is bound, connections come in through adopt() (a worker). */
    port: number | undefined;
    tls: TlsFiles;
    handshakeTimeoutMs?: number;
    roles?: ClientRoles;
    /** A server of many tenants decides whose each connection is (instead of the one CA and `roles`). */
    recognise?: (socket: tls.TLSSocket) => Recognition<{ tenant: string }>;
  };
  /** The tenant a Unix socket serves (a server of many tenants gives each its own). */
  tenant?: string;
  /** What the front doors use: the gRPC server, each tenant's part of a door. */
  services: FrontendServices;
  log: Logger;
  refusals: Refusals;
  /** Default REQUEST_HEAD_TIMEOUT_MS. */
  requestHeadTimeoutMs?: number;
}

function identifying(identify: FrontendListenerOptions['identifyClients']): boolean {
  return typeof identify === 'function' ? identify() : (identify ?? false);
}

/** Hands a frontend connection to the front door its first bytes choose, if `--mode` serves it. */
function dispatch(socket: net.Socket, opts: FrontendListenerOptions, peer: string, connection: FrontendConnection): void {
  const acceptedAt = Date.now();
  const headTimeoutMs = opts.requestHeadTimeoutMs ?? REQUEST_HEAD_TIMEOUT_MS;
  const served = frontendsServed(opts.mode);
  sniffProtocol(socket, headTimeoutMs, frontendsSniffed(opts.mode))
    .then((sniffed) => {
      const protocol = sniffed.kind === 'door' ? sniffed.door.name : sniffed.kind;
      opts.log.debug({ peer, tenant: connection.tenant, protocol }, 'frontend connection');
      if (sniffed.kind === 'closed' || socket.destroyed) {
        socket.destroy();
      } else if (sniffed.kind === 'timeout') {
        opts.refusals.refuse({ reason: 'frontend_timeout', peer, fields: {}, message: 'closed frontend connection: no request in time' });
        socket.destroy();
      } else if (sniffed.kind === 'door' && served.has(sniffed.door.name)) {
        sniffed.door.serve(socket, {
          peer,
          connection: { ...connection, client: frontendClient(socket, peer, identifying(opts.identifyClients)) },
          headDeadlineMs: headTimeoutMs - (Date.now() - acceptedAt),
          server: opts.services,
        });
      } else {
        opts.refusals.refuse({
          reason: 'frontend_protocol',
          peer,
          fields: { protocol, mode: opts.mode },
          message: 'refused frontend connection: protocol not served in this --mode',
          detail: protocol,
        });
        socket.destroy();
      }
    })
    .catch((err: Error) => {
      // A bug, not the client's doing: this connection ends, the server goes on.
      opts.log.error({ peer, err }, 'frontend connection failed');
      socket.destroy();
    });
}

export async function listenForFrontends(opts: FrontendListenerOptions): Promise<Listener> {
  const sockets = new Set<net.Socket>();
  const peers = new WeakMap<net.Socket, string>();
  if (opts.uds) {
    const peer = `unix:${opts.uds.path}`;
    const connection: FrontendConnection = opts.tenant === undefined ? {} : { tenant: opts.tenant };
    const server = net.createServer({ allowHalfOpen: true }, (socket) => dispatch(socket, opts, peer, connection));
    track(server, sockets, peers);
    server.on('connection', sizeWhenFull(sendBufferSizer(sizeUnixFrontendSendBuffer, opts.log, 'frontend Unix sockets')));
    const file: UnixSocketFile = await listenUnix(server, opts.uds);
    reportErrors(server, opts.log);
    opts.log.info(
      { uds: file.path, mode: opts.mode, fileMode: `0${(opts.uds.mode ?? DEFAULT_UDS_MODE).toString(8)}`, gid: opts.uds.gid },
      'frontend listener ready',
    );
    return {
      address: `unix://${file.path}`,
      port: 0,
      close: async () => {
        await closeServer(server, sockets);
        file.release();
      },
    };
  }
  if (opts.adoptedUds) return adoptUnix(opts, opts.adoptedUds.path, sockets);
  if (opts.adoptedPlain) return adoptPlain(opts, opts.adoptedPlain.address, sockets);
  if (opts.plain) return listenPlain(opts, opts.plain, sockets, peers);
  const tcp = opts.tcp;
  if (!tcp) throw new Error(`frontend needs --uds-name or ${SERVER_PORT}`);
  const server = tls.createServer({
    ...tcp.tls,
    requestCert: !!tcp.tls.ca || !!tcp.recognise,
    rejectUnauthorized: false,
    ALPNCallback: selectFrontendAlpn,
    handshakeTimeout: tcp.handshakeTimeoutMs ?? HANDSHAKE_TIMEOUT_MS,
    allowHalfOpen: true,
  });
  track(server, sockets, peers);
  server.on('secureConnection', (socket: tls.TLSSocket) => {
    const peer = tlsPeer(socket, peers);
    if (tcp.recognise) {
      const verdict = tcp.recognise(socket);
      if (!verdict.ok) {
        opts.refusals.refuse({
          reason: verdict.reason,
          peer,
          fields: { ...verdict.fields, reason: verdict.detail },
          message: `refused frontend connection: ${verdict.what}`,
          detail: verdict.detail,
        });
        socket.destroy();
        return;
      }
      dispatch(socket, opts, peer, verdict.connection);
      return;
    }
    if (tcp.tls.ca) {
      const verdict = verifyClientCertificate(socket, 'frontend', tcp.roles ?? new ClientRoles());
      if (!verdict.ok) {
        const what = verdict.refusal === 'role' ? 'not a frontend credential' : 'no valid client certificate';
        opts.refusals.refuse({
          reason: `frontend_${verdict.refusal}`,
          peer,
          fields: { reason: verdict.detail },
          message: `refused frontend connection: ${what}`,
          detail: verdict.detail,
        });
        socket.destroy();
        return;
      }
    }
    dispatch(socket, opts, peer, {});
  });
  closeFailedHandshakes(server, peers, opts.refusals, 'frontend');
  const adopt = adoptInto(server);
  const adoptDecided = (socket: net.Socket, connection: FrontendConnection, peer: string): void => dispatch(socket, opts, peer, connection);
  if (tcp.port === undefined) {
    return {
      address: 'adopted',
      port: 0,
      close: () => closeServer(server, sockets),
      adopt,
      adoptDecided,
    };
  }
  const port = await listenTcp(server, tcp.host, tcp.port, `--server-bind-address, ${SERVER_PORT}`);
  reportErrors(server, opts.log);
  opts.log.info({ address: `${tcp.host}:${port}`, mode: opts.mode, mtls: !!tcp.tls.ca }, 'frontend listener ready');
  return {
    address: `${tcp.host}:${port}`,
    port,
    close: () => closeServer(server, sockets),
    adopt,
    adoptDecided,
  };
}

/** A Unix socket frontend whose connections another process accepted: each is served as the socket's own would be. */
function adoptUnix(opts: FrontendListenerOptions, path: string, sockets: Set<net.Socket>): Listener {
  const peer = `unix:${path}`;
  const size = sizeWhenFull(sendBufferSizer(sizeUnixFrontendSendBuffer, opts.log, 'frontend Unix sockets'));
  return adopted(opts, `unix://${path}`, sockets, (socket) => {
    size(socket);
    return peer;
  });
}

/** A plain TCP frontend whose connections another process accepted (listenPlain's, bound there). */
function adoptPlain(opts: FrontendListenerOptions, address: string, sockets: Set<net.Socket>): Listener {
  return adopted(opts, address, sockets, (socket) => {
    // As listenPlain's noDelay: an answer written as head then body must not wait for a delayed ACK (RFC 896).
    socket.setNoDelay(true);
    return peerOf(socket, 'unknown');
  });
}

/** A listener bound by another process: `prepare` readies each handed socket and names its peer; each is then served as its own would be. */
function adopted(
  opts: FrontendListenerOptions,
  address: string,
  sockets: Set<net.Socket>,
  prepare: (socket: net.Socket) => string,
): Listener {
  const connection: FrontendConnection = opts.tenant === undefined ? {} : { tenant: opts.tenant };
  let open = true;
  return {
    address,
    port: 0,
    close: () => {
      open = false;
      for (const s of sockets) s.destroy();
      return Promise.resolve();
    },
    adopt: (socket, head) => {
      if (!open) {
        socket.destroy();
        return;
      }
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
      const peer = prepare(socket);
      if (head.length > 0) socket.unshift(head);
      dispatch(socket, opts, peer, connection);
    },
  };
}

/**
 * The frontend's ALPN choice (RFC 7301): `http/1.1` whenever the client
 * offers it, `h2` only when it offers h2 alone. gRPC clients (grpc-go,
 * grpc-js, upstream's proxy-test-client) offer just `h2`; Go's net/http with
 * an https:// proxy URL (Prometheus's proxy_url) offers `h2,http/1.1` and
 * cannot speak HTTP/2 to a proxy ("http2: unsupported scheme"), nor would an
 * HTTP/1.1 CONNECT or forward request be read as h2; the server's preference
 * order alone (ALPNProtocols) picked h2 for both. A client offering neither
 * is refused with no_application_protocol, as with ALPNProtocols; one offering
 * none gets none. The door is still chosen by the first bytes (protocol-sniffer.ts).
 */
export function selectFrontendAlpn({ protocols }: { protocols: string[] }): string | undefined {
  if (protocols.includes('http/1.1')) return 'http/1.1';
  if (protocols.includes('h2')) return 'h2';
  return undefined;
}

/** A frontend listener on plain TCP (FrontendListenerOptions.plain): each connection goes to the sniffer as it comes. */
async function listenPlain(
  opts: FrontendListenerOptions,
  plain: { host: string; port: number },
  sockets: Set<net.Socket>,
  peers: WeakMap<net.Socket, string>,
): Promise<Listener> {
  const connection: FrontendConnection = opts.tenant === undefined ? {} : { tenant: opts.tenant };
  // An answer written as head then body must not wait for the client's delayed ACK (Nagle, RFC 896).
  const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) =>
    dispatch(socket, opts, peers.get(socket) ?? peerOf(socket, 'unknown'), connection),
  );
  track(server, sockets, peers);
  const port = await listenTcp(server, plain.host, plain.port, opts.listenFlags ?? `the ${opts.mode} listener`);
  reportErrors(server, opts.log);
  const address = formatHostPort({ host: plain.host, port });
  opts.log.info({ address, mode: opts.mode, tls: false }, 'frontend listener ready');
  return { address, port, close: () => closeServer(server, sockets) };
}
