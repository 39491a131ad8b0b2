/**
 * gRPC length-prefixed messages (PROTOCOL-HTTP2.md, "Length-Prefixed-Message"):
 * a 1-byte compressed flag, a 4-byte big-endian length, then the message
 * (its bytes: src/wire/codec.ts, DATA's in src/wire/data-frame.ts).
 *
 * Sending: a DATA packet is framed as two buffers — the 5-byte prefix plus
 * the protobuf bytes that precede the payload, then the payload itself — so
 * bulk bytes are never copied into a new buffer on their way to the socket.
 *
 * Receiving: a streaming parser that hands out a view into the received chunk
 * when a message lies inside one chunk. A DATA packet spread over several
 * chunks (HTTP/2 frames are usually 16 KiB, DATA messages up to 64 KiB) is
 * passed on as a run of payload slices, each a view into its chunk: copying
 * it together would cost a memcpy and an external allocation per message,
 * which drives V8 into major GCs (see src/tunnel/gc-pacer.ts). Any other
 * message is assembled into one buffer of the announced size (after checking
 * the size against the limit, so an oversized message is refused before any
 * of it is buffered).
 */
import { encodePacket } from '../../wire/codec.js';
import { encodeData, matchDataHeader } from '../../wire/data-frame.js';
import { PacketType, type Packet } from '../../wire/packet.js';
import { GrpcStatus } from '../grpc-status.js';

/** DATA payloads at least this large are written as a separate buffer. */
const SEPARATE_PAYLOAD_BYTES = 1024;

export const MESSAGE_PREFIX_BYTES = 5;

/**
 * Frames a packet as one gRPC message. Returns one buffer, or two (header and
 * payload, uncopied) for DATA packets with a large payload. The concatenation
 * of the parts minus the first five bytes is exactly `encodePacket(packet)`.
 */
export function framePacket(packet: Packet): [Buffer] | [Buffer, Uint8Array] {
  if (packet.type === PacketType.DATA && packet.data.length >= SEPARATE_PAYLOAD_BYTES) {
    const header = encodeData(packet.connectID, packet.error, packet.data, MESSAGE_PREFIX_BYTES, false);
    writePrefix(header, header.length - MESSAGE_PREFIX_BYTES + packet.data.length);
    return [header, packet.data];
  }
  const out = encodePacket(packet, MESSAGE_PREFIX_BYTES);
  writePrefix(out, out.length - MESSAGE_PREFIX_BYTES);
  return [out];
}

function writePrefix(buf: Buffer, messageLength: number): void {
  buf[0] = 0;
  buf.writeUInt32BE(messageLength, 1);
}

/** Why the parser stopped: the stream must end with this status. */
export interface FramingError {
  readonly code: GrpcStatus;
  readonly message: string;
}

/** Receives the payload of a DATA packet streamed in pieces; false stops parsing. */
export type DataSliceHandler = (connectID: number, slice: Buffer) => boolean;

/**
 * Incremental parser of length-prefixed messages. `push` calls `onMessage` for
 * every complete message; if `onMessage` returns false parsing stops (the
 * stream was closed by a listener). With `onDataSlice`, a DATA packet that
 * does not lie inside one chunk is delivered as payload slices instead (the
 * same bytes `onMessage` would have carried, in order). After an error the
 * parser is dead.
 */
export class MessageParser {
  private readonly prefix = Buffer.alloc(MESSAGE_PREFIX_BYTES);
  private prefixFill = 0;
  /** Message being assembled across chunks, or null between messages. */
  private body: Buffer | null = null;
  private bodyFill = 0;
  /** DATA payload bytes still to stream for `streamID`, 0 when not streaming. */
  private streamLeft = 0;
  private streamID = 0;
  private failed: FramingError | null = null;

  constructor(private readonly maxMessageBytes: number) {}

  push(chunk: Buffer, onMessage: (message: Uint8Array) => boolean, onDataSlice?: DataSliceHandler): FramingError | null {
    if (this.failed) return this.failed;
    const n = chunk.length;
    let off = 0;
    while (off < n) {
      if (this.streamLeft > 0) {
        const take = Math.min(this.streamLeft, n - off);
        this.streamLeft -= take;
        off += take;
        if (!onDataSlice!(this.streamID, chunk.subarray(off - take, off))) return null;
        continue;
      }
      let body = this.body;
      if (body === null) {
        let flags: number;
        let length: number;
        if (this.prefixFill === 0 && n - off >= MESSAGE_PREFIX_BYTES) {
          flags = chunk[off]!;
          length = chunk.readUInt32BE(off + 1);
          off += MESSAGE_PREFIX_BYTES;
        } else {
          const take = Math.min(MESSAGE_PREFIX_BYTES - this.prefixFill, n - off);
          chunk.copy(this.prefix, this.prefixFill, off, off + take);
          this.prefixFill += take;
          off += take;
          if (this.prefixFill < MESSAGE_PREFIX_BYTES) break;
          this.prefixFill = 0;
          flags = this.prefix[0]!;
          length = this.prefix.readUInt32BE(1);
        }
        if (flags !== 0) {
          return this.fail(
            flags === 1
              ? { code: GrpcStatus.INTERNAL, message: 'compressed message received, but no grpc-encoding was negotiated' }
              : { code: GrpcStatus.INTERNAL, message: `invalid message flags 0x${flags.toString(16)}` },
          );
        }
        if (length > this.maxMessageBytes) {
          return this.fail({
            code: GrpcStatus.RESOURCE_EXHAUSTED,
            message: `received message larger than max (${length} vs. ${this.maxMessageBytes})`,
          });
        }
        if (n - off >= length) {
          // Whole message inside this chunk: hand out a view, no copy.
          const message = chunk.subarray(off, off + length);
          off += length;
          if (!onMessage(message)) return null;
          continue;
        }
        if (onDataSlice !== undefined) {
          // Only when the DATA header itself is in this chunk (nearly always).
          const h = matchDataHeader(chunk, off, n, length);
          if (h !== null) {
            off += h.headerBytes;
            this.streamID = h.connectID;
            this.streamLeft = length - h.headerBytes;
            continue;
          }
        }
        body = this.body = Buffer.allocUnsafe(length);
        this.bodyFill = 0;
      }
      const take = Math.min(body.length - this.bodyFill, n - off);
      chunk.copy(body, this.bodyFill, off, off + take);
      this.bodyFill += take;
      off += take;
      if (this.bodyFill === body.length) {
        this.body = null;
        if (!onMessage(body)) return null;
      }
    }
    return null;
  }

  /** True when a message or prefix is partially received. */
  get midMessage(): boolean {
    return this.body !== null || this.prefixFill !== 0 || this.streamLeft !== 0;
  }

  private fail(err: FramingError): FramingError {
    this.failed = err;
    this.body = null;
    this.streamLeft = 0;
    return err;
  }
}
