/**
 * The one interface between the tunnel multiplexer and whatever carries
 * packets (h2/ on node:http2 by default, or grpc-js/).
 * A PacketStream is one bidirectional gRPC stream, already past its headers.
 */
import type { Packet } from '../wire/packet.js';
import type { MetadataMap } from '../wire/metadata.js';

export interface PacketStreamEvents {
  /** A well-formed packet arrived. */
  packet: [packet: Packet];
  /** Bytes arrived that do not decode as a Packet; the stream stays open. */
  invalid: [reason: string];
  /** send() returned false earlier and the stream can take more now. */
  drain: [];
  /** The stream is finished (peer ended, error, or destroy()); emitted once. */
  close: [error: Error | undefined];
}

export interface PacketStream {
  /** Request metadata (server side) or response headers (client side). */
  readonly metadata: MetadataMap;
  /** Human-readable peer address for logs. */
  readonly peer: string;
  /**
   * Queues a packet. Returns false once the stream's send buffer is full:
   * the caller should wait for 'drain' before sending more bulk data.
   */
  send(packet: Packet): boolean;
  /**
   * Bytes of sent packets the connection has not taken yet (queued here or
   * in the HTTP/2 layer because the peer, or its network, is not reading).
   * The tunnel bounds it (see TunnelLimits.pauseReadingQueuedBytes).
   */
  readonly queuedBytes: number;
  /** Graceful end: no more packets from this side (gRPC half-close / OK status). */
  end(): void;
  /**
   * Stops reading from the peer (HTTP/2 flow control then holds it back):
   * while the peer leaves what we sent unread, or while a local reader
   * is slower than a peer without Kanal's per-connection windows.
   */
  pause(): void;
  resume(): void;
  /**
   * Declares that the listener treats DATA as a byte stream, so a large DATA
   * packet may be emitted as several DATA packets (same connectID, payload in
   * order) as its bytes arrive, instead of being reassembled first. Optional:
   * a transport without it always emits whole packets.
   */
  acceptDataInPieces?(): void;
  /**
   * Lowers what the peer may send on this stream without our reading it (its
   * HTTP/2 receive window) to `bytes`: for peers without per-connection
   * windows, whose stream is paused for a slow reader, it is what lands at
   * once when reading resumes. Optional; it applies to the whole
   * HTTP/2 connection, which such peers use for this one stream.
   */
  limitReceiveWindow?(bytes: number): void;
  /** Tears the stream down now; pending packets are dropped. */
  destroy(error?: Error): void;
  readonly closed: boolean;

  on<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this;
  once<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this;
  off<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this;
}
