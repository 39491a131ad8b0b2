/**
 * PacketStream over a grpc-js bidirectional call (either side). grpc-js does
 * the HTTP/2 and gRPC framing; this class only maps its events onto ours.
 */
import { EventEmitter } from 'node:events';
import { constants as h2c } from 'node:http2';
import type * as grpc from '@grpc/grpc-js';
import type { Packet } from '../../wire/packet.js';
import { encodePacket } from '../../wire/codec.js';
import type { MetadataMap } from '../../wire/metadata.js';
import type { PacketStream } from '../packet-stream.js';
import { GrpcStatus, GrpcStatusError } from '../grpc-status.js';
import { isInvalid, type Decoded } from '../decoded.js';

/** Packets are encoded here, so their size is known (service-definition.ts passes Buffers through). */
type ServerCall = grpc.ServerDuplexStream<Decoded, Packet | Buffer>;
type ClientCall = grpc.ClientDuplexStream<Packet | Buffer, Decoded>;

/**
 * Memory a queued message costs beyond its bytes: 2 MiB of 30-byte replies
 * queued for a peer that does not read took 94 MiB (≈ 1.4 KiB each).
 */
const QUEUED_MESSAGE_OVERHEAD_BYTES = 1024;

/** What closing a server call needs of the node:http2 stream under it. */
interface ResettableStream {
  readonly writableLength: number;
  close(code: number): void;
}

function isResettable(v: unknown): v is ResettableStream {
  return (
    typeof v === 'object' &&
    v !== null &&
    typeof Reflect.get(v, 'close') === 'function' &&
    typeof Reflect.get(v, 'writableLength') === 'number'
  );
}

/**
 * grpc-js has no way to reset a server call: its status waits for queued
 * messages to be written. The HTTP/2 stream is reached through grpc-js's
 * internals (1.14, no interceptors: the call object's `call.stream`); when
 * they change this finds nothing and the status is sent as before.
 */
function http2StreamOf(call: object): ResettableStream | undefined {
  const inner: unknown = Reflect.get(call, 'call');
  const stream: unknown = typeof inner === 'object' && inner !== null ? Reflect.get(inner, 'stream') : undefined;
  return isResettable(stream) ? stream : undefined;
}

export class GrpcJsPacketCall extends EventEmitter implements PacketStream {
  closed = false;
  private ended = false;
  /**
   * Bytes handed to grpc-js whose write has not completed, each message
   * counted with what grpc-js and node:http2 keep for it besides its bytes.
   */
  queuedBytes = 0;

  constructor(
    private readonly call: ServerCall | ClientCall,
    private readonly side: 'server' | 'client',
    readonly metadata: MetadataMap,
    readonly peer: string,
  ) {
    super();
    call.on('data', (d: Decoded) => {
      if (isInvalid(d)) this.emit('invalid', d.invalid);
      else this.emit('packet', d);
    });
    call.on('drain', () => this.emit('drain'));
    call.on('error', (err: Error & { code?: number; details?: string }) => {
      const code = typeof err.code === 'number' ? (err.code as GrpcStatus) : GrpcStatus.UNKNOWN;
      this.finish(new GrpcStatusError(code, err.details ?? err.message));
    });
    if (side === 'server') {
      // The client half-closed: answer with OK status, which ends the call.
      call.on('end', () => {
        this.end();
        this.finish(undefined);
      });
      (call as ServerCall).on('cancelled', () => this.finish(new GrpcStatusError(GrpcStatus.CANCELLED, 'cancelled by peer')));
    } else {
      (call as ClientCall).on('status', (s: grpc.StatusObject) => {
        const code: number = s.code;
        this.finish(code === 0 ? undefined : new GrpcStatusError(code, s.details));
      });
      call.on('end', () => this.end());
    }
  }

  send(packet: Packet): boolean {
    if (this.closed || this.ended) return true;
    const message = encodePacket(packet);
    const cost = message.length + QUEUED_MESSAGE_OVERHEAD_BYTES;
    this.queuedBytes += cost;
    return this.call.write(message, () => (this.queuedBytes -= cost));
  }

  pause(): void {
    this.call.pause();
  }

  resume(): void {
    this.call.resume();
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.call.end();
  }

  destroy(error?: Error): void {
    if (this.closed) return;
    if (this.side === 'client') {
      (this.call as ClientCall).cancel();
    } else {
      this.ended = true;
      const h2 = http2StreamOf(this.call);
      if (h2 && h2.writableLength > 0) {
        // The status would wait behind what the peer has not read, maybe forever.
        h2.close(h2c.NGHTTP2_CANCEL);
      } else {
        const status = Object.assign(new Error(error?.message ?? 'stream closed'), {
          code: error instanceof GrpcStatusError ? error.code : GrpcStatus.UNAVAILABLE,
          details: error?.message ?? 'stream closed',
        });
        this.call.emit('error', status);
      }
    }
    this.finish(error);
  }

  private finish(error: Error | undefined): void {
    if (this.closed) return;
    this.closed = true;
    this.emit('close', error);
  }
}
