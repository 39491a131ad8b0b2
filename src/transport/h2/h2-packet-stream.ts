/**
 * PacketStream over one node:http2 stream, for either side of the call.
 *
 * Sending: packets go through a SendQueue (send-queue.ts: small messages
 * gathered per turn, bulk DATA held back so control packets pass it) and are
 * written while the stream is corked until the next tick, so everything sent
 * in one turn of the event loop reaches nghttp2 as one writev. send()
 * returns false once `queuedBytes` reaches `sendBufferBytes`, and 'drain' is
 * emitted when it has fallen to half of that.
 *
 * Receiving: DATA chunks go through MessageParser; every message is decoded
 * and emitted as 'packet' (or 'invalid'); after acceptDataInPieces(), a DATA
 * packet spread over several HTTP/2 frames is emitted as one DATA packet per
 * piece instead of being copied together first. Oversized or compressed messages end
 * the stream with RESOURCE_EXHAUSTED / INTERNAL.
 *
 * Ending: the server side ends with trailers (grpc-status, grpc-message); the
 * client side half-closes and learns the status from the trailers.
 */
import { EventEmitter } from 'node:events';
import { constants as h2c, type Http2Session, type Http2Stream, type IncomingHttpHeaders } from 'node:http2';
import { PacketType, type Packet } from '../../wire/packet.js';
import type { MetadataMap } from '../../wire/metadata.js';
import type { PacketStream } from '../packet-stream.js';
import { decodeOrExplain, isInvalid } from '../decoded.js';
import { GrpcStatus, GrpcStatusError } from '../grpc-status.js';
import { MessageParser } from './framing.js';
import { SendQueue } from './send-queue.js';
import { StateMachine, type Lifecycle, type Moves } from '../../common/state-machine.js';
import { decodeGrpcMessage, encodeGrpcMessage, grpcStatusFromRstCode, parseGrpcStatus } from './grpc-headers.js';

export type StreamRole = 'client' | 'server';

export interface H2PacketStreamOptions {
  role: StreamRole;
  metadata: MetadataMap;
  peer: string;
  maxReceiveMessageBytes: number;
  /** send() returns false once this many bytes wait in the stream's write buffer. */
  sendBufferBytes: number;
}

export const DEFAULT_SEND_BUFFER_BYTES = 1024 * 1024;

interface Status {
  readonly code: GrpcStatus;
  readonly message: string;
}

/**
 * Where the call is, as this side sees it. The allowed transitions are
 * CALL's; transition() refuses any other (a late event, ignored).
 *
 * - open: packets flow both ways.
 * - half-closed (client): end() sent END_STREAM; the status is awaited.
 * - sending-status (server): END_STREAM follows the queued packets, then the
 *   trailers carry `status` ('wantTrailers').
 * - status-sent (server): the trailers are out; the call is complete.
 * - status-received (client): the trailers arrived; packets received before
 *   them are still being emitted, then 'close' carries `error`.
 * - reset: this side sent RST_STREAM; 'close' follows.
 * - closed: 'close' was emitted; nothing more is sent or emitted.
 */
type CallState =
  | { readonly kind: 'open' }
  | { readonly kind: 'half-closed' }
  | { readonly kind: 'sending-status'; readonly status: Status }
  | { readonly kind: 'status-sent'; readonly status: Status }
  | { readonly kind: 'status-received'; readonly error: GrpcStatusError | undefined }
  | { readonly kind: 'reset' }
  | { readonly kind: 'closed' };

const NEXT_STATES: Moves<CallState> = {
  open: ['half-closed', 'sending-status', 'status-received', 'reset', 'closed'],
  'half-closed': ['status-received', 'reset', 'closed'],
  'sending-status': ['status-sent', 'reset', 'closed'],
  'status-sent': ['reset', 'closed'],
  'status-received': ['reset', 'closed'],
  reset: ['closed'],
  closed: [],
};
const CALL: Lifecycle<CallState> = { name: 'call', moves: NEXT_STATES };

/** Trailers for a server-side status. */
export function statusTrailers(code: GrpcStatus, message: string): Record<string, string> {
  const t: Record<string, string> = { 'grpc-status': String(code) };
  if (message !== '') t['grpc-message'] = encodeGrpcMessage(message);
  return t;
}

/** Reads grpc-status / grpc-message from trailers (or a Trailers-Only response). */
export function statusFromTrailers(headers: IncomingHttpHeaders): GrpcStatusError | undefined {
  const code = parseGrpcStatus(headers['grpc-status']);
  const raw = headers['grpc-message'];
  const message = typeof raw === 'string' ? decodeGrpcMessage(raw) : '';
  if (code === undefined) return new GrpcStatusError(GrpcStatus.UNKNOWN, 'stream ended without a valid grpc-status');
  if (code === GrpcStatus.OK) return undefined;
  return new GrpcStatusError(code, message);
}

/** How long a client may keep its half open after the status was sent. */
const RELEASE_AFTER_STATUS_MS = 2000;

/**
 * The call is over once the status is out. Clients answer the status by
 * closing their half (END_STREAM or RST_STREAM); one that does not is reset
 * with NO_ERROR (RFC 7540 §8.1) a little later — not at once: nghttp2 drops
 * HEADERS still queued for a stream once an RST_STREAM is submitted for it.
 */
export function releaseAfterStatus(h2: Http2Stream): void {
  h2.resume(); // discard whatever the client still sends
  if (h2.closed || h2.destroyed) return;
  const timer = setTimeout(() => {
    if (!h2.closed && !h2.destroyed) h2.close(h2c.NGHTTP2_NO_ERROR);
  }, RELEASE_AFTER_STATUS_MS);
  timer.unref();
  h2.once('close', () => clearTimeout(timer));
}

export class H2PacketStream extends EventEmitter implements PacketStream {
  readonly metadata: MetadataMap;
  readonly peer: string;
  private readonly role: StreamRole;
  /** The stream's session, kept: the stream forgets it once closed. */
  private readonly session: Http2Session | undefined;
  private readonly parser: MessageParser;
  private readonly sendQueue: SendQueue;
  /** send() returns false from `highWater` queued bytes on; 'drain' follows once they are down to `lowWater`. */
  private readonly highWater: number;
  private readonly lowWater: number;
  /** Where the call is; changed only by transition(). */
  private readonly state = new StateMachine<CallState>({ kind: 'open' }, CALL);
  /** send() returned false and 'drain' has not been emitted since. */
  private wantDrain = false;
  /** The stream is corked from this turn's first send until `uncork` runs on the next tick. */
  private corked = false;
  /** 'data' is listened to: from the first 'packet'/'invalid' listener on, or from the next turn. */
  private reading = false;
  /** The listener takes a DATA packet in pieces (acceptDataInPieces). */
  private dataInPieces = false;
  /** Why the session was destroyed, when it was destroyed with a gRPC status (liveness.ts). */
  private sessionStatus: GrpcStatusError | undefined;
  /** The socket error that ended the connection, if any (ECONNRESET, ETIMEDOUT…). */
  private sessionError: NodeJS.ErrnoException | undefined;

  constructor(
    private readonly h2: Http2Stream,
    opts: H2PacketStreamOptions,
  ) {
    super();
    this.role = opts.role;
    this.metadata = opts.metadata;
    this.peer = opts.peer;
    this.parser = new MessageParser(opts.maxReceiveMessageBytes);
    this.sendQueue = new SendQueue(h2, this.onWritten);
    this.highWater = opts.sendBufferBytes;
    this.lowWater = Math.floor(opts.sendBufferBytes / 2);
    this.session = h2.session;

    // Reported through 'close'; a status the session was destroyed with (a PING timeout) is kept for it,
    // and a socket's error (a reset) names what happened to a connection that is gone.
    h2.on('error', (err: Error) => {
      if (err instanceof GrpcStatusError) this.sessionStatus ??= err;
      else this.sessionError ??= err;
    });
    h2.session?.once('error', (err: Error) => {
      if (!(err instanceof GrpcStatusError)) this.sessionError ??= err;
    });
    // Reading starts when the first 'packet'/'invalid' listener is attached
    // (or on the next turn of the event loop): packets that arrived with the
    // response headers must not be emitted before the caller of an awaited
    // openStream() had a chance to listen.
    this.on('newListener', this.onNewListener);
    setImmediate(this.startReading);
    h2.on('drain', this.onWritten);
    h2.on('end', this.onEnd);
    h2.on('close', this.onH2Close);
    if (this.role === 'client') h2.on('trailers', this.onTrailers);
  }

  get closed(): boolean {
    return this.state.kind === 'closed';
  }

  /** Moves to `to` if NEXT_STATES allows it from where the call is; false (and no change) otherwise. */
  private transition(to: CallState): boolean {
    return this.state.toIfAllowed(to);
  }

  // ---------- sending ----------

  send(packet: Packet): boolean {
    if (this.state.kind !== 'open') return true; // dropped: 'close' tells the caller
    if (!this.corked) {
      this.corked = true;
      this.h2.cork();
      process.nextTick(this.uncork);
    }
    this.sendQueue.push(packet);
    if (this.sendQueue.queuedBytes >= this.highWater) {
      this.wantDrain = true;
      return false;
    }
    return true;
  }

  get queuedBytes(): number {
    return this.sendQueue.queuedBytes;
  }

  private readonly uncork = (): void => {
    this.corked = false;
    this.sendQueue.flush();
    this.h2.uncork();
  };

  private readonly onWritten = (): void => {
    this.sendQueue.pump();
    if (this.wantDrain && this.sendQueue.queuedBytes <= this.lowWater) {
      this.wantDrain = false;
      if (!this.closed) this.emit('drain');
    }
  };

  end(): void {
    if (this.state.kind !== 'open') return;
    this.sendQueue.flushAll();
    if (this.role === 'client') {
      this.transition({ kind: 'half-closed' });
      this.h2.end();
    } else {
      this.endWithStatus({ code: GrpcStatus.OK, message: '' });
    }
  }

  destroy(error?: Error): void {
    if (this.closed) return;
    if (error instanceof GrpcStatusError) this.stop({ code: error.code, message: error.message });
    else
      this.stop({
        code: this.role === 'server' ? GrpcStatus.UNAVAILABLE : GrpcStatus.CANCELLED,
        message: error?.message ?? 'stream destroyed',
      });
    this.finish(error);
  }

  /**
   * Ends the call with a non-OK status because of something this side
   * detected (deadline, oversized message, …); 'close' carries the status.
   */
  abort(code: GrpcStatus, message: string): void {
    if (this.closed) return;
    this.stop({ code, message });
    this.finish(new GrpcStatusError(code, message));
  }

  /** Server: trailers with the status if nothing is queued; otherwise (and on the client) RST_STREAM. */
  private stop(status: Status): void {
    const h2 = this.h2;
    // What was not written yet is dropped with the rest of the queue.
    this.sendQueue.clear();
    if (h2.destroyed || h2.closed) return;
    if (this.role === 'server' && this.state.kind === 'open' && h2.writableLength === 0) {
      this.endWithStatus(status);
    } else {
      this.transition({ kind: 'reset' });
      h2.close(h2c.NGHTTP2_CANCEL);
    }
  }

  /** Server: ends the response with trailers carrying `status` once queued packets are written. */
  private endWithStatus(status: Status): void {
    const h2 = this.h2;
    this.transition({ kind: 'sending-status', status });
    // The status goes out even if 'close' was emitted meanwhile (destroy() sends it, then closes).
    h2.once('wantTrailers', () => {
      h2.sendTrailers(statusTrailers(status.code, status.message));
      this.transition({ kind: 'status-sent', status });
      releaseAfterStatus(h2);
    });
    h2.end();
  }

  // ---------- receiving ----------

  private readonly onNewListener = (event: string | symbol): void => {
    if (event === 'packet' || event === 'invalid') this.startReading();
  };

  private readonly startReading = (): void => {
    if (this.reading) return;
    this.reading = true;
    this.off('newListener', this.onNewListener);
    const paused = this.h2.isPaused();
    this.h2.on('data', this.onData);
    if (paused) this.h2.pause();
  };

  /**
   * Stops reading (not part of PacketStream): incoming DATA stays in the
   * stream's receive window, so the peer is flow-controlled.
   */
  pause(): void {
    this.h2.pause();
  }

  resume(): void {
    this.startReading();
    this.h2.resume();
  }

  private readonly onMessage = (message: Uint8Array): boolean => {
    const d = decodeOrExplain(message);
    if (isInvalid(d)) this.emit('invalid', d.invalid);
    else this.emit('packet', d);
    return !this.closed;
  };

  acceptDataInPieces(): void {
    this.dataInPieces = true;
  }

  limitReceiveWindow(bytes: number): void {
    const session = this.session;
    if (!session || session.destroyed || session.closed) return;
    if ((session.localSettings.initialWindowSize ?? Number.POSITIVE_INFINITY) <= bytes) return;
    try {
      session.settings({ initialWindowSize: bytes });
    } catch {
      // the session is going away
    }
  }

  /** A piece of a DATA packet's payload: emitted as a DATA packet of its own. */
  private readonly onDataSlice = (connectID: number, data: Buffer): boolean => {
    const packet: Packet = { type: PacketType.DATA, connectID, error: '', data };
    this.emit('packet', packet);
    return !this.closed;
  };

  private readonly onData = (chunk: Buffer): void => {
    if (this.closed) return;
    const err = this.parser.push(chunk, this.onMessage, this.dataInPieces ? this.onDataSlice : undefined);
    if (err !== null) this.abort(err.code, err.message);
  };

  private readonly onEnd = (): void => {
    if (this.closed) return;
    if (this.parser.midMessage) {
      // A connection lost under a message (reset, keepalive timeout) also ends the stream here: that is a loss, not the peer's fault.
      if (this.h2.aborted || this.session === undefined || this.session.destroyed) {
        this.finish(
          this.sessionStatus ??
            new GrpcStatusError(GrpcStatus.UNAVAILABLE, this.connectionLost('connection lost in the middle of a message')),
        );
        return;
      }
      this.abort(GrpcStatus.INTERNAL, 'stream ended in the middle of a message');
      return;
    }
    const state = this.state.state;
    if (this.role === 'server') {
      // The client half-closed: answer with OK, which ends the call. 'close'
      // follows when the stream is gone — a client that cancels sends
      // END_STREAM and then RST_STREAM(CANCEL), and must be seen as cancelled.
      this.end();
    } else if (state.kind === 'status-received') {
      // Client: every packet sent before the trailers has been emitted; now the status.
      this.finish(state.error);
    }
  };

  /** Client: the status from the trailers, delivered once every packet before it was. */
  private readonly onTrailers = (headers: IncomingHttpHeaders): void => {
    if (this.closed) return;
    const error = statusFromTrailers(headers);
    this.transition({ kind: 'status-received', error });
    // The server is done; stop our half too (grpc-go sends RST_STREAM NO_ERROR).
    if (!this.h2.writableEnded) this.h2.close(h2c.NGHTTP2_NO_ERROR);
    // Messages still buffered in the readable side come first: 'end' (or
    // 'close') delivers the status after them.
    if (this.h2.readableEnded) this.finish(error);
  };

  private readonly onH2Close = (): void => {
    if (this.closed) return;
    const h2 = this.h2;
    const rst = h2.rstCode;
    const state = this.state.state;
    const connectionGone = this.session === undefined || this.session.destroyed;
    if (state.kind === 'status-received') {
      this.finish(state.error);
    } else if (state.kind === 'status-sent' && (rst === undefined || rst === h2c.NGHTTP2_NO_ERROR)) {
      // The status went out; the call is complete whatever happens to the connection now.
      const status = state.status;
      this.finish(status.code !== GrpcStatus.OK ? new GrpcStatusError(status.code, status.message) : undefined);
    } else if (connectionGone) {
      this.finish(this.sessionStatus ?? new GrpcStatusError(GrpcStatus.UNAVAILABLE, this.connectionLost('connection closed')));
    } else if (this.role === 'server') {
      this.finish(new GrpcStatusError(GrpcStatus.CANCELLED, `stream reset by the client (code ${rst})`));
    } else if (rst !== undefined && rst !== h2c.NGHTTP2_NO_ERROR) {
      this.finish(new GrpcStatusError(grpcStatusFromRstCode(rst), `stream reset by the server (code ${rst})`));
    } else {
      this.finish(new GrpcStatusError(GrpcStatus.INTERNAL, 'stream closed without a grpc-status'));
    }
  };

  /** What happened to a connection that is gone: `what`, with the socket's error when there was one (a reset). */
  private connectionLost(what: string): string {
    const e = this.sessionError;
    if (e) return `${what}: ${e.code === 'ECONNRESET' ? 'reset by the peer or the path' : e.message}`;
    return this.session?.socket?.readableEnded ? `${what} by the peer` : what;
  }

  /** Emits 'close' once. */
  finish(error: Error | undefined): void {
    if (!this.transition({ kind: 'closed' })) return;
    this.emit('close', error);
  }
}
