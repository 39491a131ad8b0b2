/**
 * HTTP CONNECT frontend: "CONNECT host:port HTTP/1.1" from the KAS becomes a
 * dial through an agent; answers use upstream's status codes. Requests in
 * absolute form go to the forward proxy (forward-proxy.ts) on the same
 * connection. Every client is admitted and dialled for by the tenant's
 * FrontendClients, with the token of its Proxy-Authorization.
 *
 * Connections are accepted (and sniffed, and TLS-terminated) by
 * listeners.ts, which hands every connection not claimed by an earlier
 * front door (frontend-registry.ts) to this door: its tenant's
 * HttpConnectFrontend reads the head, and a request that is not HTTP/1.x
 * gets its 400 there (RFC 9112 section 3). The request head is read by
 * request-head.ts, bounded in size (16 KiB) and in time by the header
 * deadline (docs/frontends.md). node:http is not used: its per-connection state
 * cost more than the rest of the frontend's work per dial (bench/notes/dial-profile.md finding 3).
 */
import { http } from '../../common/node-http.js';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { pino } from 'pino';
import { parseHostPort, formatHostPort } from '../../common/host-port.js';
import { truncateForLog } from '../../common/log-safety.js';
import { DialError, HTTP_STATUS_FOR_FAILURE } from '../../tunnel/errors.js';
import { Cancel } from '../../common/cancel.js';
import type { Refusals } from '../../domain/refusal-log.js';
import { RequestHeadParser, type HeadVerdict, type RequestHead } from './request-head.js';
import { ClientRefused, type FrontendClients } from '../clients/frontend-client.js';
import { dropDialed, joinDialed } from '../clients/dialed.js';
import { DEFAULT_FORWARD_LIMITS, ForwardSession, refusedAnswer, type ForwardDoor, type ForwardLimits } from './forward-proxy.js';
import { ForwardPool, DEFAULT_FORWARD_POOL_LIMITS, type ForwardPoolLimits } from './forward-pool.js';
import { proxyToken } from './proxy-authorization.js';
import { errorMessage } from '../../common/error-message.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import type { Frontend, FrontendContext, TenantFrontend } from './frontend.js';
import { watchDeparture } from './departure-watch.js';

export interface HttpConnectLimits {
  /** Largest request head (request line and headers), bytes. */
  maxHeaderBytes: number;
  /** Bytes a client may send after its CONNECT before the dial is answered; reading pauses beyond. */
  maxEarlyBytes: number;
  /** How long an answer may take to reach a client that does not read, before the connection is cut. */
  lingerMs: number;
  /** The forward proxy's (absolute-form requests, forward-proxy.ts). */
  forward: ForwardLimits;
  pool: ForwardPoolLimits;
}

export const DEFAULT_HTTP_CONNECT_LIMITS: HttpConnectLimits = {
  maxHeaderBytes: 16 * 1024,
  maxEarlyBytes: 64 * 1024,
  lingerMs: 5_000,
  forward: DEFAULT_FORWARD_LIMITS,
  pool: DEFAULT_FORWARD_POOL_LIMITS,
};

/** One frontend connection until its request head is answered. */
class Client {
  /** Cleared once the request head is complete, or the connection answered or closed. */
  headerTimer: NodeJS.Timeout | undefined;
  /** Set once a final answer is on its way: nothing else happens on the connection. */
  answered = false;
  private readonly parser: RequestHeadParser;

  constructor(
    private readonly frontend: HttpConnectFrontend,
    readonly socket: Duplex,
    readonly peer: string,
    /** Who the client is (the audit log). */
    readonly identity: ClientIdentity,
    maxHeadBytes: number,
  ) {
    this.parser = new RequestHeadParser(maxHeadBytes);
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', this.onError);
    socket.on('close', this.onClose);
  }

  /** The head is decided (or the connection gone): the parser's listeners go, the deadline no longer applies. */
  stopReading(): void {
    clearTimeout(this.headerTimer);
    this.headerTimer = undefined;
    this.socket.off('data', this.onData);
    this.socket.off('end', this.onEnd);
    this.socket.off('error', this.onError);
    this.socket.off('close', this.onClose);
  }

  private readonly onData = (chunk: Buffer): void => this.frontend.decided(this, this.parser.push(chunk));
  private readonly onEnd = (): void => this.frontend.decided(this, this.parser.end());
  /** The connection failed (a reset): nothing to answer. */
  private readonly onError = (): void => {
    this.stopReading();
    this.socket.destroy();
  };
  private readonly onClose = (): void => this.stopReading();
}

/** The one response a CONNECT gets before its connection closes (any but 200). */
interface Answer {
  status: number;
  /** The plain-text body. */
  message: string;
  /** Extra header lines, each ending in CRLF. */
  headers?: string;
}

/** The HTTP CONNECT front door: every connection an earlier door did not claim, served by its tenant's part. */
export const httpConnectFrontend: Frontend<'http-connect'> = {
  name: 'http-connect',
  recognises: () => 'yes',
  forTenant: ({ clients, refusals, log }) => new HttpConnectFrontend(clients, refusals, {}, log),
  serve(socket, context) {
    const tenant = context.server.tenantFrontend(context.connection.tenant, httpConnectFrontend.name);
    if (!tenant) {
      socket.destroy();
      return;
    }
    tenant.serve(socket, context);
    socket.resume();
  },
};

/** One tenant's part of the HTTP CONNECT door, and of the forward proxy (forward-proxy.ts) that shares it. */
export class HttpConnectFrontend implements TenantFrontend {
  private readonly limits: HttpConnectLimits;
  /** Idle connections to destinations of the forward proxy's clients. */
  readonly pool: ForwardPool;
  private readonly forward: ForwardDoor;

  constructor(
    private readonly clients: FrontendClients,
    private readonly refusals: Refusals,
    limits: Partial<HttpConnectLimits> = {},
    log: Logger = pino({ enabled: false }),
  ) {
    this.limits = { ...DEFAULT_HTTP_CONNECT_LIMITS, ...limits };
    this.pool = new ForwardPool(this.limits.pool);
    this.forward = {
      clients,
      refusals,
      pool: this.pool,
      limits: { ...this.limits.forward, maxHeaderBytes: this.limits.maxHeaderBytes },
      log,
      answer: (socket, status, message, headers) => this.answer(socket, { answered: false }, { status, message, headers }),
      connect: (socket, peer, identity, head) => this.connect({ socket, peer, identity, answered: false }, head),
    };
  }

  /** Closes the forward proxy's idle connections (the tenant stops). */
  close(): void {
    this.pool.close();
  }

  /** Connections handed to serve() and not yet closed (every socket emits 'close' once). */
  private open = 0;

  /** Connections served now (upstream's http_connections). */
  get size(): number {
    return this.open;
  }

  /** Serves one connection whose request head must be complete within `headDeadlineMs` (counted by the listener from accept). */
  serve(socket: Duplex, { peer, connection, headDeadlineMs }: Pick<FrontendContext, 'peer' | 'connection' | 'headDeadlineMs'>): void {
    this.open++;
    socket.once('close', () => this.open--);
    const client = new Client(this, socket, peer, connection.client, this.limits.maxHeaderBytes);
    client.headerTimer = setTimeout(
      () => {
        client.headerTimer = undefined;
        this.refusals.refuse({
          reason: 'frontend_header_timeout',
          peer,
          fields: {},
          message: 'closed frontend connection: request head not complete in time',
        });
        client.stopReading();
        this.answer(socket, client, { status: 408, message: 'request head not complete in time' });
      },
      Math.max(0, headDeadlineMs),
    );
  }

  /** Acts on the parser's verdict on `client`'s head. */
  decided(client: Client, verdict: HeadVerdict): void {
    if (verdict.kind === 'more') return;
    client.stopReading();
    const { peer, socket } = client;
    if (verdict.kind === 'bad') {
      this.refusals.refuse({
        reason: 'frontend_bad_request',
        peer,
        fields: { err: verdict.reason, code: verdict.code },
        message: 'refused malformed HTTP request on frontend',
        detail: verdict.code,
      });
      this.answer(socket, client, { status: verdict.status, message: `bad request: ${verdict.code}: ${verdict.reason}` });
    } else if (verdict.method !== 'CONNECT' && verdict.form !== 'absolute') {
      this.refusals.refuse({
        reason: 'frontend_method',
        peer,
        fields: { method: verdict.method, url: truncateForLog(verdict.target, 256) },
        message: 'refused non-CONNECT request',
      });
      this.answer(socket, client, {
        status: 405,
        message: `method ${truncateForLog(verdict.method, 32)} not allowed for a ${verdict.form}-form target: this is a proxy; send CONNECT host:port, or an absolute-form request (GET http://host:port/path)`,
        headers: 'Allow: CONNECT\r\n',
      });
    } else if (verdict.method !== 'CONNECT') {
      new ForwardSession(this.forward, socket, peer, client.identity).start(verdict);
    } else {
      this.connect(client, verdict);
    }
  }

  /** A CONNECT: admitted, dialled for its client, then joined byte for byte (docs/frontends.md). */
  private connect(client: Pick<Client, 'socket' | 'peer' | 'identity' | 'answered'>, request: RequestHead): void {
    const { peer, socket } = client;
    const authority = request.target;
    const head = request.rest;
    let address: string;
    try {
      address = formatHostPort(parseHostPort(authority));
    } catch (err) {
      this.refusals.refuse({
        reason: 'frontend_bad_authority',
        peer,
        fields: { authority, err: errorMessage(err) },
        message: 'refused CONNECT: malformed authority',
      });
      this.answer(socket, client, { status: 400, message: `bad CONNECT authority: ${errorMessage(err)}` });
      return;
    }
    const early = new EarlyBytes(socket, head, this.limits.maxEarlyBytes);
    const presented = proxyToken(request.headers);
    this.clients
      .admit({ identity: client.identity, token: presented.token, door: httpConnectFrontend.name }, early.gone)
      .then((admitted) => this.clients.dial(admitted, address, early.gone))
      .then(
        (dialed) => {
          if (early.gone.aborted || socket.destroyed) {
            dropDialed(dialed, new Error('client went away before its 200'));
            return;
          }
          const pending = early.release();
          // The status line goes out before the first byte of the tunnel: a backend that speaks first must not overtake it.
          socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
          if (dialed.via === 'tunnel') {
            if (pending.length > 0) dialed.conn.send(pending);
            // A FIN that came meanwhile is passed on by the splice, after these bytes.
            joinDialed(socket, dialed);
            return;
          }
          if (pending.length > 0) dialed.socket.write(pending);
          const ended = socket.readableEnded;
          joinDialed(socket, dialed);
          // A pipe passes on no FIN that came before it.
          if (ended) dialed.socket.end();
        },
        (err: Error) => {
          early.release();
          if (early.gone.aborted || socket.destroyed) {
            socket.destroy();
            return;
          }
          if (err instanceof ClientRefused) {
            const { status, headers } = refusedAnswer(err);
            const hint = presented.problem ? ` (${presented.problem})` : '';
            this.answer(socket, client, { status, message: `${err.message}${hint}`, headers });
            return;
          }
          const status = err instanceof DialError ? HTTP_STATUS_FOR_FAILURE[err.failure] : 502;
          this.answer(socket, client, { status, message: err.message });
        },
      );
  }

  /**
   * Writes a complete answer and closes: reads (and drops) what the client
   * still sends so closing does not reset the answer away, and cuts the
   * connection after lingerMs whatever the client does. `headers` are
   * extra header lines, each ending in CRLF.
   */
  private answer(socket: Duplex, client: Pick<Client, 'answered'>, { status, message, headers = '' }: Answer): void {
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
      `HTTP/1.1 ${status} ${reason}\r\n${headers}Content-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
    socket.resume();
  }
}

/**
 * A CONNECT client while its dial is pending: what it sends early is kept
 * (bounded) for the tunnel. Its FIN is a half-close (`printf … | socat`,
 * `nc -N`): the dial goes on, and the FIN follows the early bytes once the
 * dial is answered. A client that really went (a reset, an error, a close)
 * aborts `gone`, which cancels the dial (DIAL_CLS) at once; a half-closed
 * one is watched until it turns out gone (departure-watch.ts).
 */
class EarlyBytes {
  readonly gone = new Cancel();
  private chunks: Buffer[];
  private bytes: number;
  /** After the client's FIN: stops looking for its departure (departure-watch.ts). */
  private stopWatch: () => void = () => undefined;

  constructor(
    private readonly socket: Duplex,
    head: Buffer,
    private readonly max: number,
  ) {
    this.chunks = head.length > 0 ? [head] : [];
    this.bytes = head.length;
    socket.on('data', this.onData);
    socket.once('end', this.onEnd);
    socket.once('close', this.onGone);
    socket.on('error', this.onGone);
    if (this.bytes >= max) socket.pause();
    else socket.resume();
  }

  /** Stops watching and returns what the client sent; the socket is left paused for its next owner. */
  release(): Buffer {
    this.stopWatch();
    this.socket.off('data', this.onData);
    this.socket.off('end', this.onEnd);
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

  private readonly onEnd = (): void => {
    this.stopWatch = watchDeparture(this.socket, this.onGone);
  };

  private readonly onGone = (): void => {
    this.stopWatch();
    if (this.gone.aborted) return;
    this.gone.abort();
    this.socket.destroy();
  };
}
