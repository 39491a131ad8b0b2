/**
 * How streams are opened and accepted. Both gRPC implementations (h2/, on
 * node:http2, and grpc-js/) provide these two shapes; the commands choose one
 * in src/transport/choice.ts (--transport).
 */
import type { Duplex } from 'node:stream';
import type { PacketStream } from './packet-stream.js';
import type { MetadataMap } from '../wire/metadata.js';
import type { KeepaliveOptions, Liveness } from './liveness.js';
import type { GrpcStatus } from './grpc-status.js';

// Also importable from here, where the transport's interface uses them (tests do).
export { GrpcStatus, GrpcStatusError } from './grpc-status.js';

/**
 * Streams one client connection may hold open at the server unless the
 * server's options say otherwise (Node's default is 2^32 - 1). Agents and the
 * KAS's konnectivity-client open one per connection.
 */
export const MAX_STREAMS_PER_CONNECTION = 100;

/**
 * A stream the server side has accepted but not yet answered. `C` is what the
 * listener established about the connection before handing it in (who
 * authenticated it), passed to injectConnection.
 */
export interface IncomingStream<C = undefined> {
  /** Request metadata sent by the client. */
  readonly metadata: MetadataMap;
  readonly peer: string;
  /** The context the connection was injected with (undefined when none was given). */
  readonly context: C | undefined;
  /** The connection's PING liveness, where the transport checks it itself (node:http2). */
  readonly liveness?: Liveness;
  /** Sends the response headers and returns the stream to exchange packets. */
  accept(headers: Record<string, string>): PacketStream;
  /** Answers with a non-OK status (Trailers-Only) and ends the call. */
  reject(code: GrpcStatus, message: string): void;
}

export interface StreamHandlers<C = undefined> {
  /** /AgentService/Connect */
  agentConnect?: (stream: IncomingStream<C>) => void;
  /** /ProxyService/Proxy */
  proxy?: (stream: IncomingStream<C>) => void;
}

export interface ServerTransportOptions {
  maxReceiveMessageBytes: number;
  /** Server PINGs on every connection (absent: none; the clients ping). */
  keepalive?: KeepaliveOptions;
  /** SETTINGS_MAX_CONCURRENT_STREAMS: streams one connection may have open at once (absent: MAX_STREAMS_PER_CONNECTION). */
  maxConcurrentStreams?: number;
}

/**
 * Server half: serves gRPC on connections the caller has already accepted,
 * TLS-terminated and authenticated (so one listener can carry several
 * protocols and refusals are logged by Kanal, not buried in a library).
 */
export interface GrpcServerTransport<C = undefined> {
  injectConnection(connection: Duplex, context?: C): void;
  /** Stops taking streams; resolves once existing ones are finished or destroyed. */
  close(graceMs: number): Promise<void>;
}

export interface ClientTlsOptions {
  ca: Buffer;
  cert?: Buffer;
  key?: Buffer;
  /** Name to verify the server certificate against (defaults to the host). */
  serverName?: string;
  /** ALPN protocols offered before h2 (upstream's agent --alpn-proto), for a front that routes by ALPN. */
  alpnProtocols?: readonly string[];
}

/** The ALPN list a client offers: the extra protocols, then h2 (as grpc-go appends it). */
export function clientAlpn(tls: ClientTlsOptions): string[] {
  return [...(tls.alpnProtocols ?? []).filter((p) => p !== 'h2'), 'h2'];
}

export interface ChannelOptions {
  /** "host:port" or "unix:///path". */
  target: string;
  /** Absent means plaintext (Unix sockets in tests). */
  tls?: ClientTlsOptions;
  /** Largest message accepted from the peer, bytes. */
  maxReceiveMessageBytes?: number;
  /** The client's PINGs (default DEFAULT_CLIENT_KEEPALIVE). */
  keepalive?: ClientKeepalive;
}

/**
 * How a client checks that its server is still there: a connection with a
 * stream open is PINGed every `intervalMs`, and one that then receives
 * nothing (no answer, no other byte) for `timeoutMs` is closed, ending its
 * streams with UNAVAILABLE (grpc-go's client keepalive,
 * keepalive.ClientParameters, also counts any byte received as a sign of life).
 */
export interface ClientKeepalive {
  intervalMs: number;
  timeoutMs: number;
  /**
   * Whether the server that sent these response headers accepts a PING every
   * `intervalMs`. Until a response says yes, PINGs are at least
   * POLICED_PING_INTERVAL_MS apart; absent: every server accepts them.
   */
  acceptsFrequentPings?: (responseMetadata: MetadataMap) => boolean;
}

/** Without options: a PING after a minute of silence, the connection closed 20 s later. */
export const DEFAULT_CLIENT_KEEPALIVE: ClientKeepalive = { intervalMs: 60_000, timeoutMs: 20_000 };

/**
 * The PING spacing a grpc-go server with upstream's policy tolerates: its
 * agent port allows one PING per 30 s without data in between and sends
 * GOAWAY (ENHANCE_YOUR_CALM, "too_many_pings") at the third that comes sooner
 * (apiserver-network-proxy cmd/server/app/server.go, KeepaliveEnforcementPolicy
 * MinTime 30s; grpc-go internal/transport/http2_server.go, handlePing). 5 s of
 * margin for timers and the network.
 */
export const POLICED_PING_INTERVAL_MS = 35_000;

/** Client half: one HTTP/2 connection to a server, on which streams are opened. */
export interface GrpcChannel {
  /**
   * Opens a stream and resolves once the response headers arrived (they are
   * the PacketStream's metadata). Rejects with GrpcStatusError on refusal.
   */
  openStream(path: string, metadata: Record<string, string>, timeoutMs: number): Promise<PacketStream>;
  close(): void;
}

export interface Transport {
  createServer<C = undefined>(handlers: StreamHandlers<C>, opts: ServerTransportOptions): GrpcServerTransport<C>;
  createChannel(opts: ChannelOptions): GrpcChannel;
}
