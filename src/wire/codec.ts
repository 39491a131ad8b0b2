/**
 * Hand-written protobuf codec for Packet. A generic protobuf library would
 * allocate an object per nested message and copy DATA payloads; this codec
 * decodes `data` as a view into the received buffer and encodes in one pass.
 * Conformance with the .proto is checked against protobufjs in the tests.
 */
import { PacketType, type Packet } from './packet.js';

export class PacketDecodeError extends Error {
  override name = 'PacketDecodeError';
}

const WIRE_VARINT = 0;
const WIRE_I64 = 1;
const WIRE_LEN = 2;
const WIRE_I32 = 5;

// Packet field numbers (oneof payload) by packet type.
const PAYLOAD_FIELD: Record<PacketType, number> = {
  [PacketType.DIAL_REQ]: 2,
  [PacketType.DIAL_RSP]: 3,
  [PacketType.DATA]: 4,
  [PacketType.CLOSE_REQ]: 5,
  [PacketType.CLOSE_RSP]: 6,
  [PacketType.DIAL_CLS]: 7,
  [PacketType.DRAIN]: 8,
  [PacketType.KANAL_WINDOW]: 100,
  [PacketType.KANAL_HALF_CLOSE]: 101,
};
const TYPE_BY_FIELD = new Map<number, PacketType>(
  Object.entries(PAYLOAD_FIELD).map(([t, f]) => [f, Number(t) as PacketType]),
);

// ---------- encoding ----------

function varintSize(v: number): number {
  if (v < 0) return 10; // negative int64 is always ten bytes
  let n = 1;
  while (v >= 0x80) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

function bigVarintSize(v: bigint): number {
  let u = BigInt.asUintN(64, v);
  let n = 1;
  while (u >= 0x80n) {
    u >>= 7n;
    n++;
  }
  return n;
}

class Writer {
  readonly buf: Buffer;
  pos = 0;
  constructor(size: number) {
    this.buf = Buffer.allocUnsafe(size);
  }
  byte(b: number): void {
    this.buf[this.pos++] = b;
  }
  varint(v: number): void {
    if (v < 0) {
      this.bigVarint(BigInt(v));
      return;
    }
    while (v >= 0x80) {
      this.buf[this.pos++] = (v % 128) | 0x80;
      v = Math.floor(v / 128);
    }
    this.buf[this.pos++] = v;
  }
  bigVarint(v: bigint): void {
    let u = BigInt.asUintN(64, v);
    while (u >= 0x80n) {
      this.buf[this.pos++] = Number(u & 0x7fn) | 0x80;
      u >>= 7n;
    }
    this.buf[this.pos++] = Number(u);
  }
  bytes(b: Uint8Array): void {
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }
  string(s: string, byteLength: number): void {
    this.pos += this.buf.write(s, this.pos, byteLength, 'utf8');
  }
}

/** Field encoders for scalar fields that proto3 omits at their default. */
interface Field {
  size: number;
  write(w: Writer): void;
}

function intField(num: number, v: number): Field | null {
  if (v === 0) return null;
  const tag = (num << 3) | WIRE_VARINT;
  return { size: varintSize(tag) + varintSize(v), write: (w) => (w.varint(tag), w.varint(v)) };
}

function bigIntField(num: number, v: bigint): Field | null {
  if (v === 0n) return null;
  const tag = (num << 3) | WIRE_VARINT;
  return { size: varintSize(tag) + bigVarintSize(v), write: (w) => (w.varint(tag), w.bigVarint(v)) };
}

function stringField(num: number, s: string): Field | null {
  if (s.length === 0) return null;
  const len = Buffer.byteLength(s, 'utf8');
  const tag = (num << 3) | WIRE_LEN;
  return {
    size: varintSize(tag) + varintSize(len) + len,
    write: (w) => (w.varint(tag), w.varint(len), w.string(s, len)),
  };
}

function bytesField(num: number, b: Uint8Array): Field | null {
  if (b.length === 0) return null;
  const tag = (num << 3) | WIRE_LEN;
  return {
    size: varintSize(tag) + varintSize(b.length) + b.length,
    write: (w) => (w.varint(tag), w.varint(b.length), w.bytes(b)),
  };
}

function payloadFields(p: Packet): (Field | null)[] {
  switch (p.type) {
    case PacketType.DIAL_REQ:
      return [stringField(1, p.protocol), stringField(2, p.address), bigIntField(3, p.random)];
    case PacketType.DIAL_RSP:
      return [stringField(1, p.error), intField(2, p.connectID), bigIntField(3, p.random)];
    case PacketType.CLOSE_REQ:
      return [intField(1, p.connectID)];
    case PacketType.CLOSE_RSP:
      return [stringField(1, p.error), intField(2, p.connectID)];
    case PacketType.DATA:
      return [intField(1, p.connectID), stringField(2, p.error), bytesField(3, p.data)];
    case PacketType.DIAL_CLS:
      return [bigIntField(1, p.random)];
    case PacketType.DRAIN:
      return [];
    case PacketType.KANAL_WINDOW:
      return [intField(1, p.connectID), intField(2, p.increment)];
    case PacketType.KANAL_HALF_CLOSE:
      return [intField(1, p.connectID)];
  }
}

/** Encodes a Packet as protobuf bytes (without gRPC framing). */
export function encodePacket(p: Packet): Buffer {
  const fields = payloadFields(p).filter((f): f is Field => f !== null);
  let inner = 0;
  for (const f of fields) inner += f.size;
  const typeField = intField(1, p.type);
  const payloadTag = (PAYLOAD_FIELD[p.type] << 3) | WIRE_LEN;
  // The payload message is always present (oneof set), even when empty.
  const total = (typeField?.size ?? 0) + varintSize(payloadTag) + varintSize(inner) + inner;
  const w = new Writer(total);
  typeField?.write(w);
  w.varint(payloadTag);
  w.varint(inner);
  for (const f of fields) f.write(w);
  return w.buf;
}

// ---------- decoding ----------

class Reader {
  pos: number;
  constructor(
    readonly buf: Uint8Array,
    start: number,
    readonly end: number,
  ) {
    this.pos = start;
  }
  varint(): number {
    let result = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new PacketDecodeError('truncated varint');
      const b = this.buf[this.pos++]!;
      result += (b & 0x7f) * mul;
      if (b < 0x80) {
        if (i === 9 || result > Number.MAX_SAFE_INTEGER) {
          throw new PacketDecodeError('integer out of range');
        }
        return result;
      }
      mul *= 128;
    }
    throw new PacketDecodeError('varint too long');
  }
  bigVarint(): bigint {
    let result = 0n;
    let shift = 0n;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new PacketDecodeError('truncated varint');
      const b = this.buf[this.pos++]!;
      result |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return BigInt.asIntN(64, result);
      shift += 7n;
    }
    throw new PacketDecodeError('varint too long');
  }
  lengthDelimited(): [number, number] {
    const len = this.varint();
    const start = this.pos;
    if (len > this.end - start) throw new PacketDecodeError('truncated field');
    this.pos += len;
    return [start, start + len];
  }
  skip(wireType: number): void {
    switch (wireType) {
      case WIRE_VARINT:
        this.bigVarint();
        return;
      case WIRE_I64:
        this.advance(8);
        return;
      case WIRE_LEN:
        this.lengthDelimited();
        return;
      case WIRE_I32:
        this.advance(4);
        return;
      default:
        throw new PacketDecodeError(`unsupported wire type ${wireType}`);
    }
  }
  private advance(n: number): void {
    if (this.end - this.pos < n) throw new PacketDecodeError('truncated field');
    this.pos += n;
  }
}

interface RawPayload {
  ints: Map<number, number>;
  bigs: Map<number, bigint>;
  strings: Map<number, string>;
  bytes: Map<number, Uint8Array>;
}

// Which fields of each payload message are int64-as-bigint, int, string, bytes.
const SCHEMA: Record<PacketType, Record<number, 'int' | 'big' | 'string' | 'bytes'>> = {
  [PacketType.DIAL_REQ]: { 1: 'string', 2: 'string', 3: 'big' },
  [PacketType.DIAL_RSP]: { 1: 'string', 2: 'int', 3: 'big' },
  [PacketType.CLOSE_REQ]: { 1: 'int' },
  [PacketType.CLOSE_RSP]: { 1: 'string', 2: 'int' },
  [PacketType.DATA]: { 1: 'int', 2: 'string', 3: 'bytes' },
  [PacketType.DIAL_CLS]: { 1: 'big' },
  [PacketType.DRAIN]: {},
  [PacketType.KANAL_WINDOW]: { 1: 'int', 2: 'int' },
  [PacketType.KANAL_HALF_CLOSE]: { 1: 'int' },
};

const utf8 = new TextDecoder('utf-8', { fatal: true });

function decodePayload(type: PacketType, buf: Uint8Array, start: number, end: number): RawPayload {
  const schema = SCHEMA[type];
  const out: RawPayload = { ints: new Map(), bigs: new Map(), strings: new Map(), bytes: new Map() };
  const r = new Reader(buf, start, end);
  while (r.pos < end) {
    const tag = r.varint();
    const num = Math.floor(tag / 8);
    const wt = tag & 7;
    const kind = schema[num];
    if (kind === undefined) {
      r.skip(wt);
      continue;
    }
    const want = kind === 'string' || kind === 'bytes' ? WIRE_LEN : WIRE_VARINT;
    if (wt !== want) throw new PacketDecodeError(`field ${num} of ${PacketType[type]} has wire type ${wt}`);
    if (kind === 'int') {
      // int64 fields may legally carry negative values; connectIDs never do.
      const v = r.bigVarint();
      if (v < 0n || v > BigInt(Number.MAX_SAFE_INTEGER)) {
        throw new PacketDecodeError(`field ${num} of ${PacketType[type]} out of range`);
      }
      out.ints.set(num, Number(v));
    } else if (kind === 'big') {
      out.bigs.set(num, r.bigVarint());
    } else {
      const [s, e] = r.lengthDelimited();
      if (kind === 'bytes') {
        out.bytes.set(num, buf.subarray(s, e));
      } else {
        try {
          out.strings.set(num, utf8.decode(buf.subarray(s, e)));
        } catch {
          throw new PacketDecodeError(`field ${num} of ${PacketType[type]} is not valid UTF-8`);
        }
      }
    }
  }
  return out;
}

/**
 * decodePayload for DATA, the packet on the bulk path: the same checks,
 * without building maps for every packet.
 */
function decodeDataPayload(buf: Uint8Array, start: number, end: number): Packet {
  let connectID = 0;
  let error = '';
  let data: Uint8Array = EMPTY;
  const r = new Reader(buf, start, end);
  while (r.pos < end) {
    const tag = r.varint();
    const num = Math.floor(tag / 8);
    const wt = tag & 7;
    if (num < 1 || num > 3) {
      r.skip(wt);
      continue;
    }
    const want = num === 1 ? WIRE_VARINT : WIRE_LEN;
    if (wt !== want) throw new PacketDecodeError(`field ${num} of DATA has wire type ${wt}`);
    if (num === 1) {
      const v = r.bigVarint();
      if (v < 0n || v > BigInt(Number.MAX_SAFE_INTEGER)) throw new PacketDecodeError('field 1 of DATA out of range');
      connectID = Number(v);
    } else {
      const [s, e] = r.lengthDelimited();
      if (num === 3) {
        data = buf.subarray(s, e);
      } else {
        try {
          error = utf8.decode(buf.subarray(s, e));
        } catch {
          throw new PacketDecodeError('field 2 of DATA is not valid UTF-8');
        }
      }
    }
  }
  return { type: PacketType.DATA, connectID, error, data };
}

const EMPTY = new Uint8Array(0);

/** Where the payload of a DATA message starts, as found by matchDataHeader. */
export interface DataHeader {
  connectID: number;
  /** Bytes before the payload; the payload runs from there to the end of the message. */
  headerBytes: number;
}

/** Reads a varint of at most `maxBytes` bytes at buf[pos..end), or gives null. */
function peekVarint(buf: Uint8Array, pos: number, end: number, maxBytes: number): [value: number, next: number] | null {
  let value = 0;
  let mul = 1;
  for (let i = 0; i < maxBytes && pos < end; i++) {
    const b = buf[pos++]!;
    value += (b & 0x7f) * mul;
    if (b < 0x80) return [value, pos];
    mul *= 128;
  }
  return null;
}

/**
 * Recognises the start of a DATA message laid out the way every encoder
 * writes it — Packet{type=DATA, data=Data{connectID?, data}} with the payload
 * as the last field — from its first bytes `buf[start..end)`, when the
 * message is `messageLength` bytes long. Such a message decodes (decodePacket)
 * to exactly {connectID, error: '', data: <the rest of the message>}, so its
 * payload can be passed on piece by piece as it arrives. Anything else, or a
 * header not wholly inside `buf[start..end)`, gives null.
 */
export function matchDataHeader(buf: Uint8Array, start: number, end: number, messageLength: number): DataHeader | null {
  const messageEnd = start + messageLength;
  if (end > messageEnd) end = messageEnd;
  // 0x08 0x04: type = DATA; 0x22: field 4 (data), length-delimited.
  if (end - start < 5 || buf[start] !== 0x08 || buf[start + 1] !== PacketType.DATA || buf[start + 2] !== 0x22) return null;
  const inner = peekVarint(buf, start + 3, end, 5);
  if (inner === null || inner[1] + inner[0] !== messageEnd) return null;
  let pos = inner[1];
  let connectID = 0;
  if (buf[pos] === 0x08) {
    // At most 7 bytes (< 2^49): the decoder refuses connectIDs beyond 2^53.
    const id = peekVarint(buf, pos + 1, end, 7);
    if (id === null) return null;
    connectID = id[0];
    pos = id[1];
  }
  if (pos >= end || buf[pos] !== 0x1a) return null;
  const len = peekVarint(buf, pos + 1, end, 5);
  if (len === null || len[1] + len[0] !== messageEnd) return null;
  return { connectID, headerBytes: len[1] - start };
}

/**
 * Decodes protobuf bytes into a Packet. Throws PacketDecodeError on malformed
 * input and on packet types this implementation does not know (the caller
 * decides whether that is fatal).
 */
export function decodePacket(buf: Uint8Array): Packet {
  const r = new Reader(buf, 0, buf.length);
  let type = 0;
  let payloadField = 0;
  let payload: [number, number] | null = null;
  while (r.pos < buf.length) {
    const tag = r.varint();
    const num = Math.floor(tag / 8);
    const wt = tag & 7;
    if (num === 1 && wt === WIRE_VARINT) {
      type = r.varint();
    } else if (TYPE_BY_FIELD.has(num) && wt === WIRE_LEN) {
      // Last oneof member wins, as in every protobuf implementation.
      payloadField = num;
      payload = r.lengthDelimited();
    } else {
      r.skip(wt);
    }
  }
  if (!(type in SCHEMA)) throw new PacketDecodeError(`unknown packet type ${type}`);
  const ptype = type as PacketType;
  const expected = PAYLOAD_FIELD[ptype];
  if (payload !== null && payloadField !== expected) {
    throw new PacketDecodeError(`packet type ${PacketType[ptype]} carries payload field ${payloadField}`);
  }
  if (ptype === PacketType.DATA) return payload ? decodeDataPayload(buf, payload[0], payload[1]) : decodeDataPayload(buf, 0, 0);
  const f = payload ? decodePayload(ptype, buf, payload[0], payload[1]) : decodePayload(ptype, buf, 0, 0);
  const int = (n: number): number => f.ints.get(n) ?? 0;
  const big = (n: number): bigint => f.bigs.get(n) ?? 0n;
  const str = (n: number): string => f.strings.get(n) ?? '';
  switch (ptype) {
    case PacketType.DIAL_REQ:
      return { type: ptype, protocol: str(1), address: str(2), random: big(3) };
    case PacketType.DIAL_RSP:
      return { type: ptype, error: str(1), connectID: int(2), random: big(3) };
    case PacketType.CLOSE_REQ:
      return { type: ptype, connectID: int(1) };
    case PacketType.CLOSE_RSP:
      return { type: ptype, error: str(1), connectID: int(2) };
    case PacketType.DIAL_CLS:
      return { type: ptype, random: big(1) };
    case PacketType.DRAIN:
      return { type: ptype };
    case PacketType.KANAL_WINDOW:
      return { type: ptype, connectID: int(1), increment: int(2) };
    case PacketType.KANAL_HALF_CLOSE:
      return { type: ptype, connectID: int(1) };
  }
}
