/**
 * Conformance of the hand-written codec (src/wire/codec.ts) with
 * proto/konnectivity.proto, checked against protobufjs in both directions,
 * plus the wire facts upstream peers depend on and refusal of bad input.
 */
import test, { type ExecutionContext } from 'ava';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import protobuf from 'protobufjs';
import { decodePacket, encodePacket } from '../../src/wire/codec.js';
import { PacketDecodeError } from '../../src/wire/protobuf.js';
import { PacketType, packetTypeName, type Packet } from '../../src/wire/packet.js';
import { ALL_FEATURES, Feature, formatFeatures, intersectFeatures, NO_FEATURES, parseFeatures } from '../../src/wire/features.js';
import * as md from '../../src/wire/metadata.js';

const here = path.dirname(fileURLToPath(import.meta.url));
// dist/test/wire/codec.test.js -> repository root
const PROTO = path.resolve(here, '..', '..', '..', 'proto', 'konnectivity.proto');

const root = await protobuf.load(PROTO);
const PbPacket = root.lookupType('Packet');

const INT64_MAX = (1n << 63n) - 1n;
const INT64_MIN = -(1n << 63n);
const SAFE_MAX = Number.MAX_SAFE_INTEGER;

const PAYLOAD_NAME: Record<PacketType, string> = {
  [PacketType.DIAL_REQ]: 'dialRequest',
  [PacketType.DIAL_RSP]: 'dialResponse',
  [PacketType.DATA]: 'data',
  [PacketType.CLOSE_REQ]: 'closeRequest',
  [PacketType.CLOSE_RSP]: 'closeResponse',
  [PacketType.DIAL_CLS]: 'closeDial',
  [PacketType.DRAIN]: 'drain',
  [PacketType.KANAL_WINDOW]: 'window',
  [PacketType.KANAL_HALF_CLOSE]: 'halfClose',
  [PacketType.KANAL_RESUME]: 'resume',
  [PacketType.KANAL_RESUME_END]: 'resumeEnd',
  [PacketType.KANAL_RESOLVE_REQ]: 'resolveRequest',
  [PacketType.KANAL_RESOLVE_RSP]: 'resolveResponse',
};

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
  [PacketType.KANAL_RESUME]: 102,
  [PacketType.KANAL_RESUME_END]: 103,
  [PacketType.KANAL_RESOLVE_REQ]: 104,
  [PacketType.KANAL_RESOLVE_RSP]: 105,
};

const bytes = (n: number, seed = 7): Uint8Array => {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + seed) & 0xff;
  return b;
};

/** Samples of every packet type, defaults and extremes included. */
const SAMPLES: Packet[] = [
  { type: PacketType.DIAL_REQ, protocol: 'tcp', address: '10.0.0.1:443', random: 1n },
  { type: PacketType.DIAL_REQ, protocol: 'tcp', address: '[fd00::1]:6443', random: INT64_MAX },
  { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'kubernetes.default.svc:443', random: INT64_MAX - 1n },
  { type: PacketType.DIAL_REQ, protocol: '', address: '', random: 0n },
  { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'üñíçødé.example:1', random: -1n },
  { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'a'.repeat(300), random: INT64_MIN },
  { type: PacketType.DIAL_RSP, error: '', connectID: 1, random: 0x1234_5678_9abc_def0n },
  { type: PacketType.DIAL_RSP, error: 'dial tcp 10.0.0.1:443: connect: connection refused', connectID: 0, random: INT64_MAX },
  { type: PacketType.DIAL_RSP, error: '', connectID: SAFE_MAX, random: 2n ** 62n + 3n },
  { type: PacketType.DIAL_RSP, error: '', connectID: 0, random: 0n },
  { type: PacketType.CLOSE_REQ, connectID: 2 },
  { type: PacketType.CLOSE_REQ, connectID: 0 },
  { type: PacketType.CLOSE_REQ, connectID: SAFE_MAX },
  { type: PacketType.CLOSE_RSP, error: '', connectID: 3 },
  { type: PacketType.CLOSE_RSP, error: 'unknown connectID', connectID: 2 ** 40 + 1 },
  { type: PacketType.DATA, connectID: 5, error: '', data: bytes(1) },
  { type: PacketType.DATA, connectID: 127, error: '', data: bytes(127) },
  { type: PacketType.DATA, connectID: 128, error: '', data: bytes(128) },
  { type: PacketType.DATA, connectID: 16384, error: '', data: bytes(64 * 1024) },
  { type: PacketType.DATA, connectID: 9, error: '', data: new Uint8Array(0) },
  { type: PacketType.DATA, connectID: 9, error: 'read: connection reset by peer', data: new Uint8Array(0) },
  { type: PacketType.DATA, connectID: SAFE_MAX, error: 'x', data: bytes(300, 1) },
  { type: PacketType.DIAL_CLS, random: 42n },
  { type: PacketType.DIAL_CLS, random: INT64_MAX },
  { type: PacketType.DIAL_CLS, random: 0n },
  { type: PacketType.DRAIN },
  { type: PacketType.KANAL_WINDOW, connectID: 4, increment: 262144 },
  { type: PacketType.KANAL_WINDOW, connectID: 4, increment: 0xffff_ffff },
  { type: PacketType.KANAL_WINDOW, connectID: 0, increment: 0 },
  { type: PacketType.KANAL_WINDOW, connectID: 7, increment: 0, acknowledged: 3 * 2 ** 30, finReceived: true },
  { type: PacketType.KANAL_WINDOW, connectID: 7, increment: 65536, acknowledged: 1 },
  { type: PacketType.KANAL_HALF_CLOSE, connectID: 11 },
  { type: PacketType.KANAL_HALF_CLOSE, connectID: 0 },
  { type: PacketType.KANAL_RESUME, connectID: 9, received: 2 ** 40, limit: 2 ** 40 + 4194304, finReceived: true, dialID: INT64_MAX },
  { type: PacketType.KANAL_RESUME, connectID: 0, received: 0, limit: 0, finReceived: false, dialID: -5n },
  { type: PacketType.KANAL_RESUME_END },
  { type: PacketType.KANAL_RESOLVE_REQ, requestID: 7n, name: 'kubernetes.default.svc', timeoutMs: 5000 },
  { type: PacketType.KANAL_RESOLVE_REQ, requestID: INT64_MIN, name: 'a'.repeat(253) },
  { type: PacketType.KANAL_RESOLVE_REQ, requestID: 0n, name: '' },
  {
    type: PacketType.KANAL_RESOLVE_RSP,
    requestID: INT64_MAX,
    addresses: ['10.96.0.1', 'fd00::1'],
    error: '',
    resolver: 'cluster DNS 10.96.0.10:53',
    ttl: 30,
  },
  { type: PacketType.KANAL_RESOLVE_RSP, requestID: -1n, addresses: [], error: 'NXDOMAIN', resolver: 'system resolver' },
  {
    type: PacketType.KANAL_RESOLVE_RSP,
    requestID: 3n,
    addresses: Array.from({ length: 16 }, (_, i) => `10.0.0.${i}`),
    error: '',
    resolver: 'r'.repeat(256),
    ttl: 0xffff_ffff,
  },
];

function label(p: Packet): string {
  return `${packetTypeName(p.type)} ${JSON.stringify(p, (_k, v: unknown) =>
    typeof v === 'bigint' ? `${v}n` : v instanceof Uint8Array ? `<${v.length} bytes>` : v,
  ).slice(0, 100)}`;
}

/** The protobufjs plain object for `p`, with proto3 defaults omitted (canonical encoding). */
function toPbObject(p: Packet): Record<string, unknown> {
  const payload: Record<string, unknown> = {};
  const put = (k: string, v: string | number | bigint | Uint8Array): void => {
    if (v === '' || v === 0 || v === 0n) return;
    if (v instanceof Uint8Array) {
      if (v.length > 0) payload[k] = Buffer.from(v);
      return;
    }
    payload[k] = typeof v === 'bigint' ? v.toString() : v;
  };
  switch (p.type) {
    case PacketType.DIAL_REQ:
      put('protocol', p.protocol);
      put('address', p.address);
      put('random', p.random);
      break;
    case PacketType.DIAL_RSP:
      put('error', p.error);
      put('connectID', p.connectID);
      put('random', p.random);
      break;
    case PacketType.CLOSE_REQ:
      put('connectID', p.connectID);
      break;
    case PacketType.CLOSE_RSP:
      put('error', p.error);
      put('connectID', p.connectID);
      break;
    case PacketType.DATA:
      put('connectID', p.connectID);
      put('error', p.error);
      put('data', p.data);
      break;
    case PacketType.DIAL_CLS:
      put('random', p.random);
      break;
    case PacketType.DRAIN:
      break;
    case PacketType.KANAL_WINDOW:
      put('connectID', p.connectID);
      put('increment', p.increment);
      put('acknowledged', p.acknowledged ?? 0);
      if (p.finReceived) payload.finReceived = true;
      break;
    case PacketType.KANAL_HALF_CLOSE:
      put('connectID', p.connectID);
      break;
    case PacketType.KANAL_RESUME:
      put('connectID', p.connectID);
      put('received', p.received);
      put('limit', p.limit);
      if (p.finReceived) payload.finReceived = true;
      put('dialID', p.dialID);
      break;
    case PacketType.KANAL_RESUME_END:
      break;
    case PacketType.KANAL_RESOLVE_REQ:
      put('requestID', p.requestID);
      put('name', p.name);
      put('timeoutMs', p.timeoutMs ?? 0);
      break;
    case PacketType.KANAL_RESOLVE_RSP:
      put('requestID', p.requestID);
      if (p.addresses.length > 0) payload.addresses = p.addresses;
      put('error', p.error);
      put('resolver', p.resolver);
      put('ttl', p.ttl ?? 0);
      break;
  }
  const obj: Record<string, unknown> = { [PAYLOAD_NAME[p.type]]: payload };
  if (p.type !== PacketType.DIAL_REQ) obj.type = p.type;
  return obj;
}

function pbEncode(obj: Record<string, unknown>): Buffer {
  const msg = PbPacket.fromObject(obj);
  const err = PbPacket.verify(msg);
  if (err) throw new Error(`protobufjs rejects ${JSON.stringify(obj)}: ${err}`);
  return Buffer.from(PbPacket.encode(msg).finish());
}

interface PbView {
  type: number;
  payload: string | undefined;
  fields: Record<string, unknown>;
}

/** Decodes with protobufjs into comparable values (int64 as bigint, bytes as Buffer). */
function pbDecode(buf: Uint8Array): PbView {
  const msg = PbPacket.decode(buf);
  const obj = PbPacket.toObject(msg, { longs: String, enums: Number, defaults: true, oneofs: true }) as Record<string, unknown>;
  const payloadName = obj.payload as string | undefined;
  const raw = (payloadName ? obj[payloadName] : {}) as Record<string, unknown>;
  const fields: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(raw)) {
    if (typeof v === 'string' && ['random', 'connectID', 'acknowledged', 'received', 'limit', 'dialID', 'requestID'].includes(k))
      fields[k] = BigInt(v);
    else if (v instanceof Uint8Array) fields[k] = Buffer.from(v);
    else if (k === 'data' && Array.isArray(v))
      fields[k] = Buffer.from(v as number[]); // protobufjs default for bytes
    else fields[k] = v;
  }
  return { type: obj.type as number, payload: payloadName, fields };
}

/** What protobufjs should see for our packet `p`. */
function expectedView(p: Packet): PbView {
  const f: Record<string, unknown> = {};
  switch (p.type) {
    case PacketType.DIAL_REQ:
      Object.assign(f, { protocol: p.protocol, address: p.address, random: p.random });
      break;
    case PacketType.DIAL_RSP:
      Object.assign(f, { error: p.error, connectID: BigInt(p.connectID), random: p.random });
      break;
    case PacketType.CLOSE_REQ:
      Object.assign(f, { connectID: BigInt(p.connectID) });
      break;
    case PacketType.CLOSE_RSP:
      Object.assign(f, { error: p.error, connectID: BigInt(p.connectID) });
      break;
    case PacketType.DATA:
      Object.assign(f, { connectID: BigInt(p.connectID), error: p.error, data: Buffer.from(p.data) });
      break;
    case PacketType.DIAL_CLS:
      Object.assign(f, { random: p.random });
      break;
    case PacketType.DRAIN:
      break;
    case PacketType.KANAL_WINDOW:
      Object.assign(f, {
        connectID: BigInt(p.connectID),
        increment: p.increment,
        acknowledged: BigInt(p.acknowledged ?? 0),
        finReceived: p.finReceived ?? false,
      });
      break;
    case PacketType.KANAL_HALF_CLOSE:
      Object.assign(f, { connectID: BigInt(p.connectID) });
      break;
    case PacketType.KANAL_RESUME:
      Object.assign(f, {
        connectID: BigInt(p.connectID),
        received: BigInt(p.received),
        limit: BigInt(p.limit),
        finReceived: p.finReceived,
        dialID: p.dialID,
      });
      break;
    case PacketType.KANAL_RESUME_END:
      break;
    case PacketType.KANAL_RESOLVE_REQ:
      Object.assign(f, { requestID: p.requestID, name: p.name, timeoutMs: p.timeoutMs ?? 0 });
      break;
    case PacketType.KANAL_RESOLVE_RSP:
      Object.assign(f, { requestID: p.requestID, addresses: p.addresses, error: p.error, resolver: p.resolver, ttl: p.ttl ?? 0 });
      break;
  }
  return { type: p.type, payload: PAYLOAD_NAME[p.type], fields: f };
}

/** Packet with DATA bytes as a Buffer so deepEqual compares content only. */
function normalize(p: Packet): unknown {
  return p.type === PacketType.DATA ? { ...p, data: Buffer.from(p.data) } : p;
}

const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

function throwsDecode(t: ExecutionContext, input: Uint8Array, message: RegExp): void {
  const err = t.throws(() => decodePacket(input), { instanceOf: PacketDecodeError }, `input ${Buffer.from(input).toString('hex')}`);
  t.regex(err?.message ?? '', message);
}

// ---------- both directions, every packet type ----------

test('every packet type is covered by the samples', (t) => {
  const types = new Set(SAMPLES.map((p) => p.type));
  for (const v of Object.values(PacketType)) {
    if (typeof v === 'number') t.true(types.has(v), `no sample of ${PacketType[v]}`);
  }
});

test('the .proto enum and oneof match the codec (names, numbers, field numbers)', (t) => {
  const en = root.lookupEnum('PacketType');
  for (const [name, value] of Object.entries(en.values)) {
    t.is(PacketType[name as keyof typeof PacketType], value, `PacketType.${name}`);
  }
  const oneof = PbPacket.oneofs.payload;
  for (const [type, name] of Object.entries(PAYLOAD_NAME)) {
    const field = PbPacket.fields[name];
    t.truthy(field, `Packet.${name} exists`);
    t.is(field.id, PAYLOAD_FIELD[Number(type) as PacketType], `field number of ${name}`);
    t.true(oneof.fieldsArray.includes(field), `${name} is in oneof payload`);
  }
  t.is(PbPacket.fields.type.id, 1);
});

test('encodePacket output decodes with protobufjs to the same fields', (t) => {
  for (const p of SAMPLES) {
    t.deepEqual(pbDecode(encodePacket(p)), expectedView(p), label(p));
  }
});

test('protobufjs output decodes with decodePacket to the same packet', (t) => {
  for (const p of SAMPLES) {
    t.deepEqual(normalize(decodePacket(pbEncode(toPbObject(p)))), normalize(p), label(p));
  }
});

test('encodePacket is byte-identical to protobufjs canonical encoding (field order, defaults omitted)', (t) => {
  for (const p of SAMPLES) {
    t.is(encodePacket(p).toString('hex'), pbEncode(toPbObject(p)).toString('hex'), label(p));
  }
});

test('protobufjs encoding with explicit default fields still decodes the same', (t) => {
  // Some encoders write zero values; the packet must not change.
  const buf = pbEncode({ type: PacketType.DATA, data: { connectID: 7, error: '', data: Buffer.alloc(0) } });
  t.deepEqual(normalize(decodePacket(buf)), normalize({ type: PacketType.DATA, connectID: 7, error: '', data: new Uint8Array(0) }));
  const req = pbEncode({ type: 0, dialRequest: { protocol: 'tcp', address: 'x:1', random: '0' } });
  t.deepEqual(decodePacket(req), { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'x:1', random: 0n });
});

test('round trip encode -> decode is the identity for every sample', (t) => {
  for (const p of SAMPLES) t.deepEqual(normalize(decodePacket(encodePacket(p))), normalize(p), label(p));
});

// ---------- wire facts ----------

test('DIAL_REQ has no type field on the wire: the first byte is the field-2 tag 0x12', (t) => {
  const buf = encodePacket({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'a:1', random: 5n });
  t.is(buf[0], 0x12);
  // Every other type starts with the type field (tag 0x08).
  for (const p of SAMPLES.filter((s) => s.type !== PacketType.DIAL_REQ)) t.is(encodePacket(p)[0], 0x08, label(p));
  // And a packet with only the payload field decodes as DIAL_REQ.
  t.deepEqual(decodePacket(hex('12 00')), { type: PacketType.DIAL_REQ, protocol: '', address: '', random: 0n });
});

test('int64 random near 2^63-1 and negative values round-trip exactly as bigint', (t) => {
  const values = [INT64_MAX, INT64_MAX - 1n, INT64_MAX - 255n, 2n ** 53n + 1n, 2n ** 62n, -1n, INT64_MIN, INT64_MIN + 1n];
  for (const random of values) {
    const req: Packet = { type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'h:1', random };
    const rsp: Packet = { type: PacketType.DIAL_RSP, error: '', connectID: 3, random };
    const cls: Packet = { type: PacketType.DIAL_CLS, random };
    for (const p of [req, rsp, cls]) {
      const back = decodePacket(encodePacket(p));
      t.deepEqual(back, p, `${random}`);
      t.is(pbDecode(encodePacket(p)).fields.random, random, `protobufjs sees ${random}`);
      t.deepEqual(decodePacket(pbEncode(toPbObject(p))), p, `from protobufjs ${random}`);
    }
  }
  // 2^63-1 is a 9-byte varint, -1 a 10-byte one (as every protobuf encoder writes them).
  t.is(encodePacket({ type: PacketType.DIAL_CLS, random: INT64_MAX }).toString('hex'), '08053a0a08ffffffffffffffff7f');
  t.is(encodePacket({ type: PacketType.DIAL_CLS, random: -1n }).toString('hex'), '08053a0b08ffffffffffffffffff01');
});

test('DRAIN encodes as upstream does: type 6 and field 8 present with length 0', (t) => {
  t.is(encodePacket({ type: PacketType.DRAIN }).toString('hex'), '08064200');
  t.deepEqual(decodePacket(hex('08064200')), { type: PacketType.DRAIN });
  // A DRAIN without its (empty) payload is still a DRAIN.
  t.deepEqual(decodePacket(hex('0806')), { type: PacketType.DRAIN });
});

test('empty payload messages keep their oneof field (CLOSE_REQ with connectID 0, DIAL_CLS with random 0)', (t) => {
  t.is(encodePacket({ type: PacketType.CLOSE_REQ, connectID: 0 }).toString('hex'), '08022a00');
  t.is(encodePacket({ type: PacketType.DIAL_CLS, random: 0n }).toString('hex'), '08053a00');
  t.is(encodePacket({ type: PacketType.DIAL_REQ, protocol: '', address: '', random: 0n }).toString('hex'), '1200');
});

test('DATA payload decodes as a view of the input (no copy)', (t) => {
  const buf = encodePacket({ type: PacketType.DATA, connectID: 1, error: '', data: bytes(1000) });
  const p = decodePacket(buf);
  if (p.type !== PacketType.DATA) return t.fail('not DATA');
  t.is(p.data.buffer, buf.buffer);
  t.deepEqual(Buffer.from(p.data), Buffer.from(bytes(1000)));
});

// ---------- unknown fields ----------

test('unknown fields of Packet (field 9, any wire type) are skipped', (t) => {
  const base = encodePacket({ type: PacketType.CLOSE_REQ, connectID: 4 });
  const extras = [
    '48 96 01', // field 9 varint 150
    '4a 03 61 62 63', // field 9 length-delimited "abc"
    '49 01 02 03 04 05 06 07 08', // field 9 fixed64
    '4d 01 02 03 04', // field 9 fixed32
    'f8 07 01', // field 127 varint
    '48 ff ff ff ff ff ff ff ff ff 01', // field 9 ten-byte varint
  ];
  for (const extra of extras) {
    const before = Buffer.concat([hex(extra), base]);
    const after = Buffer.concat([base, hex(extra)]);
    t.deepEqual(decodePacket(before), { type: PacketType.CLOSE_REQ, connectID: 4 }, `before: ${extra}`);
    t.deepEqual(decodePacket(after), { type: PacketType.CLOSE_REQ, connectID: 4 }, `after: ${extra}`);
  }
});

test('unknown fields inside a payload (field 50 inside Data) are skipped', (t) => {
  // Data { connectID=1: 9, field 50: "zz", data=3: "hi", field 51: varint 1 }
  const inner = hex('08 09 92 03 02 7a 7a 1a 02 68 69 98 03 01');
  const buf = Buffer.concat([hex('08 04 22'), Buffer.from([inner.length]), inner]);
  const p = decodePacket(buf);
  t.deepEqual(normalize(p), { type: PacketType.DATA, connectID: 9, error: '', data: Buffer.from('hi') });
  // protobufjs agrees.
  t.deepEqual(pbDecode(buf).fields, { connectID: 9n, error: '', data: Buffer.from('hi') });
});

test('the last oneof member on the wire wins, as in every protobuf implementation', (t) => {
  // type CLOSE_REQ, closeResponse{connectID 1}, closeRequest{connectID 2}
  const buf = hex('08 02 32 02 10 01 2a 02 08 02');
  t.deepEqual(decodePacket(buf), { type: PacketType.CLOSE_REQ, connectID: 2 });
});

test('a repeated scalar field keeps the last value', (t) => {
  // CLOSE_REQ { connectID: 1, connectID: 8 }
  t.deepEqual(decodePacket(hex('08 02 2a 04 08 01 08 08')), { type: PacketType.CLOSE_REQ, connectID: 8 });
});

// ---------- malformed input ----------

test('truncated varint throws PacketDecodeError', (t) => {
  throwsDecode(t, hex('08'), /truncated varint/);
  throwsDecode(t, hex('08 80'), /truncated varint/);
  throwsDecode(t, hex('80'), /truncated varint/);
  // Inside a payload: DIAL_CLS { random: <cut> }
  throwsDecode(t, hex('08 05 3a 02 08 ff'), /truncated varint/);
});

test('over-long varint throws PacketDecodeError', (t) => {
  throwsDecode(t, hex('08 ff ff ff ff ff ff ff ff ff ff 01'), /varint too long|out of range/);
  throwsDecode(t, hex('08 05 3a 0b 08 ff ff ff ff ff ff ff ff ff ff'), /varint too long/);
});

test('truncated length-delimited field throws PacketDecodeError', (t) => {
  throwsDecode(t, hex('08 04 22 05 08 01'), /truncated field/);
  // String inside the payload claims more than there is.
  throwsDecode(t, hex('12 04 12 09 61 62'), /truncated field/);
  // Truncated fixed64 / fixed32 unknown fields.
  throwsDecode(t, hex('49 01 02 03'), /truncated field/);
  throwsDecode(t, hex('4d 01 02'), /truncated field/);
  // Length varint itself cut off.
  throwsDecode(t, hex('22'), /truncated varint/);
});

test('a payload field with the wrong wire type throws PacketDecodeError', (t) => {
  // Data.connectID sent as length-delimited.
  throwsDecode(t, hex('08 04 22 03 0a 01 00'), /field 1 of DATA has wire type 2/);
  // Data.data sent as varint.
  throwsDecode(t, hex('08 04 22 02 18 05'), /field 3 of DATA has wire type 0/);
  // DialRequest.address sent as fixed32.
  throwsDecode(t, hex('12 05 15 01 02 03 04'), /field 2 of DIAL_REQ has wire type 5/);
});

test('group wire types (3, 4) and wire types 6, 7 are refused', (t) => {
  throwsDecode(t, hex('4b'), /unsupported wire type 3/);
  throwsDecode(t, hex('4c'), /unsupported wire type 4/);
  throwsDecode(t, hex('4e'), /unsupported wire type 6/);
  throwsDecode(t, hex('08 04 22 01 27'), /unsupported wire type 7/);
});

test('invalid UTF-8 in a string field throws PacketDecodeError', (t) => {
  // DialRequest.address = ff fe
  throwsDecode(t, hex('12 04 12 02 ff fe'), /field 2 of DIAL_REQ is not valid UTF-8/);
  // DialResponse.error = lone continuation byte
  throwsDecode(t, hex('08 01 1a 03 0a 01 80'), /field 1 of DIAL_RSP is not valid UTF-8/);
  // Truncated multi-byte sequence in Data.error
  throwsDecode(t, hex('08 04 22 04 12 02 e2 82'), /not valid UTF-8/);
  // Valid multi-byte UTF-8 is fine.
  t.deepEqual(decodePacket(hex('08 06 42 00')), { type: PacketType.DRAIN });
  const ok = decodePacket(hex('12 05 12 03 e2 82 ac'));
  t.is(ok.type === PacketType.DIAL_REQ ? ok.address : '', '€');
});

test('connectID beyond 2^53 (or negative) throws PacketDecodeError; 2^53-1 is fine', (t) => {
  const enc = (connectID: bigint): Buffer => pbEncode({ type: PacketType.CLOSE_REQ, closeRequest: { connectID: connectID.toString() } });
  t.deepEqual(decodePacket(enc(2n ** 53n - 1n)), { type: PacketType.CLOSE_REQ, connectID: SAFE_MAX });
  for (const bad of [2n ** 53n, 2n ** 53n + 1n, INT64_MAX, -1n, INT64_MIN]) {
    throwsDecode(t, enc(bad), /field 1 of CLOSE_REQ out of range/);
  }
  const data = pbEncode({ type: PacketType.DATA, data: { connectID: (2n ** 60n).toString(), data: Buffer.from('x') } });
  throwsDecode(t, data, /field 1 of DATA out of range/);
  const rsp = pbEncode({ type: PacketType.DIAL_RSP, dialResponse: { connectID: (2n ** 53n).toString(), random: '1' } });
  throwsDecode(t, rsp, /field 2 of DIAL_RSP out of range/);
});

test('KANAL_RESOLVE_REQ: a name of 253 bytes decodes, 254 bytes is malformed', (t) => {
  const req = (name: string): Buffer => pbEncode({ type: PacketType.KANAL_RESOLVE_REQ, resolveRequest: { requestID: '9', name } });
  t.deepEqual(decodePacket(req('b'.repeat(253))), { type: PacketType.KANAL_RESOLVE_REQ, requestID: 9n, name: 'b'.repeat(253) });
  throwsDecode(t, req('b'.repeat(254)), /field 2 of KANAL_RESOLVE_REQ is longer than 253 bytes/);
  // Bytes, not characters: 127 two-byte characters are 254 bytes.
  throwsDecode(t, req('é'.repeat(127)), /longer than 253 bytes/);
});

test('KANAL_RESOLVE_RSP: at most 16 addresses, each an IP literal; error and resolver at most 256 bytes', (t) => {
  const rsp = (fields: Record<string, unknown>): Buffer =>
    pbEncode({ type: PacketType.KANAL_RESOLVE_RSP, resolveResponse: { requestID: '1', ...fields } });
  const sixteen = Array.from({ length: 16 }, (_, i) => `fd00::${i + 1}`);
  const ok = decodePacket(rsp({ addresses: sixteen }));
  t.deepEqual(ok.type === PacketType.KANAL_RESOLVE_RSP ? ok.addresses : [], sixteen);
  throwsDecode(t, rsp({ addresses: [...sixteen, '10.0.0.1'] }), /field 2 of KANAL_RESOLVE_RSP has more than 16 elements/);
  for (const bad of ['', 'example.com', '10.0.0.256', '10.0.0.1:80', '[::1]', ' 10.0.0.1'])
    throwsDecode(t, rsp({ addresses: ['10.0.0.1', bad] }), /is not an IP literal/);
  throwsDecode(t, rsp({ addresses: ['1'.repeat(65)] }), /field 2 of KANAL_RESOLVE_RSP is longer than 64 bytes/);
  t.notThrows(() => decodePacket(rsp({ error: 'e'.repeat(256), resolver: 'r'.repeat(256) })));
  throwsDecode(t, rsp({ error: 'e'.repeat(257) }), /field 3 of KANAL_RESOLVE_RSP is longer than 256 bytes/);
  throwsDecode(t, rsp({ resolver: 'r'.repeat(257) }), /field 4 of KANAL_RESOLVE_RSP is longer than 256 bytes/);
  // A ttl or timeout of 0 is "not said": absent after decoding.
  t.deepEqual(decodePacket(rsp({ ttl: 0, error: 'x' })), {
    type: PacketType.KANAL_RESOLVE_RSP,
    requestID: 1n,
    addresses: [],
    error: 'x',
    resolver: '',
  });
});

test('an unknown packet type throws PacketDecodeError naming it', (t) => {
  throwsDecode(t, hex('08 07'), /unknown packet type 7/);
  throwsDecode(t, hex('08 07 4a 00'), /unknown packet type 7/);
  throwsDecode(t, hex('08 63'), /unknown packet type 99/);
  throwsDecode(t, hex('08 6a'), /unknown packet type 106/);
  throwsDecode(t, hex('08 ff ff ff ff 0f'), /unknown packet type/);
  // A negative enum value (ten-byte varint) is out of range, not a huge type.
  throwsDecode(t, hex('08 ff ff ff ff ff ff ff ff ff 01'), /integer out of range/);
});

test('a packet type whose payload is another message throws PacketDecodeError', (t) => {
  // type DATA carrying closeRequest.
  throwsDecode(t, hex('08 04 2a 02 08 01'), /packet type DATA carries payload field 5/);
  // type DRAIN carrying dialRequest.
  throwsDecode(t, hex('08 06 12 00'), /packet type DRAIN carries payload field 2/);
});

test('PacketDecodeError is an Error with a name', (t) => {
  const err = t.throws(() => decodePacket(hex('08 07')));
  t.true(err instanceof Error);
  t.is(err?.name, 'PacketDecodeError');
});

test('random garbage never throws anything but PacketDecodeError', (t) => {
  // Deterministic xorshift so a failure is reproducible.
  let s = 0x9e3779b9;
  const rnd = (): number => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return s >>> 0;
  };
  let decoded = 0;
  for (let i = 0; i < 5000; i++) {
    const len = rnd() % 40;
    const buf = Buffer.alloc(len);
    for (let j = 0; j < len; j++) buf[j] = rnd() & 0xff;
    try {
      const p = decodePacket(buf);
      decoded++;
      // Whatever decodes must re-encode and decode to the same packet.
      t.deepEqual(normalize(decodePacket(encodePacket(p))), normalize(p));
    } catch (err) {
      if (!(err instanceof PacketDecodeError)) t.fail(`input ${buf.toString('hex')} threw ${String(err)}`);
    }
  }
  t.log(`${decoded} of 5000 random inputs decoded`);
  t.pass();
});

// ---------- feature negotiation ----------

test('parseFeatures keeps known names, trims spaces, ignores unknown and empty parts', (t) => {
  t.deepEqual([...parseFeatures('window, half-close ,node-dial')].sort(), ['half-close', 'node-dial', 'window']);
  t.deepEqual([...parseFeatures('window,teleport,,WINDOW')], [Feature.Window]);
  t.is(parseFeatures(undefined).size, 0);
  t.is(parseFeatures('').size, 0);
  t.is(parseFeatures(' , ').size, 0);
});

test('formatFeatures is sorted and comma-separated, and parses back', (t) => {
  t.is(formatFeatures(new Set([Feature.Window, Feature.NodeDial, Feature.HalfClose])), 'half-close,node-dial,window');
  t.is(formatFeatures(NO_FEATURES), '');
  t.deepEqual([...parseFeatures(formatFeatures(ALL_FEATURES))].sort(), [...ALL_FEATURES].sort());
  t.deepEqual([...ALL_FEATURES].sort(), ['half-close', 'node-dial', 'resolve', 'resume', 'window']);
});

test('intersectFeatures: both must support a feature; an upstream peer (no header) gets none', (t) => {
  const ours = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);
  t.deepEqual([...intersectFeatures(parseFeatures('window,node-dial'), ours)].sort(), ['node-dial', 'window']);
  t.is(intersectFeatures(parseFeatures(undefined), ours).size, 0);
  t.is(intersectFeatures(ours, NO_FEATURES).size, 0);
  t.deepEqual([...intersectFeatures(parseFeatures('half-close,bogus'), new Set([Feature.Window, Feature.HalfClose]))], [Feature.HalfClose]);
});

// ---------- metadata keys ----------

test('metadata keys are the lower-case forms of upstream names; service paths match the .proto', (t) => {
  t.is(md.MD_AGENT_ID, 'agentID'.toLowerCase());
  t.is(md.MD_AGENT_IDENTIFIERS, 'agentIdentifiers'.toLowerCase());
  t.is(md.MD_SERVER_ID, 'serverID'.toLowerCase());
  t.is(md.MD_SERVER_COUNT, 'serverCount'.toLowerCase());
  t.is(md.MD_AUTHORIZATION, 'authorization');
  for (const key of [md.MD_AGENT_ID, md.MD_AGENT_IDENTIFIERS, md.MD_SERVER_ID, md.MD_SERVER_COUNT, md.MD_KANAL_FEATURES]) {
    t.regex(key, /^[a-z0-9_.-]+$/, 'a valid gRPC metadata key');
    t.false(key.endsWith('-bin'));
  }
  const agentService = root.lookupService('AgentService');
  const proxyService = root.lookupService('ProxyService');
  t.is(`/${agentService.name}/${agentService.methodsArray[0].name}`, md.AGENT_SERVICE_CONNECT);
  t.is(`/${proxyService.name}/${proxyService.methodsArray[0].name}`, md.PROXY_SERVICE_PROXY);
  t.true(agentService.methodsArray[0].requestStream && agentService.methodsArray[0].responseStream);
  const map = new Map([[md.MD_SERVER_ID, ['a', 'b']]]);
  t.is(md.firstValue(map, md.MD_SERVER_ID), 'a');
  t.is(md.firstValue(map, md.MD_SERVER_COUNT), undefined);
});
