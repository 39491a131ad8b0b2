/**
 * Fuzz targets: every parser a peer feeds, each with the properties it must
 * keep for any bytes (docs/fuzzing.md lists them). A target throws
 * PropertyViolation when a property fails; any other exception escaping it
 * (a TypeError or RangeError from deep inside a parser) is a finding too.
 */
import { isIP } from 'node:net';
import {
  parseAgentIdentifiers,
  canonicalHost,
  prefixContains,
  MAX_IDENTIFIER_VALUES,
  type AgentIdentifiers,
} from '../../src/wire/agent-identifiers.js';
import { DEFAULT_MAX_HEADERS, RequestHeadParser, type HeadVerdict } from '../../src/server/frontends/request-head.js';
import { framePacket, MessageParser, MESSAGE_PREFIX_BYTES } from '../../src/transport/h2/framing.js';
import {
  decodeGrpcMessage,
  encodeGrpcMessage,
  formatGrpcTimeout,
  metadataFromRawHeaders,
  parseGrpcStatus,
  parseGrpcTimeout,
} from '../../src/transport/h2/grpc-headers.js';
import { GrpcStatus } from '../../src/transport/transport.js';
import { decodePacket, encodePacket } from '../../src/wire/codec.js';
import { encodeData, matchDataHeader } from '../../src/wire/data-frame.js';
import { ALL_FEATURES, formatFeatures, parseFeatures } from '../../src/wire/features.js';
import { firstValue } from '../../src/wire/metadata.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { PacketDecodeError } from '../../src/wire/protobuf.js';
import type { FuzzTarget } from './engine.js';

export class PropertyViolation extends Error {
  override name = 'PropertyViolation';
}

function check(cond: boolean, what: string): asserts cond {
  if (!cond) throw new PropertyViolation(what);
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  return Buffer.compare(Buffer.from(a.buffer, a.byteOffset, a.length), Buffer.from(b.buffer, b.byteOffset, b.length)) === 0;
}

function show(v: unknown): string {
  return JSON.stringify(v, (_k, x: unknown) =>
    typeof x === 'bigint' ? `${x}n` : x instanceof Uint8Array ? Buffer.from(x).toString('hex') : x,
  );
}

/** Field-by-field equality of two packets (bigints, byte views). */
function samePacket(a: Packet, b: Packet): boolean {
  const ka = Object.keys(a).sort();
  const kb = Object.keys(b).sort();
  if (ka.join() !== kb.join()) return false;
  const ra = a as unknown as Record<string, unknown>;
  const rb = b as unknown as Record<string, unknown>;
  return ka.every((k) => {
    const x = ra[k];
    const y = rb[k];
    if (x instanceof Uint8Array && y instanceof Uint8Array) return sameBytes(x, y);
    if (Array.isArray(x) && Array.isArray(y)) return x.length === y.length && x.every((v, i) => v === y[i]);
    return x === y;
  });
}

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const INT64_MIN = -(1n << 63n);
const INT64_MAX = (1n << 63n) - 1n;

/** Range facts every decoded packet must satisfy (the codec's own contract, packet.ts). */
function checkShape(p: Packet): void {
  const r = p as unknown as Record<string, unknown>;
  for (const k of ['connectID', 'increment']) {
    if (k in r) check(Number.isSafeInteger(r[k]) && (r[k] as number) >= 0, `${k} ${String(r[k])} is not a safe non-negative integer`);
  }
  if ('random' in r)
    check(typeof r.random === 'bigint' && r.random >= INT64_MIN && r.random <= INT64_MAX, `random ${String(r.random)} is not an int64`);
  for (const k of ['protocol', 'address', 'error', 'name', 'resolver']) if (k in r) check(typeof r[k] === 'string', `${k} is not a string`);
  if ('addresses' in r) {
    const a = r.addresses;
    check(
      Array.isArray(a) && a.length <= 16 && a.every((x) => typeof x === 'string' && isIP(x) !== 0),
      'addresses are not up to 16 IP literals',
    );
  }
}

/**
 * Everything the sending side does with a packet must give it back:
 * decode(encode(p)) is p, encoding is canonical (stable), and the gRPC frame
 * is the 5-byte prefix plus exactly encodePacket(p) (framing.ts).
 */
function checkRoundTrip(p: Packet): void {
  const enc = encodePacket(p);
  let back: Packet;
  try {
    back = decodePacket(enc);
  } catch (err) {
    throw new PropertyViolation(`decodePacket refuses encodePacket(${show(p)}): ${(err as Error).message}`);
  }
  check(samePacket(back, p), `decode(encode(p)) differs: ${show(p)} -> ${show(back)}`);
  check(sameBytes(encodePacket(back), enc), `encoding is not stable for ${show(p)}`);
  const headroom = encodePacket(p, 3);
  check(
    headroom.length === enc.length + 3 && sameBytes(headroom.subarray(3), enc),
    'encodePacket with headroom differs after the headroom',
  );
  const frame = Buffer.concat(framePacket(p));
  check(
    frame[0] === 0 && frame.readUInt32BE(1) === enc.length,
    `gRPC prefix ${frame.subarray(0, 5).toString('hex')} does not announce ${enc.length} bytes`,
  );
  check(sameBytes(frame.subarray(MESSAGE_PREFIX_BYTES), enc), 'framePacket body is not encodePacket(p)');
}

/** Reads structured values out of fuzz bytes (as libFuzzer's FuzzedDataProvider does); zeros when they run out. */
class Take {
  private pos = 0;
  constructor(private readonly d: Uint8Array) {}
  get left(): number {
    return this.d.length - this.pos;
  }
  byte(): number {
    return this.pos < this.d.length ? this.d[this.pos++] : 0;
  }
  bytes(n: number): Uint8Array {
    const out = this.d.subarray(this.pos, Math.min(this.d.length, this.pos + n));
    this.pos += out.length;
    return out;
  }
  big(): bigint {
    let v = 0n;
    for (let i = 0; i < 8; i++) v = (v << 8n) | BigInt(this.byte());
    return BigInt.asIntN(64, v);
  }
  /** A non-negative safe integer, often a small or boundary one. */
  safe(): number {
    const sel = this.byte();
    if (sel < 64) return sel;
    if (sel < 96) return [127, 128, 16383, 16384, 2 ** 32 - 1, 2 ** 32, 2 ** 49, Number.MAX_SAFE_INTEGER][sel & 7];
    return Number(BigInt.asUintN(64, this.big()) % (SAFE + 1n));
  }
  /** A well-formed string (the codec's inputs are; lone surrogates are not text). */
  text(): string {
    return new TextDecoder().decode(this.bytes(this.byte() % 64));
  }
}

function packetFrom(t: Take): Packet {
  const types = [
    PacketType.DIAL_REQ,
    PacketType.DIAL_RSP,
    PacketType.CLOSE_REQ,
    PacketType.CLOSE_RSP,
    PacketType.DATA,
    PacketType.DIAL_CLS,
    PacketType.DRAIN,
    PacketType.KANAL_WINDOW,
    PacketType.KANAL_HALF_CLOSE,
    PacketType.KANAL_RESUME,
    PacketType.KANAL_RESUME_END,
    PacketType.KANAL_RESOLVE_REQ,
    PacketType.KANAL_RESOLVE_RSP,
  ] as const;
  const type = types[t.byte() % types.length];
  switch (type) {
    case PacketType.DIAL_REQ:
      return { type, protocol: t.text(), address: t.text(), random: t.big() };
    case PacketType.DIAL_RSP:
      return { type, error: t.text(), connectID: t.safe(), random: t.big() };
    case PacketType.CLOSE_REQ:
      return { type, connectID: t.safe() };
    case PacketType.CLOSE_RSP:
      return { type, error: t.text(), connectID: t.safe() };
    case PacketType.DATA: {
      const connectID = t.safe();
      const error = t.byte() < 200 ? '' : t.text();
      const sizes = [0, 1, 127, 128, 1023, 1024, 1025, 16384, 65536];
      const sel = t.byte();
      const n = sel < 128 ? t.left : sizes[sel % sizes.length];
      const data = new Uint8Array(n);
      data.set(t.bytes(n));
      return { type, connectID, error, data };
    }
    case PacketType.DIAL_CLS:
      return { type, random: t.big() };
    case PacketType.DRAIN:
      return { type };
    case PacketType.KANAL_WINDOW:
      return { type, connectID: t.safe(), increment: t.safe() };
    case PacketType.KANAL_HALF_CLOSE:
      return { type, connectID: t.safe() };
    case PacketType.KANAL_RESUME:
      return { type, connectID: t.safe(), received: t.safe(), limit: t.safe(), finReceived: t.byte() > 127, dialID: t.big() };
    case PacketType.KANAL_RESUME_END:
      return { type };
    case PacketType.KANAL_RESOLVE_REQ: {
      const req: Packet = { type, requestID: t.big(), name: t.text() };
      const timeoutMs = t.byte() * 100;
      if (timeoutMs > 0) req.timeoutMs = timeoutMs;
      return req;
    }
    case PacketType.KANAL_RESOLVE_RSP: {
      // Only what a sender may send: IP literals, at most 16 (the decoder refuses the rest).
      const addresses = Array.from({ length: t.byte() % 17 }, () => {
        const b = t.bytes(4);
        return b.length === 4 && b[0] > 127 ? `fd00::${b[1].toString(16)}` : `10.${b[1] ?? 0}.${b[2] ?? 0}.${b[3] ?? 0}`;
      });
      const rsp: Packet = { type, requestID: t.big(), addresses, error: t.text(), resolver: t.text() };
      const ttl = t.byte();
      if (ttl > 0) rsp.ttl = ttl;
      return rsp;
    }
  }
}

// ---------- packet codec ----------

const packetDecode: FuzzTarget = {
  name: 'packet-decode',
  description:
    'decodePacket on arbitrary bytes returns a packet or throws PacketDecodeError (nothing else); a decoded packet has in-range fields, re-encodes canonically and round-trips through encodePacket and framePacket; a DATA payload is a view into the input, not a copy',
  covers: ['src/wire/codec.js', 'src/wire/protobuf.js', 'src/wire/data-frame.js'],
  maxLen: 512,
  dictionary: [
    Uint8Array.of(0x08, 0x04, 0x22),
    Uint8Array.of(0x08, 0x00, 0x12),
    Uint8Array.of(0x08, 0x64, 0xa2, 0x06),
    Uint8Array.of(0x08, 0x65, 0xaa, 0x06),
    Uint8Array.of(0x08, 0x68, 0xc2, 0x06),
    Uint8Array.of(0x08, 0x69, 0xca, 0x06),
    Uint8Array.of(0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
    Uint8Array.of(0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10),
    Uint8Array.of(0xc0, 0x80),
    Uint8Array.of(0xed, 0xa0, 0x80),
  ],
  run(data) {
    let p: Packet;
    try {
      p = decodePacket(data);
    } catch (err) {
      check(
        err instanceof PacketDecodeError,
        `decodePacket threw ${(err as Error)?.name}: ${(err as Error)?.message}, not PacketDecodeError`,
      );
      return;
    }
    checkShape(p);
    if (p.type === PacketType.DATA && p.data.length > 0) {
      check(p.data.buffer === data.buffer, 'a DATA payload was copied out of the received buffer');
    }
    checkRoundTrip(p);
  },
};

const packetRoundTrip: FuzzTarget = {
  name: 'packet-roundtrip',
  description:
    'any packet the sending side can build (every type, boundary ids, int64 extremes, any text, payload sizes around the 1 KiB split) round-trips through encodePacket/decodePacket and framePacket/MessageParser; encodeData without the payload plus the payload is the whole message, and matchDataHeader finds the DATA messages it may stream (no error, a payload, a connectID below 2^49) and no others',
  covers: ['src/wire/codec.js', 'src/wire/protobuf.js', 'src/wire/data-frame.js', 'src/transport/h2/framing.js'],
  maxLen: 1024,
  run(data) {
    const p = packetFrom(new Take(data));
    checkRoundTrip(p);
    // Through the receiving framer, whole and in two pieces, as the transport sends it.
    const parts = framePacket(p);
    const whole = Buffer.concat(parts);
    for (const cut of [whole.length, 6, Math.floor(whole.length / 2)]) {
      const got: Uint8Array[] = [];
      const parser = new MessageParser(1 << 20);
      for (const chunk of [whole.subarray(0, cut), whole.subarray(cut)]) {
        if (chunk.length === 0) continue;
        const err = parser.push(chunk, (m) => (got.push(Buffer.from(m)), true));
        check(err === null, `MessageParser refuses a framed packet: ${err?.message}`);
      }
      check(got.length === 1 && samePacket(decodePacket(got[0]), p), `framed ${show(p)} did not come back whole (cut at ${cut})`);
      check(!parser.midMessage, 'the parser is mid-message after a whole frame');
    }
    if (p.type !== PacketType.DATA) return;
    const full = encodeData(p.connectID, p.error, p.data, 0, true);
    const header = encodeData(p.connectID, p.error, p.data, 0, false);
    check(sameBytes(full, encodePacket(p)), 'encodeData differs from encodePacket for DATA');
    check(sameBytes(Buffer.concat([header, p.data]), full), 'encodeData header + payload differs from the whole message');
    const h = matchDataHeader(full, 0, full.length, full.length);
    // It reads connectIDs of at most 7 varint bytes (below 2^49, data-frame.ts); a larger one is buffered instead.
    if (p.error === '' && p.data.length > 0 && p.connectID < 2 ** 49) {
      check(
        h !== null && h.connectID === p.connectID && h.headerBytes === header.length,
        `matchDataHeader misses ${show({ ...p, data: p.data.length })}`,
      );
    } else if (p.error !== '' || p.data.length === 0) {
      check(h === null, `matchDataHeader matches a DATA message it cannot stream: ${show({ ...p, data: p.data.length })}`);
    }
  },
};

const dataHeader: FuzzTarget = {
  name: 'data-header',
  description:
    'matchDataHeader on arbitrary message bytes, seen through any chunk boundary and at any offset: when it matches, the message decodes (decodePacket) to DATA with that connectID, no error, and exactly the bytes after the header as payload, and the header lies inside the chunk',
  covers: ['src/wire/data-frame.js', 'src/wire/protobuf.js'],
  maxLen: 256,
  dictionary: [Uint8Array.of(0x08, 0x04, 0x22), Uint8Array.of(0x08, 0x01), Uint8Array.of(0x1a), Uint8Array.of(0x12, 0x01, 0x41)],
  run(data) {
    if (data.length < 2) return;
    const msg = data.subarray(2);
    const end = data[0] % (msg.length + 1);
    const pad = data[1] & 7;
    // The message inside a larger chunk, with bytes of the next message after it.
    const chunk = new Uint8Array(pad + msg.length + 3).fill(0x5a);
    chunk.set(msg, pad);
    const views: [Uint8Array, number, number][] = [
      [msg, 0, end],
      [msg, 0, msg.length],
      [chunk, pad, pad + msg.length + 3],
    ];
    for (const [buf, start, stop] of views) {
      const h = matchDataHeader(buf, start, stop, msg.length);
      if (h === null) continue;
      check(
        h.headerBytes > 0 && start + h.headerBytes <= Math.min(stop, start + msg.length),
        `header of ${h.headerBytes} bytes runs past the bytes at hand`,
      );
      let p: Packet;
      try {
        p = decodePacket(msg);
      } catch (err) {
        throw new PropertyViolation(`matchDataHeader matched a message decodePacket refuses: ${(err as Error).message}`);
      }
      check(
        p.type === PacketType.DATA && p.connectID === h.connectID && p.error === '' && sameBytes(p.data, msg.subarray(h.headerBytes)),
        `matchDataHeader says DATA connectID ${h.connectID} with payload after ${h.headerBytes} bytes; decodePacket says ${show(p)}`,
      );
    }
  },
};

// ---------- gRPC message framing ----------

const MAX_CHOICES = [0, 1, 5, 16, 100, 1024, 65536] as const;

interface Reference {
  messages: Uint8Array[];
  /** Start of each message's body in the stream. */
  starts: number[];
  error: GrpcStatus | null;
  /** The stream ends inside a prefix or a body. */
  partial: boolean;
}

/** A plain, whole-stream reading of PROTOCOL-HTTP2.md's Length-Prefixed-Message, to compare against. */
function referenceFrames(s: Uint8Array, max: number): Reference {
  const out: Reference = { messages: [], starts: [], error: null, partial: false };
  let off = 0;
  while (off < s.length) {
    if (s.length - off < 5) {
      out.partial = true;
      break;
    }
    const flags = s[off];
    const length = Buffer.from(s.buffer, s.byteOffset + off + 1, 4).readUInt32BE(0);
    if (flags !== 0) {
      out.error = GrpcStatus.INTERNAL;
      break;
    }
    if (length > max) {
      out.error = GrpcStatus.RESOURCE_EXHAUSTED;
      break;
    }
    if (s.length - off - 5 < length) {
      out.partial = true;
      out.starts.push(off + 5);
      break;
    }
    out.messages.push(s.subarray(off + 5, off + 5 + length));
    out.starts.push(off + 5);
    off += 5 + length;
  }
  return out;
}

type Event = { kind: 'message'; bytes: Uint8Array } | { kind: 'slice'; connectID: number; bytes: Uint8Array };

const grpcFraming: FuzzTarget = {
  name: 'grpc-framing',
  description:
    'MessageParser fed a stream in arbitrary chunks gives the messages of a plain whole-stream reading (PROTOCOL-HTTP2.md Length-Prefixed-Message), refuses a flagged or oversized message with the same status, stays failed after an error, knows whether it stopped mid-message, and with onDataSlice streams exactly the payloads of DATA messages it matched',
  covers: ['src/transport/h2/framing.js', 'src/wire/data-frame.js', 'src/wire/protobuf.js'],
  maxLen: 2048,
  dictionary: [
    Uint8Array.of(0, 0, 0, 0, 0),
    Uint8Array.of(0, 0, 0, 0, 8),
    Uint8Array.of(0, 0, 0, 1, 0),
    Uint8Array.of(1, 0, 0, 0, 0),
    Uint8Array.of(0, 0xff, 0xff, 0xff, 0xff),
    Uint8Array.of(0x08, 0x04, 0x22),
    Uint8Array.of(0x08, 0x01, 0x1a),
  ],
  run(data) {
    if (data.length < 2) return;
    let seed = data[0] | 1;
    const max = MAX_CHOICES[data[1] % MAX_CHOICES.length];
    const stream = data.subarray(2);
    const ref = referenceFrames(stream, max);
    // Chunk sizes from a tiny LCG seeded by the input: same input, same splits.
    const chunks: Buffer[] = [];
    for (let off = 0; off < stream.length;) {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      const n = 1 + ((seed >>> 16) % 24);
      chunks.push(Buffer.from(stream.buffer, stream.byteOffset + off, Math.min(n, stream.length - off)));
      off += n;
    }
    for (const streaming of [false, true]) {
      const events: Event[] = [];
      const parser = new MessageParser(max);
      let error: { code: GrpcStatus; message: string } | null = null;
      for (const chunk of chunks) {
        const onMessage = (m: Uint8Array): boolean => (events.push({ kind: 'message', bytes: Buffer.from(m) }), true);
        const onSlice = (connectID: number, bytes: Buffer): boolean => (
          events.push({ kind: 'slice', connectID, bytes: Buffer.from(bytes) }),
          true
        );
        error = streaming ? parser.push(chunk, onMessage, onSlice) : parser.push(chunk, onMessage);
        if (error) {
          check(parser.push(Buffer.from([0]), onMessage) === error, 'the parser accepted bytes after an error');
          break;
        }
      }
      check((error?.code ?? null) === ref.error, `status ${error?.code} (${error?.message}), the reference says ${ref.error}`);
      if (error === null)
        check(
          parser.midMessage === ref.partial,
          `midMessage is ${parser.midMessage}, the stream ends ${ref.partial ? 'inside' : 'between'} messages`,
        );
      // Walk the reference's messages through the events.
      let e = 0;
      for (let i = 0; i < ref.starts.length; i++) {
        const complete = i < ref.messages.length;
        const ev = events[e];
        if (ev === undefined) {
          check(!complete, `message ${i} of ${ref.messages.length} was never delivered`);
          break;
        }
        if (ev.kind === 'message') {
          check(complete && sameBytes(ev.bytes, ref.messages[i]), `message ${i} differs from the reference`);
          e++;
          continue;
        }
        check(streaming, 'a slice without onDataSlice');
        // Slices carry no message boundary: a complete message's are as many as its payload's length.
        const want = complete ? decodePacket(ref.messages[i]) : null;
        const wantBytes = want?.type === PacketType.DATA ? want.data.length : Infinity;
        const slices: Uint8Array[] = [];
        let sliced = 0;
        for (let next = events[e]; next?.kind === 'slice' && next.connectID === ev.connectID && sliced < wantBytes; next = events[++e]) {
          slices.push(next.bytes);
          sliced += next.bytes.length;
        }
        const got = Buffer.concat(slices);
        if (want !== null) {
          const p = want;
          check(
            p.type === PacketType.DATA && p.error === '' && p.connectID === ev.connectID && sameBytes(got, p.data),
            `streamed message ${i}: slices for connectID ${ev.connectID} (${got.length} bytes) are not its payload ${show(p)}`,
          );
        } else {
          // The last, unfinished message: the slices are the stream's last bytes, after its prefix.
          check(
            got.length <= stream.length - ref.starts[i] && sameBytes(got, stream.subarray(stream.length - got.length)),
            'streamed slices of the unfinished message are not its last bytes',
          );
        }
      }
      check(e === events.length, `${events.length - e} deliveries beyond the reference's messages`);
    }
  },
};

// ---------- HTTP request head ----------

const TCHAR = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]";
/** RFC 9112 sections 2.2, 3 and 5 read strictly, as one regular expression over latin1 text; group 3 is the header lines. */
const STRICT_HEAD = new RegExp(
  `^(?:\\r\\n)*(${TCHAR}+) ([\\x21-\\x7e]+) HTTP/1\\.[01]\\r\\n((?:${TCHAR}+:[\\t\\x20-\\x7e\\x80-\\xff]*\\r\\n)*)\\r\\n`,
);
const HEAD_MAX_CHOICES = [1, 16, 40, 64, 256, 1024, 8192] as const;
/** Header lines allowed; the first is the parser's default. */
const HEAD_MAX_HEADERS_CHOICES = [DEFAULT_MAX_HEADERS, 0, 1, 4] as const;

/** Whether `target` is in a form `method` takes (RFC 9112 section 3.2): authority for CONNECT, "*" for OPTIONS, origin or absolute. */
function strictForm(method: string, target: string): boolean {
  if (method === 'CONNECT') return true;
  if (target === '*') return method === 'OPTIONS';
  return target.startsWith('/') || /^[A-Za-z][A-Za-z0-9+.-]*:/.test(target);
}

function verdictText(v: HeadVerdict): string {
  return v.kind === 'head'
    ? `head ${v.method} ${v.target} ${v.form} ${v.headers.length} lines +${v.rest.length}`
    : v.kind === 'bad'
      ? `bad ${v.status} ${v.code}`
      : 'more';
}

const requestHead: FuzzTarget = {
  name: 'request-head',
  description:
    'RequestHeadParser accepts exactly the heads a strict RFC 9112 reading accepts within its byte and header-line limits (same method, target, form, header lines and following bytes), refuses with 431 only past a limit and asks for more only below it, gives the same verdict however the bytes are split, and turns "more" into 400 at end of input',
  covers: ['src/server/frontends/request-head.js'],
  maxLen: 4096,
  dictionary: [
    'CONNECT ',
    'GET ',
    'OPTIONS * ',
    'http://',
    '/',
    ' HTTP/1.1\r\n',
    ' HTTP/1.0\r\n',
    'HTTP/1.',
    '\r\n',
    '\r\n\r\n',
    'Host: ',
    ':',
    ' ',
    '\t',
    '\n',
    '\r',
    '10.0.0.1:443',
    '[::1]:6443',
    '\x7f',
    '\xff',
    '\x00',
  ],
  run(data) {
    if (data.length < 2) return;
    const max = HEAD_MAX_CHOICES[data[1] % HEAD_MAX_CHOICES.length];
    const maxHeaders = HEAD_MAX_HEADERS_CHOICES[Math.floor(data[1] / HEAD_MAX_CHOICES.length) % HEAD_MAX_HEADERS_CHOICES.length];
    const bytes = Buffer.from(data.buffer, data.byteOffset + 2, data.length - 2);
    const one = new RequestHeadParser(max, maxHeaders);
    const v = one.push(bytes);
    // The same bytes in pieces.
    const split = new RequestHeadParser(max, maxHeaders);
    let sv: HeadVerdict = { kind: 'more' };
    let seed = data[0] | 1;
    for (let off = 0; off < bytes.length && sv.kind === 'more';) {
      seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
      const n = 1 + ((seed >>> 16) % 17);
      sv = split.push(bytes.subarray(off, off + n));
      off += n;
    }
    const same =
      v.kind === sv.kind &&
      (v.kind !== 'bad' || (sv.kind === 'bad' && v.status === sv.status && v.code === sv.code)) &&
      (v.kind !== 'head' ||
        (sv.kind === 'head' &&
          v.method === sv.method &&
          v.target === sv.target &&
          v.form === sv.form &&
          show(v.headers) === show(sv.headers) &&
          sameBytes(sv.rest, v.rest.subarray(0, sv.rest.length))));
    check(same, `whole: ${verdictText(v)}; in pieces: ${verdictText(sv)}`);

    const text = bytes.toString('latin1');
    const m = STRICT_HEAD.exec(text);
    const strictLength = m ? m[0].length : -1;
    const strictLines = m ? (m[3].match(/\r\n/g) ?? []).length : 0;
    const strictOk = m !== null && strictLength <= max && strictForm(m[1], m[2]) && strictLines <= maxHeaders;
    if (v.kind === 'head') {
      check(strictOk, `accepted a head a strict reading refuses within ${max} bytes and ${maxHeaders} lines: ${verdictText(v)}`);
      check(v.method === m[1] && v.target === m[2], `method/target ${v.method} ${v.target}, strictly ${m[1]} ${m[2]}`);
      check(v.headers.length === strictLines, `${v.headers.length} header lines, strictly ${strictLines}`);
      check(sameBytes(v.rest, bytes.subarray(strictLength)), 'the bytes after the head differ');
    } else {
      check(!strictOk, `refused (${verdictText(v)}) a head of ${strictLength} bytes a strict reading accepts within ${max}`);
      if (v.kind === 'more') check(bytes.length < max, `asks for more after ${bytes.length} bytes with a ${max}-byte limit`);
      // Past the byte limit, or a header line past the line limit (each line before it ended in CRLF, as did the request line).
      if (v.kind === 'bad' && v.status === 431)
        check(
          bytes.length >= max || (text.match(/\r\n/g) ?? []).length > maxHeaders,
          `431 after only ${bytes.length} bytes with a ${max}-byte limit and ${maxHeaders} lines`,
        );
      const end = one.end();
      if (v.kind === 'more') check(end.kind === 'bad' && end.status === 400, `end of input after "more" gives ${verdictText(end)}`);
      else check(end === v, 'end() changed a verdict already given');
    }
  },
};

// ---------- agent identifiers and gRPC metadata ----------

function serializeIdentifiers(ids: AgentIdentifiers): string {
  const q = new URLSearchParams();
  for (const h of ids.hosts) q.append('host', h);
  for (const a of ids.ipv4) q.append('ipv4', a);
  for (const a of ids.ipv6) q.append('ipv6', a);
  if (ids.defaultRoute) q.append('default-route', 'true');
  return q.toString();
}

const agentIdentifiers: FuzzTarget = {
  name: 'agent-identifiers',
  description:
    'parseAgentIdentifiers on any text returns identifiers or throws a plain Error with a bounded message (never a TypeError or RangeError from node:net); accepted values number at most MAX_IDENTIFIER_VALUES, hosts are canonical (canonicalHost is idempotent), addresses are of their family, prefix lengths fit, and the result re-parses from its own serialization',
  covers: ['src/wire/agent-identifiers.js'],
  maxLen: 1024,
  dictionary: [
    'host=',
    'ipv4=',
    'ipv6=',
    'cidr=',
    'default-route=',
    '&',
    '%',
    '%2F',
    '/',
    '10.0.0.5',
    'fd00::5',
    '::ffff:10.0.0.1',
    '0.0.0.0/0',
    '::/0',
    '/128',
    '/33',
    'true',
    'True',
    'node-1',
    '%00',
    '%zz',
    '+',
    '.',
    '_',
    '-',
  ],
  run(data) {
    const text = Buffer.from(data).toString('utf8');
    let ids: AgentIdentifiers;
    try {
      ids = parseAgentIdentifiers(text);
    } catch (err) {
      check(
        err instanceof Error && Object.getPrototypeOf(err) === Error.prototype,
        `threw ${(err as Error)?.name} ${(err as Error)?.message}, not a plain Error`,
      );
      check(err.message.length <= 1024, `an error message of ${err.message.length} characters (it is logged and sent to the agent)`);
      return;
    }
    const total = ids.hosts.length + ids.ipv4.length + ids.ipv6.length + ids.cidrs.length;
    check(total <= MAX_IDENTIFIER_VALUES, `${total} identifier values accepted`);
    for (const h of [...ids.hosts, ...ids.ipv4, ...ids.ipv6]) check(canonicalHost(h) === h, `${JSON.stringify(h)} is not canonical`);
    for (const c of ids.cidrs) {
      check(
        Number.isInteger(c.length) && c.length >= 0 && c.length <= (c.family === 'ipv4' ? 32 : 128),
        `prefix length ${c.length} for ${c.family}`,
      );
      for (const a of [...ids.ipv4, ...ids.ipv6, 'not-an-ip', '']) prefixContains(c, a);
    }
    const again = parseAgentIdentifiers(serializeIdentifiers(ids));
    check(
      show([again.hosts, again.ipv4, again.ipv6, again.defaultRoute]) === show([ids.hosts, ids.ipv4, ids.ipv6, ids.defaultRoute]),
      `identifiers do not re-parse from ${serializeIdentifiers(ids)}`,
    );
  },
};

const RESERVED = [
  'content-type',
  'te',
  'content-length',
  'transfer-encoding',
  'connection',
  'keep-alive',
  'proxy-connection',
  'upgrade',
  'host',
];

const grpcMetadata: FuzzTarget = {
  name: 'grpc-metadata',
  description:
    'metadataFromRawHeaders never lets pseudo-headers, grpc-* or connection headers through, keeps plain values as sent and in order, and normalises -bin values to canonical padded base64; firstValue is the first of them; grpc-message decoding never throws and undoes encoding; grpc-timeout and grpc-status parse only their grammar; kanal-features parses to known features only and round-trips',
  covers: ['src/transport/h2/grpc-headers.js', 'src/wire/features.js', 'src/wire/metadata.js'],
  maxLen: 1024,
  dictionary: [
    '\x00',
    ':path',
    'grpc-timeout',
    'agentid',
    'agentidentifiers',
    'kanal-features',
    'x-bin',
    '-bin',
    'window,half-close',
    'node-dial',
    ',',
    '%',
    '%2',
    '%C3%A9',
    '==',
    '=',
    'TE',
    'Host',
    '99999999H',
    '1n',
    '200',
  ],
  run(data) {
    const parts = Buffer.from(data).toString('latin1').split('\x00');
    const md = metadataFromRawHeaders(parts);
    const plain = new Map<string, string[]>();
    for (let i = 0; i + 1 < parts.length; i += 2) {
      const key = parts[i].toLowerCase();
      if (!key.endsWith('-bin')) plain.set(key, [...(plain.get(key) ?? []), parts[i + 1]]);
    }
    for (const [key, values] of md) {
      check(key === key.toLowerCase(), `key ${JSON.stringify(key)} is not lower-case`);
      check(
        !key.startsWith(':') && !key.startsWith('grpc-') && !RESERVED.includes(key),
        `reserved header ${JSON.stringify(key)} became metadata`,
      );
      check(firstValue(md, key) === values[0], 'firstValue is not the first value');
      if (key.endsWith('-bin')) {
        for (const v of values)
          check(Buffer.from(v, 'base64').toString('base64') === v, `-bin value ${JSON.stringify(v)} is not canonical base64`);
      } else {
        check(show(values) === show(plain.get(key)), `values of ${JSON.stringify(key)} differ from what was sent`);
      }
    }
    for (const p of parts) {
      const decoded = decodeGrpcMessage(p);

      check(/^[\x20-\x7e]*$/.test(encodeGrpcMessage(decoded)), 'encodeGrpcMessage left a byte outside printable ASCII');
      const text = new TextDecoder().decode(Buffer.from(p, 'latin1'));
      check(decodeGrpcMessage(encodeGrpcMessage(text)) === text, `grpc-message ${JSON.stringify(text.slice(0, 40))} does not round-trip`);
      const ms = parseGrpcTimeout(p);
      if (ms !== undefined) {
        check(/^\d{1,8}[HMSmun]$/.test(p) && Number.isFinite(ms) && ms >= 0, `grpc-timeout ${JSON.stringify(p)} parsed to ${ms}`);
        const again = parseGrpcTimeout(formatGrpcTimeout(ms));
        check(again !== undefined && again >= ms, `formatGrpcTimeout(${ms}) parses back to ${again}`);
      }
      const status = parseGrpcStatus(p);
      check(
        status === undefined || (/^\d{1,3}$/.test(p) && (status as number) === Number(p)),
        `grpc-status ${JSON.stringify(p)} parsed to ${status}`,
      );
      const features = parseFeatures(p);
      for (const f of features) check(ALL_FEATURES.has(f), `unknown feature ${f}`);
      check(formatFeatures(parseFeatures(formatFeatures(features))) === formatFeatures(features), 'features do not round-trip');
    }
  },
};

export const targets: readonly FuzzTarget[] = [
  packetDecode,
  packetRoundTrip,
  dataHeader,
  grpcFraming,
  requestHead,
  agentIdentifiers,
  grpcMetadata,
];
