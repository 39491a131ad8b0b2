/**
 * Hand-written protobuf codec for Packet. A generic protobuf library would
 * allocate an object per nested message and copy DATA payloads; this codec
 * decodes `data` as a view into the received buffer and encodes in one pass.
 * Conformance with the .proto is checked against protobufjs in the tests.
 */
import { isIP } from 'node:net';
import { PacketType, RESOLVE_BOUNDS, type DataPacket, type Packet } from './packet.js';
import { DATA_PAYLOAD_FIELD, decodeData, encodeData } from './data-frame.js';
import { bigVarintSize, PacketDecodeError, Reader, varintSize, WIRE_LEN, WIRE_VARINT, writeBigVarint, writeVarint } from './protobuf.js';

// Packet field numbers (oneof payload) by packet type.
const PAYLOAD_FIELD: Record<PacketType, number> = {
  [PacketType.DIAL_REQ]: 2,
  [PacketType.DIAL_RSP]: 3,
  [PacketType.DATA]: DATA_PAYLOAD_FIELD,
  [PacketType.CLOSE_REQ]: 5,
  [PacketType.CLOSE_RSP]: 6,
  [PacketType.DIAL_CLS]: 7,
  [PacketType.DRAIN]: 8,
  [PacketType.KANAL_WINDOW]: 100,
  [PacketType.KANAL_HALF_CLOSE]: 101,
  [PacketType.KANAL_RESUME]: 102,
  [PacketType.KANAL_RESUME_END]: 103,
  [PacketType.KANAL_RESOLVE_REQ]: 104,
  [PacketType.KANAL_RESOLVE_RSP]: 105,
};
const TYPE_BY_FIELD = new Map<number, PacketType>(Object.entries(PAYLOAD_FIELD).map(([t, f]) => [f, Number(t) as PacketType]));

// ---------- encoding ----------

class Writer {
  readonly buf: Buffer;
  pos: number;
  constructor(size: number, headroom: number) {
    this.buf = Buffer.allocUnsafe(headroom + size);
    this.pos = headroom;
  }
  varint(v: number): void {
    this.pos = writeVarint(this.buf, this.pos, v);
  }
  bigVarint(v: bigint): void {
    this.pos = writeBigVarint(this.buf, this.pos, v);
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

/** A repeated string field: every element is written, in order (proto3 never packs strings). */
function repeatedStringField(num: number, values: readonly string[]): Field | null {
  if (values.length === 0) return null;
  const tag = (num << 3) | WIRE_LEN;
  const lengths = values.map((v) => Buffer.byteLength(v, 'utf8'));
  let size = 0;
  for (const len of lengths) size += varintSize(tag) + varintSize(len) + len;
  return {
    size,
    write: (w) => values.forEach((v, i) => (w.varint(tag), w.varint(lengths[i]), w.string(v, lengths[i]))),
  };
}

function payloadFields(p: Exclude<Packet, DataPacket>): (Field | null)[] {
  switch (p.type) {
    case PacketType.DIAL_REQ:
      return [stringField(1, p.protocol), stringField(2, p.address), bigIntField(3, p.random)];
    case PacketType.DIAL_RSP:
      return [stringField(1, p.error), intField(2, p.connectID), bigIntField(3, p.random)];
    case PacketType.CLOSE_REQ:
      return [intField(1, p.connectID)];
    case PacketType.CLOSE_RSP:
      return [stringField(1, p.error), intField(2, p.connectID)];
    case PacketType.DIAL_CLS:
      return [bigIntField(1, p.random)];
    case PacketType.DRAIN:
      return [];
    case PacketType.KANAL_WINDOW:
      return [intField(1, p.connectID), intField(2, p.increment), intField(3, p.acknowledged ?? 0), intField(4, p.finReceived ? 1 : 0)];
    case PacketType.KANAL_HALF_CLOSE:
      return [intField(1, p.connectID)];
    case PacketType.KANAL_RESUME:
      return [
        intField(1, p.connectID),
        intField(2, p.received),
        intField(3, p.limit),
        intField(4, p.finReceived ? 1 : 0),
        bigIntField(5, p.dialID),
      ];
    case PacketType.KANAL_RESUME_END:
      return [];
    case PacketType.KANAL_RESOLVE_REQ:
      return [bigIntField(1, p.requestID), stringField(2, p.name), intField(3, p.timeoutMs ?? 0)];
    case PacketType.KANAL_RESOLVE_RSP:
      return [
        bigIntField(1, p.requestID),
        repeatedStringField(2, p.addresses),
        stringField(3, p.error),
        stringField(4, p.resolver),
        intField(5, p.ttl ?? 0),
      ];
  }
}

/**
 * Encodes a Packet as protobuf bytes (without gRPC framing), after
 * `headroom` bytes left for the caller (a gRPC message prefix).
 */
export function encodePacket(p: Packet, headroom = 0): Buffer {
  if (p.type === PacketType.DATA) return encodeData(p.connectID, p.error, p.data, headroom, true);
  const fields = payloadFields(p).filter((f): f is Field => f !== null);
  let inner = 0;
  for (const f of fields) inner += f.size;
  const typeField = intField(1, p.type);
  const payloadTag = (PAYLOAD_FIELD[p.type] << 3) | WIRE_LEN;
  // The payload message is always present (oneof set), even when empty.
  const total = (typeField?.size ?? 0) + varintSize(payloadTag) + varintSize(inner) + inner;
  const w = new Writer(total, headroom);
  typeField?.write(w);
  w.varint(payloadTag);
  w.varint(inner);
  for (const f of fields) f.write(w);
  return w.buf;
}

// ---------- decoding ----------

interface RawPayload {
  ints: Map<number, number>;
  bigs: Map<number, bigint>;
  strings: Map<number, string>;
  lists: Map<number, string[]>;
}

/** Packet types other than DATA (data-frame.ts decodes that one). */
type ControlType = Exclude<PacketType, PacketType.DATA>;

type FieldKind = 'int' | 'big' | 'string' | 'strings';

// Which fields of each payload message are int64-as-bigint, int, string, repeated string.
const SCHEMA: Record<ControlType, Record<number, FieldKind>> = {
  [PacketType.DIAL_REQ]: { 1: 'string', 2: 'string', 3: 'big' },
  [PacketType.DIAL_RSP]: { 1: 'string', 2: 'int', 3: 'big' },
  [PacketType.CLOSE_REQ]: { 1: 'int' },
  [PacketType.CLOSE_RSP]: { 1: 'string', 2: 'int' },
  [PacketType.DIAL_CLS]: { 1: 'big' },
  [PacketType.DRAIN]: {},
  [PacketType.KANAL_WINDOW]: { 1: 'int', 2: 'int', 3: 'int', 4: 'int' },
  [PacketType.KANAL_HALF_CLOSE]: { 1: 'int' },
  [PacketType.KANAL_RESUME]: { 1: 'int', 2: 'int', 3: 'int', 4: 'int', 5: 'big' },
  [PacketType.KANAL_RESUME_END]: {},
  [PacketType.KANAL_RESOLVE_REQ]: { 1: 'big', 2: 'string', 3: 'int' },
  [PacketType.KANAL_RESOLVE_RSP]: { 1: 'big', 2: 'strings', 3: 'string', 4: 'string', 5: 'int' },
};

/**
 * Bounds of text fields (bytes) and repeated fields (elements) a peer may
 * send; beyond them the packet is malformed. Upstream's messages have none
 * here: their fields are bounded by the message size alone.
 */
const MAX_BYTES: Partial<Record<ControlType, Record<number, number>>> = {
  [PacketType.KANAL_RESOLVE_REQ]: { 2: RESOLVE_BOUNDS.nameBytes },
  [PacketType.KANAL_RESOLVE_RSP]: { 2: 64, 3: RESOLVE_BOUNDS.textBytes, 4: RESOLVE_BOUNDS.textBytes },
};
const MAX_ELEMENTS: Partial<Record<ControlType, Record<number, number>>> = {
  [PacketType.KANAL_RESOLVE_RSP]: { 2: RESOLVE_BOUNDS.addresses },
};

function decodePayload(type: ControlType, buf: Uint8Array, start: number, end: number): RawPayload {
  const schema = SCHEMA[type];
  const maxBytes = MAX_BYTES[type];
  const out: RawPayload = { ints: new Map(), bigs: new Map(), strings: new Map(), lists: new Map() };
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
    const want = kind === 'string' || kind === 'strings' ? WIRE_LEN : WIRE_VARINT;
    const name = PacketType[type];
    if (wt !== want) throw new PacketDecodeError(`field ${num} of ${name} has wire type ${wt}`);
    // int64 fields may legally carry negative values; connectIDs never do.
    if (kind === 'int') out.ints.set(num, r.safeInt(num, name));
    else if (kind === 'big') out.bigs.set(num, r.bigVarint());
    else if (kind === 'string') out.strings.set(num, r.utf8(num, name, maxBytes?.[num]));
    else repeated(out.lists, num, r.utf8(num, name, maxBytes?.[num]), MAX_ELEMENTS[type]?.[num] ?? Infinity, name);
  }
  return out;
}

function repeated(lists: Map<number, string[]>, num: number, value: string, max: number, message: string): void {
  const list = lists.get(num) ?? [];
  if (list.length >= max) throw new PacketDecodeError(`field ${num} of ${message} has more than ${max} elements`);
  list.push(value);
  lists.set(num, list);
}

/** Each of `addresses` must be an IP literal: a resolver's answer, never a name to resolve again. */
function ipLiterals(addresses: string[]): string[] {
  for (const a of addresses) {
    if (isIP(a) === 0) throw new PacketDecodeError(`address ${JSON.stringify(a.slice(0, 64))} of KANAL_RESOLVE_RSP is not an IP literal`);
  }
  return addresses;
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
  if (!(type in PAYLOAD_FIELD)) throw new PacketDecodeError(`unknown packet type ${type}`);
  const ptype = type as PacketType;
  const expected = PAYLOAD_FIELD[ptype];
  if (payload !== null && payloadField !== expected) {
    throw new PacketDecodeError(`packet type ${PacketType[ptype]} carries payload field ${payloadField}`);
  }
  if (ptype === PacketType.DATA) return payload ? decodeData(buf, payload[0], payload[1]) : decodeData(buf, 0, 0);
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
    case PacketType.KANAL_WINDOW: {
      const window: Packet = { type: ptype, connectID: int(1), increment: int(2) };
      // Present only when set: a peer without resume sends neither.
      if (int(3) !== 0) window.acknowledged = int(3);
      if (int(4) !== 0) window.finReceived = true;
      return window;
    }
    case PacketType.KANAL_HALF_CLOSE:
      return { type: ptype, connectID: int(1) };
    case PacketType.KANAL_RESUME:
      return { type: ptype, connectID: int(1), received: int(2), limit: int(3), finReceived: int(4) !== 0, dialID: big(5) };
    case PacketType.KANAL_RESUME_END:
      return { type: ptype };
    case PacketType.KANAL_RESOLVE_REQ: {
      const req: Packet = { type: ptype, requestID: big(1), name: str(2) };
      if (int(3) !== 0) req.timeoutMs = int(3);
      return req;
    }
    case PacketType.KANAL_RESOLVE_RSP: {
      const rsp: Packet = { type: ptype, requestID: big(1), addresses: ipLiterals(f.lists.get(2) ?? []), error: str(3), resolver: str(4) };
      if (int(5) !== 0) rsp.ttl = int(5);
      return rsp;
    }
  }
}
