/**
 * The wire format of a DATA packet, in one place:
 *
 *   Packet{ type(1) = DATA, data(4) = Data{ connectID(1), error(2), data(3) } }
 *
 * laid out as every protobuf encoder writes it: type first, the payload
 * bytes last. encodeData writes the header and (optionally) leaves the
 * payload out, so a transport can send a large payload as a second buffer
 * uncopied; matchDataHeader recognises that layout from a message's first
 * bytes, so a receiver can pass the payload on piece by piece as it
 * arrives; decodeData reads any valid encoding. codec.ts uses these for
 * DATA; src/transport/h2/framing.ts adds the gRPC message prefix.
 */
import { PacketType, type DataPacket } from './packet.js';
import { PacketDecodeError, peekVarint, Reader, tag, varintSize, WIRE_LEN, WIRE_VARINT, writeVarint } from './protobuf.js';

/** Field of Packet's oneof that carries Data. */
export const DATA_PAYLOAD_FIELD = 4;

const TAG_TYPE = tag(1, WIRE_VARINT);
/** PacketType.DATA as the byte it is on the wire. */
const DATA_TYPE: number = PacketType.DATA;
const TAG_PAYLOAD = tag(DATA_PAYLOAD_FIELD, WIRE_LEN);
const TAG_CONNECT_ID = tag(1, WIRE_VARINT);
const TAG_ERROR = tag(2, WIRE_LEN);
const TAG_DATA = tag(3, WIRE_LEN);

const EMPTY = new Uint8Array(0);

/**
 * Encodes a DATA packet into one new buffer: `headroom` bytes left for the
 * caller (a gRPC message prefix), then the message. With `withPayload` the
 * payload is copied in and the buffer holds the whole message; without it the
 * buffer ends where the payload starts and the message is that buffer (minus
 * the headroom) followed by `payload`. Proto3 omits a zero connectID, an
 * empty error and an empty payload.
 */
// Positional on purpose: called once per DATA packet, where an options object would be an allocation per packet.
export function encodeData(connectID: number, error: string, payload: Uint8Array, headroom: number, withPayload: boolean): Buffer {
  const errorBytes = error.length === 0 ? 0 : Buffer.byteLength(error, 'utf8');
  const n = payload.length;
  let inner = 0;
  if (connectID !== 0) inner += 1 + varintSize(connectID);
  if (errorBytes !== 0) inner += 1 + varintSize(errorBytes) + errorBytes;
  if (n !== 0) inner += 1 + varintSize(n) + n;
  const message = 2 + 1 + varintSize(inner) + inner;
  const out = Buffer.allocUnsafe(headroom + message - (withPayload ? 0 : n));
  let p = headroom;
  out[p++] = TAG_TYPE;
  out[p++] = PacketType.DATA;
  out[p++] = TAG_PAYLOAD;
  p = writeVarint(out, p, inner);
  if (connectID !== 0) {
    out[p++] = TAG_CONNECT_ID;
    p = writeVarint(out, p, connectID);
  }
  if (errorBytes !== 0) {
    out[p++] = TAG_ERROR;
    p = writeVarint(out, p, errorBytes);
    p += out.write(error, p, errorBytes, 'utf8');
  }
  if (n !== 0) {
    out[p++] = TAG_DATA;
    p = writeVarint(out, p, n);
    if (withPayload) out.set(payload, p);
  }
  return out;
}

/**
 * Decodes a Data message at buf[start..end): the payload is a view into
 * `buf`. Unknown fields are skipped; a known field of the wrong wire type,
 * a connectID beyond 2^53 or below 0, or an error that is not UTF-8 throws
 * PacketDecodeError.
 */
export function decodeData(buf: Uint8Array, start: number, end: number): DataPacket {
  let connectID = 0;
  let error = '';
  let data: Uint8Array = EMPTY;
  const r = new Reader(buf, start, end);
  while (r.pos < end) {
    const t = r.varint();
    const num = Math.floor(t / 8);
    const wt = t & 7;
    if (num < 1 || num > 3) {
      r.skip(wt);
      continue;
    }
    const want = num === 1 ? WIRE_VARINT : WIRE_LEN;
    if (wt !== want) throw new PacketDecodeError(`field ${num} of DATA has wire type ${wt}`);
    if (num === 1) {
      connectID = r.safeInt(1, 'DATA');
    } else if (num === 2) {
      error = r.utf8(2, 'DATA');
    } else {
      const [s, e] = r.lengthDelimited();
      data = buf.subarray(s, e);
    }
  }
  return { type: PacketType.DATA, connectID, error, data };
}

/** Where the payload of a DATA message starts, as found by matchDataHeader. */
export interface DataHeader {
  connectID: number;
  /** Bytes before the payload; the payload runs from there to the end of the message. */
  headerBytes: number;
}

/**
 * Recognises the start of a DATA message laid out as encodeData writes it
 * with a payload and no error — from its first bytes `buf[start..end)`,
 * when the message is `messageLength` bytes long. Such a message decodes
 * (decodeData) to exactly {connectID, error: '', data: <the rest of the
 * message>}, so its payload can be passed on piece by piece as it arrives.
 * Anything else, or a header not wholly inside `buf[start..end)`, gives null.
 */
export function matchDataHeader(buf: Uint8Array, start: number, end: number, messageLength: number): DataHeader | null {
  const messageEnd = start + messageLength;
  if (end > messageEnd) end = messageEnd;
  if (end - start < 5 || buf[start] !== TAG_TYPE || buf[start + 1] !== DATA_TYPE || buf[start + 2] !== TAG_PAYLOAD) return null;
  const inner = peekVarint(buf, start + 3, end, 5);
  if (inner === null || inner[1] + inner[0] !== messageEnd) return null;
  let pos = inner[1];
  let connectID = 0;
  if (buf[pos] === TAG_CONNECT_ID) {
    // At most 7 bytes (< 2^49): decodeData refuses connectIDs beyond 2^53.
    const id = peekVarint(buf, pos + 1, end, 7);
    if (id === null) return null;
    connectID = id[0];
    pos = id[1];
  }
  if (pos >= end || buf[pos] !== TAG_DATA) return null;
  const len = peekVarint(buf, pos + 1, end, 5);
  if (len === null || len[1] + len[0] !== messageEnd) return null;
  return { connectID, headerBytes: len[1] - start };
}
