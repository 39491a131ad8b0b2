/**
 * HTTP CONNECT frontend: "CONNECT host:port HTTP/1.1" from the KAS becomes a
 * dial through an agent; answers use upstream's status codes.
 *
 * Node's http.Server only parses here: connections are accepted (and
 * sniffed, and TLS-terminated) by listeners.ts and handed in with serve().
 * Node enforces headersTimeout and requestTimeout from a timer it starts
 * when a server *listens*, so on injected sockets they never applied (#11
 * finding 7: unfinished headers kept a connection for 400 s and more); the
 * header deadline is enforced here instead.
 */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import { parseHostPort, formatHostPort } from '../common/host-port.js';
import { truncateForLog } from '../common/log-safety.js';
import { DialError, HTTP_STATUS_FOR_FAILURE } from '../tunnel/errors.js';
import { splice } from '../tunnel/splice.js';
import type { BackendDialer } from './backend-dialer.js';
import { Cancel } from '../common/cancel.js';
import type { Refusals } from './refusals.js';

export interface HttpConnectLimits {
  /** Largest request head (request line and headers), bytes. */
  maxHeaderBytes: number;
  /** Bytes a client may send after its CONNECT before the dial is answered; reading pauses beyond. */
  maxEarlyBytes: number;
  /** How long an answer may take to reach a client that does not read, before the connection is cut. */
  lingerMs: number;
}

export const DEFAULT_HTTP_CONNECT_LIMITS: HttpConnectLimits = {
  maxHeaderBytes: 16 * 1024,
  maxEarlyBytes: 64 * 1024,
  lingerMs: 5_000,
};

interface Client {
  peer: string;
  /** Cleared once the request head is complete. */
  headerTimer: NodeJS.Timeout | undefined;
  /** Set once a final answer is on its way: nothing else happens on the connection. */
  answered: boolean;
}

export class HttpConnectFrontend {
  private readonly parser: http.Server;
  private readonly limits: HttpConnectLimits;
  /** Connections served, until they close. */
  private readonly clients = new Map<Duplex, Client>();

  constructor(
    private readonly dialer: BackendDialer,
    private readonly refusals: Refusals,
    limits: Partial<HttpConnectLimits> = {},
  ) {
    this.limits = { ...DEFAULT_HTTP_CONNECT_LIMITS, ...limits };
    this.parser = http.createServer({ maxHeaderSize: this.limits.maxHeaderBytes });
    this.parser.on('request', this.onRequest);
    this.parser.on('connect', this.onConnect);
    this.parser.on('clientError', this.onClientError);
  }

  /**
   * Serves one connection whose request head must be complete within
   * `headerDeadlineMs` (counted by the caller from accept); `peer` names
   * the client in logs.
   */
  serve(socket: Duplex, peer: string, headerDeadlineMs: number): void {
    const client: Client = { peer, headerTimer: undefined, answered: false };
    client.headerTimer = setTimeout(() => {
      client.headerTimer = undefined;
      this.refusals.refuse('frontend_header_timeout', peer, {}, 'closed frontend connection: request head not complete in time');
      this.answer(socket, client, 408, 'request head not complete in time');
    }, Math.max(0, headerDeadlineMs));
    this.clients.set(socket, client);
    socket.once('close', () => {
      clearTimeout(client.headerTimer);
      this.clients.delete(socket);
    });
    this.parser.emit('connection', socket);
  }

  /**
   * The client's head is complete: its header deadline no longer applies.
   * Undefined when the connection already has its answer (a head that
   * completes after its 408, or the parser failing again on more bytes):
   * the answer's linger closes it, after the client could read the answer.
   */
  private headComplete(socket: Duplex): Client | undefined {
    const client = this.clients.get(socket);
    if (!client) {
      socket.destroy();
      return undefined;
    }
    if (client.answered) return undefined;
    clearTimeout(client.headerTimer);
    client.headerTimer = undefined;
    return client;
  }

  private readonly onRequest = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const client = this.headComplete(req.socket);
    if (!client) return;
    client.answered = true;
    this.refusals.refuse('frontend_method', client.peer, { method: req.method, url: req.url }, 'refused non-CONNECT request');
    res.writeHead(405, { allow: 'CONNECT', 'content-type': 'text/plain', connection: 'close' });
    res.end(`method ${truncateForLog(req.method ?? '', 32)} not allowed: this is an HTTP CONNECT proxy\n`);
  };

  private readonly onClientError = (err: NodeJS.ErrnoException, socket: Duplex): void => {
    const client = this.headComplete(socket);
    if (!client) return;
    // Parse errors carry an HPE_ code; anything else is the connection failing (a reset): nothing to answer.
    if (!err.code?.startsWith('HPE_')) {
      socket.destroy();
      return;
    }
    const status = err.code === 'HPE_HEADER_OVERFLOW' ? 431 : 400;
    this.refusals.refuse('frontend_bad_request', client.peer, { err: err.message, code: err.code }, 'refused malformed HTTP request on frontend', err.code);
    this.answer(socket, client, status, `bad request: ${err.code}`);
  };

  private readonly onConnect = (req: http.IncomingMessage, socket: Duplex, head: Buffer): void => {
    const client = this.headComplete(socket);
    if (!client) return;
    const { peer } = client;
    const authority = req.url ?? '';
    let address: string;
    try {
      address = formatHostPort(parseHostPort(authority));
    } catch (err) {
      this.refusals.refuse('frontend_bad_authority', peer, { authority, err: (err as Error).message }, 'refused CONNECT: malformed authority');
      this.answer(socket, client, 400, `bad CONNECT authority: ${(err as Error).message}`);
      return;
    }
    const early = new EarlyBytes(socket, head, this.limits.maxEarlyBytes);
    this.dialer.dial(address, early.gone, peer).then(
      (conn) => {
        if (early.gone.aborted || socket.destroyed) {
          conn.destroy();
          return;
        }
        const pending = early.release();
        // The status line goes out before the first byte of the tunnel (issue 12, "Also check").
        socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        if (pending.length > 0) conn.write(pending);
        splice(socket, conn);
      },
      (err: Error) => {
        early.release();
        if (early.gone.aborted || socket.destroyed) {
          socket.destroy();
          return;
        }
        const status = err instanceof DialError ? HTTP_STATUS_FOR_FAILURE[err.failure] : 502;
        this.answer(socket, client, status, err.message);
      },
    );
  };

  /**
   * Writes a complete answer and closes: reads (and drops) what the client
   * still sends so closing does not reset the answer away, and cuts the
   * connection after lingerMs whatever the client does.
   */
  private answer(socket: Duplex, client: Client, status: number, message: string): void {
    if (client.answered) return;
    client.answered = true;
    socket.on('error', () => undefined);
    if (socket.destroyed) return;
    const reason = http.STATUS_CODES[status] ?? 'Error';
    // Dial errors come from agents: bounded like any peer's text.
    const body = `${truncateForLog(message, 1024)}\n`;
    const timer = setTimeout(() => socket.destroy(), this.limits.lingerMs);
    timer.unref();
    socket.once('close', () => clearTimeout(timer));
    socket.on('data', () => undefined);
    socket.once('end', () => socket.destroy());
    socket.end(
      `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
    socket.resume();
  }
}

/**
 * A CONNECT client while its dial is pending: what it sends early is kept
 * (bounded) for the tunnel, and its going away (FIN, reset, close) aborts
 * `gone`, which cancels the dial (DIAL_CLS) at once (#11 finding 7: 1,000
 * clients that left kept 1,000 pending dials until the dial timeout).
 */
class EarlyBytes {
  readonly gone = new Cancel();
  private chunks: Buffer[];
  private bytes: number;

  constructor(
    private readonly socket: Duplex,
    head: Buffer,
    private readonly max: number,
  ) {
    this.chunks = head.length > 0 ? [head] : [];
    this.bytes = head.length;
    socket.on('data', this.onData);
    socket.once('end', this.onGone);
    socket.once('close', this.onGone);
    socket.on('error', this.onGone);
    if (this.bytes >= max) socket.pause();
    else socket.resume();
  }

  /** Stops watching and returns what the client sent; the socket is left paused for its next owner. */
  release(): Buffer {
    this.socket.off('data', this.onData);
    this.socket.off('end', this.onGone);
    this.socket.off('close', this.onGone);
    this.socket.off('error', this.onGone);
    this.socket.pause();
    const out = Buffer.concat(this.chunks);
    this.chunks = [];
    return out;
  }

  private readonly onData = (chunk: Buffer): void => {
    this.chunks.push(chunk);
    this.bytes += chunk.length;
    // A client this eager is held back; the dial timeout still bounds its wait.
    if (this.bytes >= this.max) this.socket.pause();
  };

  private readonly onGone = (): void => {
    if (this.gone.aborted) return;
    this.gone.abort();
    // Before its 200 a client has no tunnel to half-close: its FIN means it gave up.
    this.socket.destroy();
  };
}
