/**
 * A small HTTP/1.1 listener for the health and admin ports: GET and HEAD
 * only, malformed requests answered 400 and logged at a bounded rate. Any
 * host (or local user) may reach these ports, so what one caller can make
 * the process hold is bounded (docs/limits.md, "Health and admin ports"):
 * connections at once (and per peer address), and how long a connection may
 * make no progress — a request not sent, or an answer not read — before it
 * is closed.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { http } from './node-http.js';
import type { AddressInfo, Socket } from 'node:net';
import type { Logger } from 'pino';
import { RateLimitedLog } from './rate-limited-log.js';
import { isLoopbackHost } from './loopback.js';

// The setting these messages name, spelt once here: both commands' tables use this module, which sits below them in the layers.
const HTTP_IDLE_TIMEOUT = '--http-idle-timeout';

export interface HttpListener {
  readonly port: number;
  close(): Promise<void>;
}

/** --http-max-connections and --http-idle-timeout (src/settings/http-port-settings.ts). */
export interface HttpPortLimits {
  /** Connections held at once; one peer address holds at most a quarter of them (at least 1). */
  maxConnections: number;
  /** A connection with no bytes moving either way for this long is closed; also the bound on reading a request head. */
  idleTimeoutMs: number;
}

export const DEFAULT_HTTP_PORT_LIMITS: HttpPortLimits = { maxConnections: 32, idleTimeoutMs: 10_000 };

/** Why a connection was closed by the limits: counted by the owner (kanal_refusals_total). */
export type HttpPortRefusal = 'http_port_full' | 'http_port_idle';

/** What a handler knows of the request. */
export interface HttpRequestInfo {
  path: string;
  query: URLSearchParams;
  /** The peer's address is this host's loopback (127.0.0.0/8, ::1): the caller is on this host. */
  fromLoopback: boolean;
}

export interface HttpListenerOptions {
  host: string;
  port: number;
  /** Which port in logs ("health", "admin"). */
  name: string;
  log: Logger;
  limits?: HttpPortLimits;
  /** Called for each connection the limits close. */
  onRefusal?: (reason: HttpPortRefusal) => void;
}

/** Each peer address may hold this share of the cap, so no single peer fills a port the kubelet probes. */
function perPeerCap(max: number): number {
  return Math.max(1, Math.floor(max / 4));
}

/** `handle` gets GET and HEAD requests only. */
export async function startHttpListener(
  opts: HttpListenerOptions,
  handle: (req: HttpRequestInfo, res: ServerResponse) => void,
): Promise<HttpListener> {
  const limits = opts.limits ?? DEFAULT_HTTP_PORT_LIMITS;
  const server = http.createServer(
    {
      // Node checks headersTimeout and requestTimeout on this interval (30 s by default).
      connectionsCheckingInterval: Math.min(1000, limits.idleTimeoutMs),
      headersTimeout: limits.idleTimeoutMs,
      requestTimeout: limits.idleTimeoutMs,
      keepAliveTimeout: Math.min(5000, limits.idleTimeoutMs),
    },
    (req, res) => {
      // Between a request and the end of its answer the connection is busy: going idle then is a reader that stopped.
      busy.add(req.socket);
      res.once('close', () => busy.delete(req.socket));
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res.writeHead(405, { allow: 'GET, HEAD' }).end();
        return;
      }
      // Split by hand: the target is the peer's, and URL() throws on some of them.
      const target = req.url ?? '/';
      const q = target.indexOf('?');
      handle(
        {
          path: q < 0 ? target : target.slice(0, q),
          query: new URLSearchParams(q < 0 ? '' : target.slice(q + 1)),
          fromLoopback: isLoopbackHost(req.socket.remoteAddress ?? ''),
        },
        res,
      );
    },
  );
  /** Sockets with an answer being written; a socket answered and kept alive is not in it. */
  const busy = new WeakSet<Socket>();
  /** Sockets that sent a request: one that times out without one never sent it. */
  const served = new WeakSet<Socket>();
  server.on('request', (req: IncomingMessage) => served.add(req.socket));
  // No bytes either way for this long (a request not sent, an answer not read, a kept-alive connection unused): closed.
  server.timeout = limits.idleTimeoutMs;
  // Any host may reach this port: one line per peer and error every 10 s, with a count of the rest.
  const refusals = new RateLimitedLog(opts.log, 10_000);
  const refuse = (reason: HttpPortRefusal, peer: string, message: string): void => {
    opts.onRefusal?.(reason);
    refusals.warn(`${peer} ${reason}`, { peer, reason }, message);
  };

  // Connections per peer address; a socket counts from accept to close.
  const byPeer = new Map<string, number>();
  let open = 0;
  server.on('connection', (socket: Socket) => {
    const peer = socket.remoteAddress ?? '';
    const mine = byPeer.get(peer) ?? 0;
    if (open >= limits.maxConnections || mine >= perPeerCap(limits.maxConnections)) {
      socket.destroy();
      refuse('http_port_full', peer, `closed a connection to the ${opts.name} port: too many open (--http-max-connections)`);
      return;
    }
    open++;
    byPeer.set(peer, mine + 1);
    socket.once('close', () => {
      open--;
      const left = (byPeer.get(peer) ?? 1) - 1;
      if (left > 0) byPeer.set(peer, left);
      else byPeer.delete(peer);
    });
  });
  server.on('timeout', (socket: Socket) => {
    const peer = socket.remoteAddress ?? '';
    if (busy.has(socket))
      refuse('http_port_idle', peer, `closed a connection to the ${opts.name} port that does not read its answer (${HTTP_IDLE_TIMEOUT})`);
    else if (!served.has(socket))
      refuse('http_port_idle', peer, `closed a connection to the ${opts.name} port that sent no request (${HTTP_IDLE_TIMEOUT})`);
    socket.destroy();
  });
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    // A peer that just went away is not worth a warning; anything else is bad input.
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const peer = (socket as { remoteAddress?: string }).remoteAddress;
    if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
      opts.onRefusal?.('http_port_idle');
      refusals.warn(
        `${peer} ${err.code}`,
        { peer },
        `closed a connection to the ${opts.name} port: no request within ${HTTP_IDLE_TIMEOUT}`,
      );
      socket.destroy();
      return;
    }
    refusals.warn(`${peer} ${err.code}`, { err: err.message, code: err.code, peer }, `refused malformed request on ${opts.name} port`);
    socket.end('HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nbad request\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  opts.log.info({ address: `${opts.host}:${port}` }, `${opts.name} server listening`);
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export function sendText(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'content-type': 'text/plain' }).end(text);
}
