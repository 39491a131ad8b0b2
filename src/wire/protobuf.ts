/**
 * Protobuf wire primitives (https://protobuf.dev/programming-guides/encoding/)
 * shared by codec.ts (every packet) and data-frame.ts (DATA): varints,
 * wire types, and a bounds-checked reader that throws PacketDecodeError.
 */

export class PacketDecodeError extends Error {
  override name = 'PacketDecodeError';
}

export const WIRE_VARINT = 0;
export const WIRE_I64 = 1;
export const WIRE_LEN = 2;
export const WIRE_I32 = 5;

/** A field's tag: its number and wire type in one varint. */
export function tag(field: number, wireType: number): number {
  return field * 8 + wireType;
}

/** Bytes of `v` as a varint; a negative int64 is always ten. */
export function varintSize(v: number): number {
  if (v < 0) return 10;
  let n = 1;
  while (v >= 0x80) {
    v = Math.floor(v / 128);
    n++;
  }
  return n;
}

export function bigVarintSize(v: bigint): number {
  let u = BigInt.asUintN(64, v);
  let n = 1;
  while (u >= 0x80n) {
    u >>= 7n;
    n++;
  }
  return n;
}

/** Writes `v` as a varint at buf[pos] (negative as two's-complement int64); returns the position after it. */
export function writeVarint(buf: Uint8Array, pos: number, v: number): number {
  if (v < 0) return writeBigVarint(buf, pos, BigInt(v));
  while (v >= 0x80) {
    buf[pos++] = (v % 128) | 0x80;
    v = Math.floor(v / 128);
  }
  buf[pos++] = v;
  return pos;
}

export function writeBigVarint(buf: Uint8Array, pos: number, v: bigint): number {
  let u = BigInt.asUintN(64, v);
  while (u >= 0x80n) {
    buf[pos++] = Number(u & 0x7fn) | 0x80;
    u >>= 7n;
  }
  buf[pos++] = Number(u);
  return pos;
}

/**
 * Reads a varint of at most `maxBytes` bytes at buf[pos..end) without
 * throwing: null when it does not end within them (for matchers that decline
 * rather than refuse).
 */
export function peekVarint(buf: Uint8Array, pos: number, end: number, maxBytes: number): [value: number, next: number] | null {
  let value = 0;
  let mul = 1;
  for (let i = 0; i < maxBytes && pos < end; i++) {
    const b = buf[pos++];
    value += (b & 0x7f) * mul;
    if (b < 0x80) return [value, pos];
    mul *= 128;
  }
  return null;
}

/** Reads buf[start..end); every read past `end` throws PacketDecodeError. */
export class Reader {
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
      const b = this.buf[this.pos++];
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
      const b = this.buf[this.pos++];
      result |= BigInt(b & 0x7f) << shift;
      if (b < 0x80) return BigInt.asIntN(64, result);
      shift += 7n;
    }
    throw new PacketDecodeError('varint too long');
  }
  /** Field `field` of `message`, an int64 that must hold a safe non-negative number (connectIDs, counts). */
  safeInt(field: number, message: string): number {
    const v = this.bigVarint();
    if (v < 0n || v > BigInt(Number.MAX_SAFE_INTEGER)) throw new PacketDecodeError(`field ${field} of ${message} out of range`);
    return Number(v);
  }
  lengthDelimited(): [number, number] {
    const len = this.varint();
    const start = this.pos;
    if (len > this.end - start) throw new PacketDecodeError('truncated field');
    this.pos += len;
    return [start, start + len];
  }
  /** Field `field` of `message`, length-delimited, as UTF-8 text of at most `maxBytes` bytes. */
  utf8(field: number, message: string, maxBytes = Infinity): string {
    const [s, e] = this.lengthDelimited();
    if (e - s > maxBytes) throw new PacketDecodeError(`field ${field} of ${message} is longer than ${maxBytes} bytes`);
    try {
      return UTF8.decode(this.buf.subarray(s, e));
    } catch {
      throw new PacketDecodeError(`field ${field} of ${message} is not valid UTF-8`);
    }
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

const UTF8 = new TextDecoder('utf-8', { fatal: true });
