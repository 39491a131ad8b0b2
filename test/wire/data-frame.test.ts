/**
 * The DATA packet's wire format (src/wire/data-frame.ts): its encoder agrees
 * with the general codec, protobufjs and grpc-js's proto-loader byte for
 * byte; the header written without its payload plus the payload is the
 * message; matchDataHeader agrees with the decoder; malformed DATA is refused
 * with PacketDecodeError naming what is wrong.
 */
import test from 'ava';
import crypto from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';
import { decodePacket, encodePacket } from '../../src/wire/codec.js';
import { decodeData, encodeData, matchDataHeader } from '../../src/wire/data-frame.js';
import { PacketType, type DataPacket, type Packet } from '../../src/wire/packet.js';
import { PacketDecodeError } from '../../src/wire/protobuf.js';

const here = path.dirname(fileURLToPath(import.meta.url));
// dist/test/wire/data-frame.test.js -> repository root
const PROTO = path.resolve(here, '..', '..', '..', 'proto', 'konnectivity.proto');
const PbPacket = (await protobuf.load(PROTO)).lookupType('Packet');
const connectMethod = protoLoader.loadSync(PROTO, { longs: String, defaults: false })['AgentService'];

/** grpc-js's serializer for AgentService/Connect's Packet (proto-loader over protobufjs). */
function grpcJsSerialize(p: DataPacket): Buffer {
  if (connectMethod === undefined || !('Connect' in connectMethod)) throw new Error('AgentService.Connect not in the .proto');
  const serialize = connectMethod['Connect'].requestSerialize;
  // As a caller would: proto3 defaults left unset (protobufjs writes fields set explicitly, defaults included).
  const data: Record<string, unknown> = {};
  if (p.connectID !== 0) data['connectID'] = String(p.connectID);
  if (p.error !== '') data['error'] = p.error;
  if (p.data.length !== 0) data['data'] = Buffer.from(p.data);
  return serialize({ type: 'DATA', data });
}

function protobufjsEncode(p: DataPacket): Buffer {
  const msg = PbPacket.fromObject({ type: PacketType.DATA, data: { connectID: p.connectID, error: p.error, data: p.data } });
  return Buffer.from(PbPacket.encode(msg).finish());
}

const SIZES = [0, 1, 127, 128, 1023, 1024, 16384, 65536, 70000, 300000];
const IDS = [0, 1, 127, 128, 300, 2 ** 31, 2 ** 40, Number.MAX_SAFE_INTEGER];
const ERRORS = ['', 'x', 'é'.repeat(100)];

function samples(): DataPacket[] {
  const out: DataPacket[] = [];
  for (const size of SIZES) {
    const data = crypto.randomBytes(size);
    for (const connectID of IDS) for (const error of ERRORS) out.push({ type: PacketType.DATA, connectID, error, data });
  }
  return out;
}

test('encodeData agrees byte for byte with encodePacket, protobufjs and grpc-js, and decodes back', (t) => {
  for (const p of samples()) {
    const whole = encodeData(p.connectID, p.error, p.data, 0, true);
    t.true(whole.equals(encodePacket(p)));
    t.true(whole.equals(protobufjsEncode(p)), `protobufjs, connectID ${p.connectID}, ${p.data.length} bytes`);
    t.true(whole.equals(grpcJsSerialize(p)), `grpc-js, connectID ${p.connectID}, ${p.data.length} bytes`);
    for (const bytes of [whole, protobufjsEncode(p)]) {
      const d = decodePacket(bytes);
      t.true(d.type === PacketType.DATA && d.connectID === p.connectID && d.error === p.error && Buffer.from(d.data).equals(p.data));
    }
  }
});

test('encodeData without the payload is its header: header + payload is the message, after the headroom', (t) => {
  for (const p of samples()) {
    for (const headroom of [0, 5]) {
      const header = encodeData(p.connectID, p.error, p.data, headroom, false);
      const message = Buffer.concat([header.subarray(headroom), p.data]);
      t.true(message.equals(encodePacket(p)));
      t.true(encodePacket(p, headroom).subarray(headroom).equals(message), 'encodePacket leaves the same headroom');
    }
  }
});

test('matchDataHeader finds the payload of every encoded DATA without an error, and nothing else', (t) => {
  for (const p of samples()) {
    const body = encodePacket(p);
    const h = matchDataHeader(body, 0, body.length, body.length);
    // connectIDs of 2^49 and more (8-byte varints) are left to the decoder.
    if (p.error !== '' || p.data.length === 0 || p.connectID >= 2 ** 49) {
      t.is(h, null, 'only DATA laid out as header + payload is streamed');
      continue;
    }
    t.deepEqual(h, { connectID: p.connectID, headerBytes: body.length - p.data.length });
    // The header must lie inside the bytes at hand; the payload need not.
    t.not(matchDataHeader(body, 0, h!.headerBytes, body.length), null);
    t.is(matchDataHeader(body, 0, h!.headerBytes - 1, body.length), null);
    // A message length that disagrees with the header is not a DATA message.
    t.is(matchDataHeader(body, 0, body.length, body.length + 1), null);
  }
  const other = encodePacket({ type: PacketType.KANAL_WINDOW, connectID: 1, increment: 65536 });
  t.is(matchDataHeader(other, 0, other.length, other.length), null);
});

test('matchDataHeader agrees with decodePacket, corrupted headers included', (t) => {
  let matched = 0;
  for (let i = 0; i < 3000; i++) {
    const size = Math.floor(Math.random() * 300);
    const p: Packet =
      i % 3 === 0
        ? {
            type: PacketType.DATA,
            connectID: Math.floor(Math.random() * 2 ** (i % 53)),
            error: i % 7 === 0 ? 'e' : '',
            data: crypto.randomBytes(size),
          }
        : { type: PacketType.KANAL_WINDOW, connectID: i, increment: size };
    const body = encodePacket(p);
    // Random corruption of a header byte now and then.
    if (i % 5 === 1) body[Math.floor(Math.random() * Math.min(body.length, 12))] ^= 1 << Math.floor(Math.random() * 8);
    const h = matchDataHeader(body, 0, body.length, body.length);
    if (h === null) continue;
    matched++;
    const d = decodePacket(body);
    t.is(d.type, PacketType.DATA);
    if (d.type !== PacketType.DATA) continue;
    t.is(d.connectID, h.connectID);
    t.is(d.error, '');
    t.true(Buffer.from(d.data).equals(body.subarray(h.headerBytes)));
  }
  t.true(matched > 500);
});

/** Packet{type=DATA, data=<inner>} around raw Data bytes. */
function dataPacket(inner: number[]): Uint8Array {
  return Uint8Array.from([0x08, 0x04, 0x22, inner.length, ...inner]);
}

function refusal(buf: Uint8Array): string {
  try {
    decodePacket(buf);
  } catch (err) {
    if (err instanceof PacketDecodeError) return err.message;
    throw err;
  }
  return 'accepted';
}

test('truncated DATA is refused at every cut that leaves a field unfinished', (t) => {
  const body = encodePacket({ type: PacketType.DATA, connectID: 300, error: 'e', data: crypto.randomBytes(200) });
  t.regex(refusal(body.subarray(0, 1)), /truncated varint/);
  // Two bytes are a DATA packet without its (optional) payload message: valid.
  t.deepEqual(decodePacket(body.subarray(0, 2)), { type: PacketType.DATA, connectID: 0, error: '', data: new Uint8Array(0) });
  for (let cut = 3; cut < body.length; cut++) t.regex(refusal(body.subarray(0, cut)), /^truncated (varint|field)$/, `cut at ${cut}`);
  // Inside Data: a connectID varint cut short, a payload length beyond the message.
  t.is(refusal(dataPacket([0x08, 0x80])), 'truncated varint');
  t.is(refusal(dataPacket([0x1a, 0x05, 1, 2])), 'truncated field');
  t.is(refusal(Uint8Array.from([0x08, 0x04, 0x22, 0x80, 0x80, 0x80, 0x80, 0x08])), 'truncated field');
  t.is(refusal(dataPacket([0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])), 'varint too long');
});

test('DATA fields of the wrong wire type, out of range or not UTF-8 are refused by name', (t) => {
  t.is(refusal(dataPacket([0x0a, 0x01, 0x01])), 'field 1 of DATA has wire type 2');
  t.is(refusal(dataPacket([0x10, 0x01])), 'field 2 of DATA has wire type 0');
  t.is(refusal(dataPacket([0x18, 0x01])), 'field 3 of DATA has wire type 0');
  t.is(refusal(dataPacket([0x12, 0x02, 0xc3, 0x28])), 'field 2 of DATA is not valid UTF-8');
  const negative = encodePacket({ type: PacketType.DATA, connectID: -1, error: '', data: Buffer.from('x') });
  t.is(refusal(negative), 'field 1 of DATA out of range');
  t.is(refusal(dataPacket([0x08, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10])), 'field 1 of DATA out of range', '2^53');
  // Unknown fields inside Data are skipped; the last payload wins.
  const ok = decodeData(Uint8Array.from([0x28, 0x07, 0x1a, 0x01, 0x41, 0x1a, 0x01, 0x42]), 0, 8);
  t.deepEqual({ ...ok, data: Buffer.from(ok.data).toString() }, { type: PacketType.DATA, connectID: 0, error: '', data: 'B' });
});
