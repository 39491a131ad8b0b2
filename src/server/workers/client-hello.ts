/**
 * The server name (SNI) of a TLS ClientHello, read before any TLS library
 * sees the connection, so the process that owns a tenant's agent port
 * connections can hand each to the worker serving that tenant
 * (docs/multi-tenant.md, "Workers"). RFC 8446 section 4.1.2 (ClientHello)
 * and RFC 6066 section 3 (server_name). Bounded: at most one record of
 * MAX_HELLO_BYTES; anything malformed is "no name" (the worker's TLS
 * handshake then refuses it with its usual log line).
 */

/** A ClientHello fits one TLS record (16 KiB, RFC 8446 section 5.1); post-quantum key shares keep it near 2 KiB. */
export const MAX_HELLO_BYTES = 5 + 16 * 1024;

export type HelloRead =
  /** More bytes are needed. */
  | { kind: 'more' }
  /** The ClientHello was read: its host name, if it names one. */
  | { kind: 'done'; serverName?: string }
  /** Not a TLS handshake record (or too long): no name to route by. */
  | { kind: 'not-tls' };

class Reader {
  pos: number;
  constructor(
    private readonly buf: Buffer,
    start: number,
    private readonly end: number,
  ) {
    this.pos = start;
  }
  u8(): number {
    if (this.pos + 1 > this.end) throw new RangeError('short');
    return this.buf[this.pos++];
  }
  u16(): number {
    if (this.pos + 2 > this.end) throw new RangeError('short');
    const v = this.buf.readUInt16BE(this.pos);
    this.pos += 2;
    return v;
  }
  u24(): number {
    return (this.u8() << 16) | this.u16();
  }
  skip(n: number): void {
    if (this.pos + n > this.end) throw new RangeError('short');
    this.pos += n;
  }
  bytes(n: number): Buffer {
    this.skip(n);
    return this.buf.subarray(this.pos - n, this.pos);
  }
}

/** What the bytes received so far say (`head`: every byte from the start of the connection). */
export function readClientHello(head: Buffer): HelloRead {
  if (head.length < 5) return head.length > 0 && head[0] !== 0x16 ? { kind: 'not-tls' } : { kind: 'more' };
  if (head[0] !== 0x16 || head[1] !== 0x03) return { kind: 'not-tls' };
  const recordLength = head.readUInt16BE(3);
  if (recordLength > MAX_HELLO_BYTES - 5) return { kind: 'not-tls' };
  if (head.length < 5 + recordLength) return { kind: 'more' };
  try {
    return { kind: 'done', ...serverNameOf(new Reader(head, 5, 5 + recordLength)) };
  } catch {
    // A ClientHello split over several records, or a malformed one: the worker's handshake decides.
    return { kind: 'done' };
  }
}

function serverNameOf(r: Reader): { serverName?: string } {
  if (r.u8() !== 0x01) return {}; // not a ClientHello
  r.u24(); // its length: bounded by the record's below
  r.skip(2 + 32); // legacy_version, random
  r.skip(r.u8()); // legacy_session_id
  r.skip(r.u16()); // cipher_suites
  r.skip(r.u8()); // legacy_compression_methods
  const extensionsEnd = r.u16() + r.pos;
  while (r.pos + 4 <= extensionsEnd) {
    const type = r.u16();
    const length = r.u16();
    if (type !== 0x0000) {
      r.skip(length);
      continue;
    }
    const listEnd = r.u16() + r.pos;
    while (r.pos + 3 <= listEnd) {
      const nameType = r.u8();
      const name = r.bytes(r.u16());
      if (nameType === 0x00) return { serverName: name.toString('latin1').toLowerCase() };
    }
    return {};
  }
  return {};
}
