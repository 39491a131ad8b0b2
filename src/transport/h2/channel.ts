/**
 * gRPC client half on node:http2: one HTTP/2 connection (made when the first
 * stream is opened, and again on the next openStream after it was lost), on
 * which bidirectional streams are opened. Reconnecting and backoff are the
 * caller's business.
 */
import http2, {
  constants as h2c,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
} from 'node:http2';
import net from 'node:net';
import tls from 'node:tls';
import type { PacketStream } from '../packet-stream.js';
import { clientAlpn, DEFAULT_CLIENT_KEEPALIVE, type ChannelOptions, type ClientKeepalive, type GrpcChannel } from '../transport.js';
import { GrpcStatus, GrpcStatusError } from '../grpc-status.js';
import { DEFAULT_SEND_BUFFER_BYTES, H2PacketStream, statusFromTrailers } from './h2-packet-stream.js';
import {
  addMetadataHeaders,
  decodeGrpcMessage,
  GRPC_CONTENT_TYPE,
  grpcStatusFromHttp,
  grpcStatusFromRstCode,
  isGrpcContentType,
  metadataFromRawHeaders,
  parseGrpcStatus,
} from './grpc-headers.js';
import { DEFAULT_SESSION_WINDOW_BYTES, DEFAULT_STREAM_WINDOW_BYTES, MAX_FRAME_BYTES } from './tuning.js';
import { sizeTunnelSendBuffer } from '../socket-send-buffer.js';
import { closeWhenPeerGone } from '../peer-gone-watch.js';
import { errorMessage } from '../../common/error-message.js';
import { formatHostPort } from '../../common/host-port.js';
import { SessionPinger } from './session-pinger.js';
import { ALPN_NOT_H2, alpnNotH2, closedAfterTlsHandshake } from '../connect-stage.js';

export interface H2ChannelOptions extends ChannelOptions {
  /** Per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE). */
  streamWindowBytes?: number;
  /** Connection receive window. */
  sessionWindowBytes?: number;
  /** send() returns false past this many queued bytes per stream. */
  sendBufferBytes?: number;
  /** user-agent header (grpc-go puts it into metadata). */
  userAgent?: string;
}

const DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024;
const USER_AGENT = 'kanal-h2/0.1';

interface Target {
  /** What createConnection dials. */
  connect: () => net.Socket;
  /** :authority / URL used by http2.connect. */
  authority: string;
  peer: string;
}

function parseTarget(opts: ChannelOptions): Target {
  let target = opts.target;
  const tlsOpts = opts.tls;
  const wrap = (socket: net.Socket | undefined, host: string | undefined, port: number | undefined): net.Socket => {
    if (!tlsOpts) return socket ?? net.connect({ host: host!, port: port! });
    // No SNI for an IP literal (RFC 6066 §3; Node's DEP0123), be it the host or --tls-server-name.
    const name = tlsOpts.serverName ?? host;
    const servername = name !== undefined && net.isIP(name) === 0 ? name : undefined;
    const options: tls.ConnectionOptions = {
      ca: tlsOpts.ca,
      cert: tlsOpts.cert,
      key: tlsOpts.key,
      ALPNProtocols: clientAlpn(tlsOpts),
      ...(servername !== undefined ? { servername } : {}),
      ...(socket ? { socket } : { host: host!, port: port! }),
    };
    if (tlsOpts.serverName !== undefined) {
      const name = tlsOpts.serverName;
      options.checkServerIdentity = (_host, cert) => tls.checkServerIdentity(name, cert);
    }
    const s = tls.connect(options);
    s.once('secureConnect', () => {
      if (s.alpnProtocol !== 'h2') {
        // After http2's own secureConnect listener: it aborts the process on a socket destroyed under it.
        const err = alpnNotH2(s.alpnProtocol);
        setImmediate(() => s.destroy(err));
      }
    });
    return s;
  };
  if (target.startsWith('unix:')) {
    // unix:///abs/path, unix:/abs/path, unix:relative
    const path = target.startsWith('unix://') ? target.slice('unix://'.length) : target.slice('unix:'.length);
    return {
      connect: () => wrap(net.connect(path), undefined, undefined),
      authority: 'localhost',
      peer: `unix:${path}`,
    };
  }
  if (target.startsWith('dns:///')) target = target.slice('dns:///'.length);
  const m = /^\[([^\]]+)\]:(\d+)$/.exec(target) ?? /^([^:]+):(\d+)$/.exec(target);
  if (!m) throw new TypeError(`invalid gRPC target "${opts.target}" (want host:port or unix:///path)`);
  const host = m[1];
  const port = Number(m[2]);
  return {
    connect: () => wrap(undefined, host, port),
    authority: formatHostPort({ host, port }),
    peer: target,
  };
}

const isAlpnRefusal = (err: Error | undefined): boolean => err !== undefined && Reflect.get(err, 'code') === ALPN_NOT_H2;

export class H2Channel implements GrpcChannel {
  private readonly target: Target;
  private readonly maxReceiveMessageBytes: number;
  private readonly streamWindow: number;
  private readonly sessionWindow: number;
  private readonly sendBufferBytes: number;
  private readonly keepalive: ClientKeepalive;
  private readonly userAgent: string;
  private session: ClientHttp2Session | undefined;
  private closed = false;
  /** Streams open on any of this channel's sessions (pending or established). */
  private readonly open = new Map<ClientHttp2Session, Set<ClientHttp2Stream>>();

  constructor(private readonly opts: H2ChannelOptions) {
    this.target = parseTarget(opts);
    this.maxReceiveMessageBytes = opts.maxReceiveMessageBytes ?? DEFAULT_MAX_RECEIVE_MESSAGE_BYTES;
    this.streamWindow = opts.streamWindowBytes ?? DEFAULT_STREAM_WINDOW_BYTES;
    this.sessionWindow = opts.sessionWindowBytes ?? DEFAULT_SESSION_WINDOW_BYTES;
    this.sendBufferBytes = opts.sendBufferBytes ?? DEFAULT_SEND_BUFFER_BYTES;
    this.keepalive = opts.keepalive ?? DEFAULT_CLIENT_KEEPALIVE;
    this.userAgent = opts.userAgent ?? USER_AGENT;
  }

  openStream(path: string, metadata: Record<string, string>, timeoutMs: number): Promise<PacketStream> {
    return new Promise<PacketStream>((resolve, reject) => {
      if (this.closed) {
        reject(new GrpcStatusError(GrpcStatus.UNAVAILABLE, 'channel closed'));
        return;
      }
      const session = this.getSession();
      const req = this.request(session, path, metadata);
      if (req instanceof GrpcStatusError) {
        reject(req);
        return;
      }
      this.trackStream(session, req);

      let settled = false;
      let lastError: Error | undefined;
      const settle = (result: GrpcStatusError | PacketStream): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        req.off('response', onResponse);
        req.off('close', onClose);
        if (result instanceof GrpcStatusError) {
          if (!req.closed && !req.destroyed) req.close(h2c.NGHTTP2_CANCEL);
          reject(result);
        } else {
          resolve(result);
        }
      };
      const timer = setTimeout(
        () => settle(new GrpcStatusError(GrpcStatus.DEADLINE_EXCEEDED, `no response headers within ${timeoutMs} ms`)),
        timeoutMs,
      );
      const onError = (err: Error): void => {
        lastError ??= err;
      };
      const onClose = (): void => settle(this.closedBeforeResponse(session, req, lastError));
      const onResponse = (h: IncomingHttpHeaders, flags: number, raw: string[]): void => {
        const endStream = (flags & h2c.NGHTTP2_FLAG_END_STREAM) !== 0;
        const result = this.answered(req, h, endStream, raw);
        if (result instanceof H2PacketStream && this.keepalive.acceptsFrequentPings?.(result.metadata)) this.pingers.get(session)?.relax();
        settle(result);
        if (endStream && result instanceof H2PacketStream) {
          // OK without a single message: the call is already over.
          setImmediate(() => result.finish(undefined));
        }
      };
      req.on('error', onError);
      req.on('response', onResponse);
      req.on('close', onClose);
    });
  }

  /** Sends the call's request headers on `session`: the stream, or why it could not be opened. */
  private request(session: ClientHttp2Session, path: string, metadata: Record<string, string>): ClientHttp2Stream | GrpcStatusError {
    const headers: OutgoingHttpHeaders & Record<string, string> = {};
    addMetadataHeaders(headers, metadata);
    Object.assign(headers, {
      ':method': 'POST',
      ':path': path,
      'content-type': GRPC_CONTENT_TYPE,
      te: 'trailers',
      'user-agent': this.userAgent,
      'grpc-accept-encoding': 'identity',
    });
    try {
      return session.request(headers, { endStream: false });
    } catch (err) {
      // A session that is going away, or headers node:http2 refuses (bad metadata).
      const code = (err as { code?: string }).code ?? '';
      const status = /SESSION|GOAWAY|DESTROYED|CLOSED/.test(code) ? GrpcStatus.UNAVAILABLE : GrpcStatus.INTERNAL;
      return new GrpcStatusError(status, `cannot open stream: ${errorMessage(err)}`);
    }
  }

  /** Why a stream closed before its response headers: the connection failed, or the server reset it. */
  private closedBeforeResponse(session: ClientHttp2Session, req: ClientHttp2Stream, lastError: Error | undefined): GrpcStatusError {
    const sessionError = this.sessionErrors.get(session);
    if (session.destroyed || req.rstCode === undefined) {
      const failure = sessionError ?? lastError;
      // TLS done, no SETTINGS from the server: it refused this client (connect-stage.ts).
      const stage = this.stages.get(session);
      const why = stage?.tlsDone && !stage.settings && !isAlpnRefusal(failure) ? closedAfterTlsHandshake(failure) : failure;
      return new GrpcStatusError(GrpcStatus.UNAVAILABLE, `connection to ${this.target.peer} failed${why ? `: ${why.message}` : ''}`, {
        cause: why,
      });
    }
    return new GrpcStatusError(grpcStatusFromRstCode(req.rstCode), `stream reset by the server (code ${req.rstCode})`);
  }

  /** The response headers: the call's PacketStream, or the status that refused it (HTTP status, content-type, Trailers-Only). */
  private answered(req: ClientHttp2Stream, h: IncomingHttpHeaders, endStream: boolean, raw: string[]): GrpcStatusError | H2PacketStream {
    const status = Number(h[':status']);
    const grpcStatus = parseGrpcStatus(h['grpc-status']);
    const rawMessage = h['grpc-message'];
    const message = typeof rawMessage === 'string' ? decodeGrpcMessage(rawMessage) : '';
    if (status !== 200) {
      return grpcStatus !== undefined && grpcStatus !== GrpcStatus.OK
        ? new GrpcStatusError(grpcStatus, message)
        : new GrpcStatusError(grpcStatusFromHttp(status), `unexpected HTTP status ${status}${message ? `: ${message}` : ''}`);
    }
    if (!isGrpcContentType(h['content-type'])) {
      return new GrpcStatusError(GrpcStatus.UNKNOWN, `unexpected content-type "${String(h['content-type'] ?? '')}"`);
    }
    if (endStream || grpcStatus !== undefined) {
      // Trailers-Only.
      const err = statusFromTrailers(h);
      if (err) return err;
    }
    return new H2PacketStream(req, {
      role: 'client',
      metadata: metadataFromRawHeaders(raw),
      peer: this.target.peer,
      maxReceiveMessageBytes: this.maxReceiveMessageBytes,
      sendBufferBytes: this.sendBufferBytes,
    });
  }

  /** Stops opening streams; the connection goes once its streams are done. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.session?.close();
  }

  /** Closes the connection now; open streams end with UNAVAILABLE. */
  destroy(): void {
    this.closed = true;
    for (const session of this.open.keys()) session.destroy();
    this.session?.destroy();
  }

  private readonly sessionErrors = new WeakMap<ClientHttp2Session, Error>();
  /** How far each session's connection got: its TLS handshake done, the server's SETTINGS received. */
  private readonly stages = new WeakMap<ClientHttp2Session, { tlsDone: boolean; settings: boolean }>();
  /** Each session's PINGs (session-pinger.ts); they stop with the session. */
  private readonly pingers = new WeakMap<ClientHttp2Session, SessionPinger>();

  private getSession(): ClientHttp2Session {
    const current = this.session;
    if (current && !current.closed && !current.destroyed) return current;
    const target = this.target;
    // The socket is made inside http2.connect, before the session it belongs to is returned.
    const created: { session?: ClientHttp2Session; socket?: net.Socket } = {};
    const stage = { tlsDone: false, settings: false };
    const session = http2.connect(`${this.opts.tls ? 'https' : 'http'}://${target.authority}`, {
      settings: {
        enablePush: false,
        initialWindowSize: this.streamWindow,
        maxFrameSize: MAX_FRAME_BYTES,
      },
      maxSessionMemory: 64,
      createConnection: () => {
        const socket = target.connect();
        created.socket = socket;
        socket.once('secureConnect', () => (stage.tlsDone = true));
        socket.once('connect', () => {
          sizeTunnelSendBuffer(socket);
          // The error it closes the socket with reaches the streams as UNAVAILABLE.
          closeWhenPeerGone(socket, () => undefined);
        });
        // As on the server: a dead connection ends every stream at once.
        socket.once('close', () => setImmediate(() => created.session?.destroy()));
        return socket;
      },
    });
    created.session = session;
    this.stages.set(session, stage);
    session.once('remoteSettings', () => (stage.settings = true));
    this.session = session;
    this.open.set(session, new Set());
    session.on('error', (err: Error) => {
      if (!this.sessionErrors.has(session)) this.sessionErrors.set(session, err);
    });
    session.once('connect', () => {
      try {
        session.setLocalWindowSize(this.sessionWindow);
      } catch {
        // session already gone
      }
    });
    this.pingers.set(
      session,
      new SessionPinger(session, {
        keepalive: this.keepalive,
        bytesRead: () => created.socket?.bytesRead ?? 0,
        streams: () => this.open.get(session)?.size ?? 0,
        onDead: (reason) => {
          const err = new GrpcStatusError(GrpcStatus.UNAVAILABLE, reason);
          this.sessionErrors.set(session, err);
          // The status reaches each stream's 'close' (h2-packet-stream.ts keeps it).
          session.destroy(err);
        },
      }),
    );
    session.once('close', () => {
      this.open.delete(session);
      if (this.session === session) this.session = undefined;
    });
    return session;
  }

  private trackStream(session: ClientHttp2Session, req: ClientHttp2Stream): void {
    const set = this.open.get(session);
    if (!set) return;
    set.add(req);
    req.once('close', () => set.delete(req));
  }
}

export function createH2Channel(opts: H2ChannelOptions): H2Channel {
  return new H2Channel(opts);
}
