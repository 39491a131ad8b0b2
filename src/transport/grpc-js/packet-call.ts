/**
 * PacketStream over a grpc-js bidirectional call (either side). grpc-js does
 * the HTTP/2 and gRPC framing; this class only maps its events onto ours.
 */
import { EventEmitter } from 'node:events';
import type * as grpc from '@grpc/grpc-js';
import type { Packet } from '../../wire/packet.js';
import type { MetadataMap } from '../../wire/metadata.js';
import type { PacketStream } from '../packet-stream.js';
import { GrpcStatus, GrpcStatusError } from '../transport.js';
import { isInvalid, type Decoded } from '../decoded.js';

type ServerCall = grpc.ServerDuplexStream<Decoded, Packet>;
type ClientCall = grpc.ClientDuplexStream<Packet, Decoded>;

export class GrpcJsPacketCall extends EventEmitter implements PacketStream {
  closed = false;
  private ended = false;

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
        this.finish(s.code === 0 ? undefined : new GrpcStatusError(s.code as number as GrpcStatus, s.details));
      });
      call.on('end', () => this.end());
    }
  }

  send(packet: Packet): boolean {
    if (this.closed || this.ended) return true;
    return this.call.write(packet);
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
      const status = Object.assign(new Error(error?.message ?? 'stream closed'), {
        code: error instanceof GrpcStatusError ? error.code : GrpcStatus.UNAVAILABLE,
        details: error?.message ?? 'stream closed',
      });
      this.ended = true;
      this.call.emit('error', status);
    }
    this.finish(error);
  }

  private finish(error: Error | undefined): void {
    if (this.closed) return;
    this.closed = true;
    this.emit('close', error);
  }
}
