/**
 * The HTTP forward proxy of the http-connect door (docs/frontends.md):
 * requests in absolute form (`GET http://host:port/path HTTP/1.1`, RFC 9112
 * section 3.2.2, what Prometheus and Go's net/http send a proxy for an
 * http:// URL) are sent on as HTTP/1.1 to their destination, dialled for the
 * admitted client (FrontendClients), and the answer comes back. Both sides
 * keep their connections: the client's serves request after request, and
 * connections to destinations wait in a pool (forward-pool.ts) for the same
 * client's next request there.
 *
 * One request at a time per client connection: what a client pipelines is
 * held (the socket paused) until the answer before it is complete, so a
 * request after a refused one reaches no destination (the connection closes
 * with the refusal). Framing is the proxy's own on both sides
 * (http-framing.ts, body-framing.ts); hop-by-hop fields go (hop-by-hop.ts).
 * A destination that fails mid-answer cuts the client's connection: a half
 * answer must not be taken for a whole one, nor followed by another.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { Refusals } from '../../domain/refusal-log.js';
import { errorMessage } from '../../common/error-message.js';
import { truncateForLog } from '../../common/log-safety.js';
import { DialError, HTTP_STATUS_FOR_FAILURE } from '../../tunnel/errors.js';
import { ConnectionStream } from '../../tunnel/connection-stream.js';
import { ClientRefused, type Dialed, type FrontendClient, type FrontendClients } from '../clients/frontend-client.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { RequestHeadParser, type HeadVerdict, type RequestHead } from './request-head.js';
import { ResponseHeadParser, type ResponseHead } from './response-head.js';
import { BodyReader, chunkHeader, LAST_CHUNK, type BodyFraming } from './http-framing.js';
import { requestFraming, responseFraming } from './body-framing.js';
import { endToEnd, formatHeaders, VIA, wantsClose } from './hop-by-hop.js';
import { proxyToken } from './proxy-authorization.js';
import { forwardTarget, type ForwardTarget } from './absolute-uri.js';
import { ForwardPool } from './forward-pool.js';

export interface ForwardLimits {
  /** Largest request head and response head, bytes. */
  maxHeaderBytes: number;
  /** From the request's head sent to the response's head complete. */
  responseHeadTimeoutMs: number;
  /** How long a client's connection may wait for its next request head. */
  clientIdleMs: number;
}

export const DEFAULT_FORWARD_LIMITS: ForwardLimits = {
  maxHeaderBytes: 16 * 1024,
  responseHeadTimeoutMs: 60_000,
  clientIdleMs: 60_000,
};

/** Extra header lines of a final answer, each ending in CRLF. */
export type AnswerHeaders = string;

/** What a forward session needs of its door. */
export interface ForwardDoor {
  readonly clients: FrontendClients;
  readonly refusals: Refusals;
  readonly pool: ForwardPool;
  readonly limits: ForwardLimits;
  readonly log: Logger;
  /** The door's final answer: written, then the connection closes (bounded linger). */
  answer(socket: Duplex, status: number, message: string, headers?: AnswerHeaders): void;
  /** A CONNECT on a connection the forward proxy served: the CONNECT path takes the socket over. */
  connect(socket: Duplex, peer: string, identity: ClientIdentity, head: RequestHead): void;
}

/** The realm named in a 407 (RFC 9110 section 11.7.1). */
export const PROXY_AUTHENTICATE = 'Proxy-Authenticate: Bearer realm="kanal"\r\n';

/** The answer a client gets when admission refuses it. */
export function refusedAnswer(err: ClientRefused): { status: number; headers: AnswerHeaders } {
  return err.status === 407 ? { status: 407, headers: PROXY_AUTHENTICATE } : { status: 403, headers: '' };
}

/** A stream over what a dial gave: the tunnelled connection as a Duplex, or the direct socket. */
export function dialedStream(dialed: Dialed): Duplex {
  return dialed.via === 'tunnel' ? new ConnectionStream(dialed.conn) : dialed.socket;
}

/** Methods a stale pooled connection's failure may be retried for (RFC 9110 section 9.2.2: idempotent, and without a body here). */
const RETRYABLE = new Set(['GET', 'HEAD', 'OPTIONS']);

/** One request and its answer in flight. */
interface Exchange {
  readonly method: string;
  readonly key: string;
  readonly upstream: Duplex;
  readonly reused: boolean;
  readonly request: Buffer;
  readonly requestBody: BodyReader;
  readonly requestChunked: boolean;
  /** The client asked for its connection to close after this answer (or is HTTP/1.0). */
  readonly clientClose: boolean;
  readonly clientVersion: 'HTTP/1.0' | 'HTTP/1.1';
  responseHead: ResponseHeadParser;
  responseBody: BodyReader | undefined;
  /** How the body goes to the client: as it came (length), re-chunked, or to the close. */
  responseOut: 'none' | 'raw' | 'chunked';
  upstreamReusable: boolean;
  clientKeeps: boolean;
  /** Bytes of the answer written to the client: after the first, a failure can only cut the connection. */
  answering: boolean;
  timer: NodeJS.Timeout | undefined;
  /** Its listeners on `upstream`, taken off when the connection goes back to the pool. */
  readonly listeners: [string, (arg: Buffer) => void][];
}

/** Where a client connection is. */
type Phase =
  /** Waiting for a request head. */
  | { readonly kind: 'head'; readonly parser: RequestHeadParser; readonly idle: NodeJS.Timeout }
  /** Admission and dial under way: the socket is paused, bytes that still came are held. */
  | { readonly kind: 'opening' }
  | { readonly kind: 'exchange'; readonly ex: Exchange }
  /** Answered for the last time, or handed to the CONNECT path, or gone. */
  | { readonly kind: 'done' };

const EMPTY = Buffer.alloc(0);

/** One client connection of the forward proxy, from its first absolute-form request on. */
export class ForwardSession {
  private phase: Phase = { kind: 'opening' };
  /** Bytes the client sent beyond the message being read (a pipelined request), held until its turn. */
  private held: Buffer = EMPTY;
  /** The last admission, kept while the client presents the same token. */
  private admitted: { token: string | undefined; client: FrontendClient } | undefined;
  private clientEnded = false;

  constructor(
    private readonly door: ForwardDoor,
    private readonly socket: Duplex,
    private readonly peer: string,
    private readonly identity: ClientIdentity,
  ) {
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', this.onError);
    socket.on('close', this.onClose);
  }

  /** The first request, read by the door. */
  start(head: RequestHead): void {
    this.socket.pause();
    void this.request(head);
  }

  // ---------- the one transition ----------

  private to(next: Phase): void {
    const prev = this.phase;
    if (prev.kind === 'head') clearTimeout(prev.idle);
    if (prev.kind === 'exchange') clearTimeout(prev.ex.timer);
    this.phase = next;
    if (next.kind === 'opening') this.socket.pause();
    if (next.kind === 'done') this.detach();
  }

  private detach(): void {
    this.socket.off('data', this.onData);
    this.socket.off('end', this.onEnd);
    this.socket.off('error', this.onError);
    this.socket.off('close', this.onClose);
  }

  // ---------- the client's bytes ----------

  private readonly onData = (chunk: Buffer): void => {
    const p = this.phase;
    if (p.kind === 'head') this.headBytes(p.parser.push(chunk));
    else if (p.kind === 'exchange' && !p.ex.requestBody.done) this.requestBytes(p.ex, chunk);
    else {
      // Pipelined: its turn comes after this answer. Reading stops here; what was in flight is kept.
      this.held = this.held.length === 0 ? chunk : Buffer.concat([this.held, chunk]);
      this.socket.pause();
    }
  };

  private readonly onEnd = (): void => {
    this.clientEnded = true;
    const p = this.phase;
    if (p.kind === 'head') {
      if (this.held.length === 0 && !p.parser.started) this.close();
      else this.headBytes(p.parser.end());
    } else if (p.kind === 'exchange' && !p.ex.requestBody.done) {
      // The request was cut short: nothing of it can be answered.
      p.ex.upstream.destroy();
      this.cut();
    }
  };

  private readonly onError = (): void => this.cut();

  private readonly onClose = (): void => {
    const p = this.phase;
    if (p.kind === 'exchange') p.ex.upstream.destroy();
    this.to({ kind: 'done' });
  };

  /** Waits for the next request head, starting with what the client pipelined. */
  private nextRequest(): void {
    const idle = setTimeout(() => this.idleTimeout(), this.door.limits.clientIdleMs);
    idle.unref();
    const parser = new RequestHeadParser(this.door.limits.maxHeaderBytes);
    this.to({ kind: 'head', parser, idle });
    const held = this.held;
    this.held = EMPTY;
    if (held.length > 0) {
      this.headBytes(parser.push(held));
      if (this.phase.kind !== 'head') return;
    }
    // A client that half-closed after pipelining gets its answers; with nothing more to read, the connection ends.
    if (this.clientEnded) {
      if (parser.started) this.headBytes(parser.end());
      else this.close();
      return;
    }
    this.socket.resume();
  }

  private idleTimeout(): void {
    const p = this.phase;
    if (p.kind !== 'head') return;
    if (!p.parser.started) {
      this.close();
      return;
    }
    this.refuse('frontend_header_timeout', 'HEADER_TIMEOUT', 'request head not complete in time');
    this.finalAnswer(408, 'request head not complete in time');
  }

  private headBytes(verdict: HeadVerdict): void {
    if (verdict.kind === 'more') return;
    if (verdict.kind === 'bad') {
      this.refuse('frontend_bad_request', verdict.code, verdict.reason);
      this.finalAnswer(verdict.status, `bad request: ${verdict.code}: ${verdict.reason}`);
      return;
    }
    this.to({ kind: 'opening' });
    if (verdict.method === 'CONNECT') {
      this.to({ kind: 'done' });
      this.door.connect(this.socket, this.peer, this.identity, verdict);
      return;
    }
    void this.request(verdict);
  }

  // ---------- one request ----------

  /** Checks `head`, admits its client, gets it a connection to the destination, and starts the exchange. */
  private async request(head: RequestHead): Promise<void> {
    const checked = this.check(head);
    if (!checked) return;
    const { target, framing } = checked;
    const presented = proxyToken(head.headers);
    let client: FrontendClient;
    try {
      client = await this.admit(presented.token);
    } catch (err) {
      if (err instanceof ClientRefused) {
        const { status, headers } = refusedAnswer(err);
        const hint = presented.problem ? ` (${presented.problem})` : '';
        this.finalAnswer(status, `${err.message}${hint}`, headers);
      } else this.finalAnswer(500, `admission failed: ${errorMessage(err)}`);
      return;
    }
    if (this.phase.kind === 'done') return;
    const key = ForwardPool.key(client.name, target.address);
    const request = this.requestBytes0(head, target, framing);
    const pooled = this.door.pool.take(key);
    if (pooled) {
      this.exchange(head, framing, key, pooled, true, request);
      return;
    }
    await this.dialAndExchange(head, framing, key, client, target, request);
  }

  private async dialAndExchange(
    head: RequestHead,
    framing: BodyFraming,
    key: string,
    client: FrontendClient,
    target: ForwardTarget,
    request: Buffer,
  ): Promise<void> {
    let upstream: Duplex;
    try {
      upstream = dialedStream(await this.door.clients.dial(client, target.address));
    } catch (err) {
      const status = err instanceof DialError ? HTTP_STATUS_FOR_FAILURE[err.failure] : 502;
      this.finalAnswer(status, `dial ${target.address}: ${errorMessage(err)}`);
      return;
    }
    if (this.phase.kind === 'done') {
      upstream.destroy();
      return;
    }
    this.exchange(head, framing, key, upstream, false, request);
  }

  private async admit(token: string | undefined): Promise<FrontendClient> {
    if (this.admitted && this.admitted.token === token) return this.admitted.client;
    const client = await this.door.clients.admit({ identity: this.identity, token, door: 'http-connect' });
    this.admitted = { token, client };
    return client;
  }

  /** The checks before anything is dialled; undefined: refused and answered. */
  private check(head: RequestHead): { target: ForwardTarget; framing: BodyFraming } | undefined {
    if (head.form !== 'absolute') {
      this.refusals().refuse({
        reason: 'frontend_method',
        peer: this.peer,
        fields: { method: head.method, url: truncateForLog(head.target, 256) },
        message: 'refused request not in absolute form',
      });
      this.finalAnswer(
        405,
        `method ${truncateForLog(head.method, 32)} not allowed for a ${head.form}-form target: this is a proxy; send CONNECT host:port, or an absolute-form request (GET http://host:port/path)`,
        'Allow: CONNECT\r\n',
      );
      return undefined;
    }
    const t = forwardTarget(head.target);
    if (!t.ok) {
      this.refuse('frontend_bad_request', 'ABSOLUTE_URI', t.reason);
      this.finalAnswer(400, `bad request: ${t.reason}`);
      return undefined;
    }
    const hosts = head.headers.filter((h) => h.name.toLowerCase() === 'host');
    // RFC 9112 section 3.2: a request with several Host lines, or an HTTP/1.1 request without one, is answered 400.
    if (hosts.length > 1 || (hosts.length === 0 && head.version === 'HTTP/1.1')) {
      const reason = hosts.length > 1 ? 'more than one Host line' : 'an HTTP/1.1 request without Host (RFC 9112 section 3.2)';
      this.refuse('frontend_bad_request', 'HOST', reason);
      this.finalAnswer(400, `bad request: ${reason}`);
      return undefined;
    }
    const framing = requestFraming(head.version, head.headers);
    if (!framing.ok) {
      this.refuse('frontend_bad_request', framing.code, framing.reason);
      this.finalAnswer(framing.status, `bad request: ${framing.reason}`);
      return undefined;
    }
    return { target: t.target, framing: framing.framing };
  }

  /**
   * The request head for the destination: origin form, Host from the URI (RFC 9112 section 3.2.2: the
   * URI's authority, not the client's Host, names the destination), the end-to-end fields, Via, and the framing.
   */
  private requestBytes0(head: RequestHead, target: ForwardTarget, framing: BodyFraming): Buffer {
    const framingLine =
      framing.kind === 'length'
        ? `Content-Length: ${framing.length}\r\n`
        : framing.kind === 'chunked'
          ? 'Transfer-Encoding: chunked\r\n'
          : '';
    return Buffer.from(
      `${head.method} ${target.path} HTTP/1.1\r\nHost: ${target.authority}\r\n${formatHeaders(endToEnd(head.headers))}${VIA}${framingLine}\r\n`,
      'latin1',
    );
  }

  private exchange(head: RequestHead, framing: BodyFraming, key: string, upstream: Duplex, reused: boolean, request: Buffer): void {
    const ex: Exchange = {
      method: head.method,
      key,
      upstream,
      reused,
      request,
      requestBody: new BodyReader(framing),
      requestChunked: framing.kind === 'chunked',
      clientClose: wantsClose(head.version, head.headers),
      clientVersion: head.version,
      responseHead: new ResponseHeadParser(this.door.limits.maxHeaderBytes),
      responseBody: undefined,
      responseOut: 'none',
      upstreamReusable: false,
      clientKeeps: false,
      answering: false,
      timer: undefined,
      listeners: [],
    };
    ex.timer = setTimeout(() => this.responseTimeout(ex), this.door.limits.responseHeadTimeoutMs);
    ex.timer.unref();
    this.to({ kind: 'exchange', ex });
    const on = (event: string, listener: (arg: Buffer) => void): void => {
      ex.listeners.push([event, listener]);
      upstream.on(event, listener);
    };
    on('data', (chunk: Buffer) => this.responseBytes(ex, chunk));
    on('end', () => this.upstreamEnded(ex));
    on('error', () => this.upstreamFailed(ex, 'the destination connection failed'));
    on('close', () => this.upstreamFailed(ex, 'the destination connection closed'));
    on('drain', () => {
      if (this.current(ex) && !ex.requestBody.done) this.socket.resume();
    });
    upstream.write(request);
    // The request body so far came with the head; the rest comes as the socket is read.
    const rest = head.rest;
    if (rest.length > 0) this.requestBytes(ex, rest);
    if (this.phase.kind !== 'exchange' || this.phase.ex !== ex) return;
    if (ex.requestBody.done) this.socket.pause();
    else if (this.clientEnded) this.onEnd();
    else this.socket.resume();
    upstream.resume();
  }

  private requestBytes(ex: Exchange, chunk: Buffer): void {
    const read = ex.requestBody.push(chunk);
    let ok = true;
    for (const p of read.payload) ok = this.sendBody(ex.upstream, p, ex.requestChunked) && ok;
    if (read.bad) {
      this.refuse('frontend_bad_request', 'HPE_INVALID_CHUNK_SIZE', read.bad);
      ex.upstream.destroy();
      if (ex.answering) this.cut();
      else this.finalAnswer(400, `bad request body: ${read.bad}`);
      return;
    }
    if (read.done) {
      if (ex.requestChunked) ex.upstream.write(LAST_CHUNK);
      if (read.rest.length > 0) this.held = Buffer.concat([this.held, read.rest]);
      this.socket.pause();
      this.maybeFinished(ex);
      return;
    }
    if (!ok) this.socket.pause();
  }

  /** Writes payload, chunked when the message is; false: the stream's buffer is full. */
  private sendBody(out: Duplex, payload: Buffer, chunked: boolean): boolean {
    if (!chunked) return out.write(payload);
    out.cork();
    out.write(chunkHeader(payload.length));
    out.write(payload);
    const ok = out.write('\r\n');
    out.uncork();
    return ok;
  }

  // ---------- the destination's bytes ----------

  private responseBytes(ex: Exchange, chunk: Buffer): void {
    if (!this.current(ex)) return;
    if (!ex.responseBody) {
      const v = ex.responseHead.push(chunk);
      if (v.kind === 'more') return;
      if (v.kind === 'bad') {
        this.badGateway(ex, v.reason);
        return;
      }
      if (!this.responseHeadDone(ex, v)) return;
      if (v.rest.length === 0) return;
      chunk = v.rest;
    }
    const body = ex.responseBody;
    if (!body) return;
    if (body.done) {
      // Bytes after a complete answer (that was not to run to the close): the destination broke the framing.
      ex.upstreamReusable = false;
      return;
    }
    const read = body.push(chunk);
    let ok = true;
    for (const p of read.payload) ok = this.sendBody(this.socket, p, ex.responseOut === 'chunked') && ok;
    if (read.bad) {
      this.door.log.warn({ peer: this.peer, err: read.bad }, 'forward proxy: the destination broke its response framing');
      this.cut();
      return;
    }
    if (read.done) {
      if (read.rest.length > 0) ex.upstreamReusable = false;
      this.responseDone(ex);
      return;
    }
    if (!ok && !ex.upstream.isPaused()) {
      ex.upstream.pause();
      this.socket.once('drain', () => ex.upstream.resume());
    }
  }

  /** false: the exchange ended (refused, or more 1xx to read). */
  private responseHeadDone(ex: Exchange, head: ResponseHead & { rest: Buffer }): boolean {
    if (head.status === 101) {
      this.badGateway(ex, 'the destination switched protocols, which this proxy did not offer (Upgrade is hop-by-hop)');
      return false;
    }
    if (head.status < 200) {
      // Interim answers (100 Continue, 103 Early Hints) go on, then the final one is read.
      ex.answering = true;
      this.socket.write(`HTTP/1.1 ${head.status} ${head.reason}\r\n${formatHeaders(endToEnd(head.headers))}\r\n`);
      ex.responseHead = new ResponseHeadParser(this.door.limits.maxHeaderBytes);
      if (head.rest.length > 0) this.responseBytes(ex, head.rest);
      return false;
    }
    const framing = responseFraming(ex.method, head.status, head.headers);
    if (!framing.ok) {
      this.badGateway(ex, framing.reason);
      return false;
    }
    clearTimeout(ex.timer);
    const f = framing.framing;
    ex.responseBody = new BodyReader(f);
    ex.upstreamReusable = f.kind !== 'close' && !wantsClose(head.version, head.headers);
    let framingLine = '';
    if (f.kind === 'length') {
      framingLine = `Content-Length: ${f.length}\r\n`;
      ex.responseOut = 'raw';
    } else if (f.kind === 'chunked' && ex.clientVersion === 'HTTP/1.1') {
      framingLine = 'Transfer-Encoding: chunked\r\n';
      ex.responseOut = 'chunked';
    } else if (f.kind === 'none') {
      // HEAD and 304 tell the size of what a GET would get (RFC 9110 sections 8.6, 15.4.5).
      const cl = head.headers.find((h) => h.name.toLowerCase() === 'content-length');
      if (cl && head.status !== 204) framingLine = `Content-Length: ${cl.value}\r\n`;
      ex.responseOut = 'none';
    } else ex.responseOut = 'raw';
    // Chunked to an HTTP/1.0 client, or a close-delimited answer: the client learns the end by the close.
    const delimitedByClose = f.kind === 'close' || (f.kind === 'chunked' && ex.clientVersion === 'HTTP/1.0');
    ex.clientKeeps = !ex.clientClose && !delimitedByClose;
    const connection = ex.clientKeeps ? '' : 'Connection: close\r\n';
    ex.answering = true;
    this.socket.write(
      Buffer.from(
        `HTTP/1.1 ${head.status} ${head.reason}\r\n${formatHeaders(endToEnd(head.headers))}${VIA}${framingLine}${connection}\r\n`,
        'latin1',
      ),
    );
    if (!ex.responseBody.done) return true;
    // Bytes after a bodiless answer are none of the next request's: the connection is not reused.
    if (head.rest.length > 0) ex.upstreamReusable = false;
    this.responseDone(ex);
    return false;
  }

  private responseDone(ex: Exchange): void {
    if (ex.responseOut === 'chunked') this.socket.write(LAST_CHUNK);
    this.maybeFinished(ex);
  }

  /** Both the request and the answer are complete: the connections go on, or close. */
  private maybeFinished(ex: Exchange): void {
    if (!this.current(ex) || !ex.responseBody?.done) return;
    if (!ex.requestBody.done) {
      // Answered before the whole request came (a 413, a 401): the rest of it cannot be told from a next request.
      ex.upstream.destroy();
      this.endClient();
      return;
    }
    for (const [event, listener] of ex.listeners) ex.upstream.off(event, listener);
    if (ex.upstreamReusable) this.door.pool.put(ex.key, ex.upstream);
    else ex.upstream.destroy();
    if (ex.clientKeeps) this.nextRequest();
    else this.endClient();
  }

  private upstreamEnded(ex: Exchange): void {
    if (!this.current(ex)) return;
    const body = ex.responseBody;
    if (body) {
      const read = body.end();
      if (read.done) {
        ex.upstreamReusable = false;
        this.responseDone(ex);
      } else this.upstreamFailed(ex, read.bad ?? 'the destination ended its answer early');
      return;
    }
    this.upstreamFailed(ex, 'the destination closed before answering');
  }

  private upstreamFailed(ex: Exchange, why: string): void {
    if (!this.current(ex)) return;
    ex.upstream.destroy();
    if (ex.answering) {
      // Part of the answer went out: only the close can tell the client it is not whole.
      this.cut();
      return;
    }
    if (ex.reused && !ex.responseHead.started && RETRYABLE.has(ex.method) && ex.requestBody.done && ex.request.length > 0) {
      // A pooled connection the destination had closed meanwhile (RFC 9112 section 9.3.1): once more on a fresh one.
      this.retry(ex);
      return;
    }
    this.badGateway(ex, why);
  }

  private retry(ex: Exchange): void {
    const admitted = this.admitted;
    if (!admitted) {
      this.badGateway(ex, 'the destination closed before answering');
      return;
    }
    const address = ex.key.slice(ex.key.indexOf('\u0000') + 1);
    this.to({ kind: 'opening' });
    this.door.clients.dial(admitted.client, address).then(
      (dialed) => {
        const upstream = dialedStream(dialed);
        if (this.phase.kind === 'done') {
          upstream.destroy();
          return;
        }
        this.exchangeAgain(ex, upstream);
      },
      (err: unknown) => {
        const status = err instanceof DialError ? HTTP_STATUS_FOR_FAILURE[err.failure] : 502;
        this.finalAnswer(status, `dial ${address}: ${errorMessage(err)}`);
      },
    );
  }

  /** The same bodiless request on a new connection. */
  private exchangeAgain(ex: Exchange, upstream: Duplex): void {
    const head: RequestHead = {
      method: ex.method,
      target: '',
      form: 'absolute',
      version: ex.clientVersion,
      headers: ex.clientClose ? [{ name: 'Connection', value: 'close' }] : [],
      rest: EMPTY,
    };
    this.exchange(head, { kind: 'none' }, ex.key, upstream, false, ex.request);
  }

  private responseTimeout(ex: Exchange): void {
    if (!this.current(ex) || ex.responseBody) return;
    ex.upstream.destroy();
    if (ex.answering) this.cut();
    else
      this.finalAnswer(504, `the destination sent no response head within ${Math.round(this.door.limits.responseHeadTimeoutMs / 1000)} s`);
  }

  private badGateway(ex: Exchange, why: string): void {
    ex.upstream.destroy();
    this.door.log.warn({ peer: this.peer, err: why }, 'forward proxy: bad answer from the destination');
    if (ex.answering) this.cut();
    else this.finalAnswer(502, `bad gateway: ${why}`);
  }

  // ---------- endings ----------

  private current(ex: Exchange): boolean {
    return this.phase.kind === 'exchange' && this.phase.ex === ex;
  }

  private refusals(): Refusals {
    return this.door.refusals;
  }

  private refuse(reason: 'frontend_bad_request' | 'frontend_header_timeout', code: string, why: string): void {
    this.door.refusals.refuse({
      reason,
      peer: this.peer,
      fields: { err: why, code },
      message: 'refused forward-proxy request',
      detail: code,
    });
  }

  /** The last answer on this connection (a refusal, a dial failure). */
  private finalAnswer(status: number, message: string, headers: AnswerHeaders = ''): void {
    const p = this.phase;
    if (p.kind === 'exchange') p.ex.upstream.destroy();
    this.to({ kind: 'done' });
    this.door.answer(this.socket, status, message, headers);
  }

  /** The answer is complete and the connection closes after it (the client asked, or its framing needs it). */
  private endClient(): void {
    this.to({ kind: 'done' });
    const s = this.socket;
    s.on('error', () => undefined);
    s.on('data', () => undefined);
    s.once('end', () => s.destroy());
    s.end();
    s.resume();
    const timer = setTimeout(() => s.destroy(), 5_000);
    timer.unref();
    s.once('close', () => clearTimeout(timer));
  }

  /** Between requests: the connection closes quietly. */
  private close(): void {
    this.endClient();
  }

  /** Ends the connection at once: what went out of an answer must not pass for all of it. */
  private cut(): void {
    const p = this.phase;
    if (p.kind === 'exchange') p.ex.upstream.destroy();
    this.to({ kind: 'done' });
    this.socket.destroy();
  }
}
