/**
 * gRPC server half on node:http2. Connections are accepted (and, for TCP,
 * TLS-terminated with ALPN h2) by Kanal and handed in with injectConnection;
 * bytes a protocol sniffer read and unshift()ed back are fed to the session
 * by node:http2 itself.
 */
import http2, {
  constants as h2c,
  type Http2Session,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from 'node:http2';
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import { AGENT_SERVICE_CONNECT, PROXY_SERVICE_PROXY, type MetadataMap } from '../../wire/metadata.js';
import { formatHostPort } from '../../common/host-port.js';
import type { PacketStream } from '../packet-stream.js';
import {
  GrpcStatus,
  GrpcStatusError,
  MAX_STREAMS_PER_CONNECTION,
  type GrpcServerTransport,
  type IncomingStream,
  type ServerTransportOptions,
  type StreamHandlers,
} from '../transport.js';
import { SessionLiveness, type KeepaliveOptions, type Liveness } from '../liveness.js';
import { DEFAULT_SEND_BUFFER_BYTES, H2PacketStream, releaseAfterStatus, statusTrailers } from './h2-packet-stream.js';
import {
  addMetadataHeaders,
  encodeGrpcMessage,
  GRPC_CONTENT_TYPE,
  isGrpcContentType,
  metadataFromRawHeaders,
  parseGrpcTimeout,
} from './grpc-headers.js';
import { DEFAULT_SESSION_WINDOW_BYTES, DEFAULT_STREAM_WINDOW_BYTES, MAX_FRAME_BYTES } from './tuning.js';
import { StateMachine, type KindOf, type Lifecycle } from '../../common/state-machine.js';

export interface H2ServerOptions extends ServerTransportOptions {
  /** Per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE). */
  streamWindowBytes?: number;
  /** Connection receive window. */
  sessionWindowBytes?: number;
  /** send() returns false past this many queued bytes per stream. */
  sendBufferBytes?: number;
  /** A connection that has not sent its HTTP/2 preface + SETTINGS by then is dropped. */
  handshakeTimeoutMs?: number;
}

/** What the server knows of one session: set when it is created, never changed. */
interface SessionInfo<C> {
  peer: string;
  context: C | undefined;
  liveness: Liveness | undefined;
}

const MAX_TIMER_MS = 2 ** 31 - 1;

function noop(): void {}

function peerOf(connection: Duplex): string {
  const s = connection as Duplex & { remoteAddress?: string; remotePort?: number };
  if (typeof s.remoteAddress === 'string') {
    return formatHostPort({ host: s.remoteAddress, port: s.remotePort ?? 0 });
  }
  return 'unix';
}

/** Refuses a call with a Trailers-Only response (one HEADERS frame with END_STREAM). */
function trailersOnly(h2: ServerHttp2Stream, code: GrpcStatus, message: string, extra: Record<string, string> = {}): void {
  if (h2.destroyed || h2.closed || h2.headersSent) return;
  h2.respond({ ':status': 200, 'content-type': GRPC_CONTENT_TYPE, ...extra, ...statusTrailers(code, message) }, { endStream: true });
  releaseAfterStatus(h2);
}

/** What accept() returns when the call is already over: emits 'close' once, soon. */
class ClosedPacketStream extends EventEmitter implements PacketStream {
  readonly closed = true;
  readonly queuedBytes = 0;
  constructor(
    readonly metadata: MetadataMap,
    readonly peer: string,
    error: Error,
  ) {
    super();
    setImmediate(() => this.emit('close', error));
  }
  send(): boolean {
    return true;
  }
  end(): void {}
  pause(): void {}
  resume(): void {}
  destroy(): void {}
}

/**
 * Where an incoming call is before the handler decided: waiting for it;
 * accepted (its PacketStream carries the call from then on); rejected with a
 * status; expired (its grpc-timeout passed while waiting: refused with
 * DEADLINE_EXCEEDED); gone (the client closed the stream while waiting).
 * Only 'waiting' moves, and only once.
 */
type IncomingState = 'waiting' | 'rejected' | 'expired' | 'gone' | { readonly kind: 'accepted'; readonly stream: H2PacketStream };

const INCOMING: Lifecycle<IncomingState> = {
  name: 'incoming call',
  moves: { waiting: ['accepted', 'rejected', 'expired', 'gone'], accepted: [], rejected: [], expired: [], gone: [] },
};
const WAITING: readonly KindOf<IncomingState>[] = ['waiting'];

/** One call as the server received it: its headers, its session, and what the server gives every call. */
interface IncomingCall<C> {
  metadata: MetadataMap;
  session: SessionInfo<C>;
  limits: { maxReceiveMessageBytes: number; sendBufferBytes: number };
  /** From grpc-timeout, if sent. */
  timeoutMs: number | undefined;
  /** Told of the stream once accepted (the server closes them at shutdown). */
  track: (s: H2PacketStream) => void;
}

class H2IncomingStream<C> implements IncomingStream<C> {
  readonly peer: string;
  readonly context: C | undefined;
  readonly liveness: Liveness | undefined;
  /** Changed only by settle(). */
  private readonly state = new StateMachine<IncomingState>('waiting', INCOMING);
  /** The grpc-timeout; it aborts an accepted call too. Cleared once the stream is closed or the call rejected. */
  private readonly deadline: NodeJS.Timeout | undefined;

  readonly metadata: MetadataMap;
  private readonly opts: IncomingCall<C>['limits'];
  private readonly track: (s: H2PacketStream) => void;

  constructor(
    private readonly h2: ServerHttp2Stream,
    { metadata, session, limits, timeoutMs, track }: IncomingCall<C>,
  ) {
    this.metadata = metadata;
    this.opts = limits;
    this.track = track;
    this.peer = session.peer;
    this.context = session.context;
    this.liveness = session.liveness;
    if (timeoutMs !== undefined && timeoutMs <= MAX_TIMER_MS) {
      this.deadline = setTimeout(this.onDeadline, timeoutMs);
    }
    h2.once('close', () => {
      clearTimeout(this.deadline);
      this.settle('gone');
    });
  }

  /** Leaves 'waiting' for `to`; false when the call was already settled. */
  private settle(to: IncomingState): boolean {
    return this.state.from(WAITING, to);
  }

  private readonly onDeadline = (): void => {
    const state = this.state.state;
    if (typeof state === 'object') state.stream.abort(GrpcStatus.DEADLINE_EXCEEDED, 'deadline exceeded');
    else if (this.settle('expired')) trailersOnly(this.h2, GrpcStatus.DEADLINE_EXCEEDED, 'deadline exceeded');
  };

  accept(headers: Record<string, string>): PacketStream {
    const h2 = this.h2;
    if (this.state.kind !== 'waiting' || h2.destroyed || h2.closed || h2.headersSent) {
      // Too late (expired, rejected, or the client went away): a stream that is already over.
      return new ClosedPacketStream(
        this.metadata,
        this.peer,
        this.state.kind === 'expired'
          ? new GrpcStatusError(GrpcStatus.DEADLINE_EXCEEDED, 'deadline exceeded')
          : new GrpcStatusError(GrpcStatus.CANCELLED, 'stream closed before it was accepted'),
      );
    }
    const stream = new H2PacketStream(h2, {
      role: 'server',
      metadata: this.metadata,
      peer: this.peer,
      maxReceiveMessageBytes: this.opts.maxReceiveMessageBytes,
      sendBufferBytes: this.opts.sendBufferBytes,
    });
    this.settle({ kind: 'accepted', stream });
    const response: Record<string, string> = {};
    addMetadataHeaders(response, headers);
    h2.respond({ ...response, ':status': 200, 'content-type': GRPC_CONTENT_TYPE, 'grpc-accept-encoding': 'identity' }, {
      waitForTrailers: true,
      sendDate: false,
    } as http2.ServerStreamResponseOptions);
    this.track(stream);
    return stream;
  }

  reject(code: GrpcStatus, message: string): void {
    if (!this.settle('rejected')) return;
    clearTimeout(this.deadline);
    trailersOnly(this.h2, code, message);
  }
}

export class H2ServerTransport<C = undefined> implements GrpcServerTransport<C> {
  private readonly server: http2.Http2Server;
  /** One per accepted connection (bounded by the listeners' descriptors). */
  private readonly sessions = new Set<ServerHttp2Session>();
  private readonly sessionInfo = new WeakMap<Http2Session, SessionInfo<C>>();
  /** At most maxConcurrentStreams per session. */
  private readonly streams = new Set<H2PacketStream>();
  private readonly opts: Required<Omit<H2ServerOptions, 'keepalive' | 'maxConcurrentStreams'>>;
  private readonly keepalive: KeepaliveOptions | undefined;
  private closing: Promise<void> | null = null;
  /** The connection being injected (the 'session' event is synchronous). */
  private injecting: { peer: string; context: C | undefined } = { peer: 'unknown', context: undefined };

  constructor(
    private readonly handlers: StreamHandlers<C>,
    options: H2ServerOptions,
  ) {
    this.opts = {
      maxReceiveMessageBytes: options.maxReceiveMessageBytes,
      streamWindowBytes: options.streamWindowBytes ?? DEFAULT_STREAM_WINDOW_BYTES,
      sessionWindowBytes: options.sessionWindowBytes ?? DEFAULT_SESSION_WINDOW_BYTES,
      sendBufferBytes: options.sendBufferBytes ?? DEFAULT_SEND_BUFFER_BYTES,
      handshakeTimeoutMs: options.handshakeTimeoutMs ?? 10_000,
    };
    this.keepalive = options.keepalive;
    this.server = http2.createServer({
      settings: {
        initialWindowSize: this.opts.streamWindowBytes,
        maxFrameSize: MAX_FRAME_BYTES,
        maxConcurrentStreams: options.maxConcurrentStreams ?? MAX_STREAMS_PER_CONNECTION,
      },
      // Received data is consumed at once; outbound queues are bounded per stream.
      maxSessionMemory: 64,
    });
    this.server.on('session', this.onSession);
    this.server.on('stream', this.onStream);
    this.server.on('sessionError', noop);
    this.server.on('unknownProtocol', (socket: Duplex) => socket.destroy());
  }

  injectConnection(connection: Duplex, context?: C): void {
    if (this.closing) {
      connection.destroy();
      return;
    }
    connection.on('error', noop); // the session reports it; never crash on a reset
    this.injecting = { peer: peerOf(connection), context };
    this.injectedSession = undefined;
    try {
      this.server.emit('connection', connection);
    } finally {
      this.injecting = { peer: 'unknown', context: undefined };
    }
    // Set by onSession during the emit above (TypeScript cannot see that).
    const session = this.injectedSession as ServerHttp2Session | undefined;
    this.injectedSession = undefined;
    // Node destroys a session whose socket closed only once its streams are
    // gone, and a stream with a write in flight may then wait forever for
    // nghttp2. A dead peer (an agent killed with SIGKILL) must end every
    // stream on the connection at once.
    if (session) connection.once('close', () => setImmediate(() => session.destroy()));
  }

  /** The session created while injectConnection emits 'connection' (synchronously). */
  private injectedSession: ServerHttp2Session | undefined;

  private readonly onSession = (session: ServerHttp2Session): void => {
    this.injectedSession = session;
    const { peer, context } = this.injecting;
    const keepalive = this.keepalive;
    this.sessionInfo.set(session, { peer, context, liveness: keepalive && new SessionLiveness(session, peer, keepalive) });
    this.sessions.add(session);
    session.on('error', noop);
    session.on('frameError', noop);

    const handshake = setTimeout(() => session.destroy(), this.opts.handshakeTimeoutMs);
    session.once('remoteSettings', () => clearTimeout(handshake));
    session.once('close', () => {
      clearTimeout(handshake);
      this.sessions.delete(session);
    });
    if (!session.destroyed) {
      try {
        session.setLocalWindowSize(this.opts.sessionWindowBytes);
      } catch {
        // session already gone
      }
    }
  };

  private readonly onStream = (h2: ServerHttp2Stream, headers: IncomingHttpHeaders, _flags: number, rawHeaders: string[]): void => {
    h2.on('error', noop);
    if (this.closing) {
      h2.close(h2c.NGHTTP2_REFUSED_STREAM);
      return;
    }
    if (headers[':method'] !== 'POST') {
      h2.respond({ ':status': 405, allow: 'POST' }, { endStream: true });
      releaseAfterStatus(h2);
      return;
    }
    const contentType = headers['content-type'];
    if (!isGrpcContentType(contentType)) {
      h2.respond(
        {
          ':status': 415,
          'grpc-status': String(GrpcStatus.INTERNAL),
          'grpc-message': encodeGrpcMessage(`invalid gRPC request content-type "${String(contentType ?? '')}"`),
        },
        { endStream: true },
      );
      releaseAfterStatus(h2);
      return;
    }
    const encoding = headers['grpc-encoding'];
    if (encoding !== undefined && encoding !== 'identity') {
      trailersOnly(h2, GrpcStatus.UNIMPLEMENTED, `grpc-encoding "${String(encoding)}" is not supported`, {
        'grpc-accept-encoding': 'identity',
      });
      return;
    }
    let timeoutMs: number | undefined;
    const timeout = headers['grpc-timeout'];
    if (timeout !== undefined) {
      timeoutMs = typeof timeout === 'string' ? parseGrpcTimeout(timeout) : undefined;
      if (timeoutMs === undefined) {
        trailersOnly(h2, GrpcStatus.INTERNAL, `malformed grpc-timeout "${String(timeout)}"`);
        return;
      }
    }
    const path = headers[':path'];
    const handler =
      path === AGENT_SERVICE_CONNECT ? this.handlers.agentConnect : path === PROXY_SERVICE_PROXY ? this.handlers.proxy : undefined;
    if (handler === undefined) {
      trailersOnly(h2, GrpcStatus.UNIMPLEMENTED, `unknown method ${String(path)}`);
      return;
    }
    const incoming = new H2IncomingStream<C>(h2, {
      metadata: metadataFromRawHeaders(rawHeaders),
      session: (h2.session && this.sessionInfo.get(h2.session)) ?? { peer: 'unknown', context: undefined, liveness: undefined },
      limits: this.opts,
      timeoutMs,
      track: this.track,
    });
    handler(incoming);
  };

  private readonly track = (stream: H2PacketStream): void => {
    this.streams.add(stream);
    stream.once('close', () => this.streams.delete(stream));
  };

  close(graceMs: number): Promise<void> {
    if (this.closing) return this.closing;
    this.closing = new Promise<void>((resolve) => {
      const done = (): void => {
        clearTimeout(grace);
        clearTimeout(hard);
        resolve();
      };
      const check = (): void => {
        if (this.sessions.size === 0) done();
      };
      // GOAWAY now; sessions close by themselves once their streams are done.
      for (const session of this.sessions) {
        session.once('close', () => setImmediate(check));
        session.close();
      }
      let hard: NodeJS.Timeout | undefined;
      const grace = setTimeout(() => {
        const shutdown = new GrpcStatusError(GrpcStatus.UNAVAILABLE, 'server shutting down');
        for (const stream of [...this.streams]) stream.destroy(shutdown);
        // Give the trailers a moment to leave, then cut what remains.
        hard = setTimeout(() => {
          for (const session of this.sessions) session.destroy();
        }, 100);
      }, graceMs);
      check();
    });
    return this.closing;
  }
}

export function createH2Server<C = undefined>(handlers: StreamHandlers<C>, opts: H2ServerOptions): H2ServerTransport<C> {
  return new H2ServerTransport<C>(handlers, opts);
}
