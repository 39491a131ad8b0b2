/**
 * Writes the hand-made part of the committed seed corpus (test/fuzz/corpus):
 * real encodings from the project's own encoders and typical peer input, so
 * every run starts from valid messages rather than from nothing. Run after a
 * build: `node dist/test/fuzz/make-seeds.js`. Files it does not name (inputs a
 * long run saved, regression inputs of findings) are left alone.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { framePacket } from '../../src/transport/h2/framing.js';
import { encodePacket } from '../../src/wire/codec.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { CORPUS } from './paths.js';

const PACKETS: Record<string, Packet> = {
  'dial-req': { type: PacketType.DIAL_REQ, protocol: 'tcp', address: '10.0.0.1:10250', random: 0x1234_5678_9abc_def0n },
  'dial-req-negative-random': { type: PacketType.DIAL_REQ, protocol: 'tcp', address: '[fd00::1]:6443', random: -1n },
  'dial-rsp': { type: PacketType.DIAL_RSP, error: '', connectID: 1, random: 42n },
  'dial-rsp-error': { type: PacketType.DIAL_RSP, error: 'dial tcp 10.0.0.1:443: connect: connection refused', connectID: 0, random: 42n },
  'close-req': { type: PacketType.CLOSE_REQ, connectID: 300 },
  'close-rsp': { type: PacketType.CLOSE_RSP, error: 'unknown connectID', connectID: 2 ** 40 },
  data: { type: PacketType.DATA, connectID: 5, error: '', data: Buffer.from('GET / HTTP/1.1\r\n\r\n') },
  'data-error': { type: PacketType.DATA, connectID: 9, error: 'read: connection reset by peer', data: new Uint8Array(0) },
  'dial-cls': { type: PacketType.DIAL_CLS, random: 7n },
  drain: { type: PacketType.DRAIN },
  window: { type: PacketType.KANAL_WINDOW, connectID: 4, increment: 262144 },
  'half-close': { type: PacketType.KANAL_HALF_CLOSE, connectID: 11 },
  'resolve-req': { type: PacketType.KANAL_RESOLVE_REQ, requestID: 99n, name: 'kubernetes.default.svc', timeoutMs: 5000 },
  'resolve-rsp': {
    type: PacketType.KANAL_RESOLVE_RSP,
    requestID: 99n,
    addresses: ['10.96.0.1', 'fd00::1'],
    error: '',
    resolver: 'cluster DNS 10.96.0.10:53',
    ttl: 30,
  },
};

function write(target: string, name: string, bytes: Uint8Array | string): void {
  const dir = path.join(CORPUS, target);
  mkdirSync(dir, { recursive: true });
  writeFileSync(path.join(dir, name), typeof bytes === 'string' ? Buffer.from(bytes, 'latin1') : bytes);
}

const frame = (p: Packet): Buffer => Buffer.concat(framePacket(p));

for (const [name, p] of Object.entries(PACKETS)) {
  write('packet-decode', name, encodePacket(p));
  // data-header: [chunk end, pad] then the message.
  if (p.type === PacketType.DATA) write('data-header', name, Buffer.concat([Buffer.from([0xff, 3]), encodePacket(p)]));
}
// packet-roundtrip: the first byte picks the packet type, the rest fills its fields.
for (let type = 0; type < 9; type++)
  write('packet-roundtrip', `type-${type}`, Buffer.from([type, 5, 0x61, 0x62, 0x63, 0x64, 0x65, 1, 2, 3, 4, 5, 6, 7, 8, 60, 0x7f]));

// grpc-framing: [split seed, limit choice (5: 1024 bytes)] then a stream of messages.
const bigData: Packet = { type: PacketType.DATA, connectID: 200, error: '', data: Buffer.alloc(300, 0x61) };
write(
  'grpc-framing',
  'stream',
  Buffer.concat([Buffer.from([7, 5]), frame(PACKETS['dial-req']), frame(bigData), frame(PACKETS.window), frame(PACKETS['close-req'])]),
);
write('grpc-framing', 'stream-unfinished', Buffer.concat([Buffer.from([3, 5]), frame(PACKETS.data), frame(bigData).subarray(0, 100)]));
write('grpc-framing', 'compressed-flag', Buffer.concat([Buffer.from([9, 5]), Buffer.from([1, 0, 0, 0, 2, 8, 6])]));
write('grpc-framing', 'oversized', Buffer.concat([Buffer.from([9, 2]), Buffer.from([0, 0, 0, 0x10, 0]), Buffer.alloc(20)]));

// request-head: [split seed, limit choice (6: 8192 bytes)] then the bytes from the KAS.
const head = (s: string): Buffer => Buffer.concat([Buffer.from([5, 6]), Buffer.from(s, 'latin1')]);
write('request-head', 'connect', head('CONNECT 10.0.0.1:10250 HTTP/1.1\r\nHost: 10.0.0.1:10250\r\nUser-Agent: kube-apiserver\r\n\r\n'));
write('request-head', 'connect-early-bytes', head('\r\nCONNECT [fd00::1]:443 HTTP/1.0\r\nX-Empty:\r\nX-Tab:\tv a l\r\n\r\n\x16\x03\x01'));
write('request-head', 'obs-fold', head('CONNECT a:1 HTTP/1.1\r\nHost: a\r\n b\r\n\r\n'));
write(
  'request-head',
  'small-limit',
  Buffer.concat([Buffer.from([1, 3]), Buffer.from('CONNECT a:1 HTTP/1.1\r\nHost: a-long-host-name:443\r\n\r\n')]),
);

write('agent-identifiers', 'all-keys', 'host=node-1&ipv4=10.0.0.5&ipv6=fd00::5&cidr=10.0.0.0/24&default-route=true');
write(
  'agent-identifiers',
  'encoded',
  'host=Node-1.Example&ipv6=FD00%3A0%3A0%3A0%3A0%3A0%3A0%3A5&cidr=fd00%3A%3A%2F64&cidr=0.0.0.0/0&default-route=F',
);
write('agent-identifiers', 'empty', '');

write(
  'grpc-metadata',
  'agent-stream',
  [
    ':path',
    '/AgentService/Connect',
    'content-type',
    'application/grpc',
    'te',
    'trailers',
    'agentid',
    'node-1',
    'agentidentifiers',
    'host=node-1',
    'kanal-features',
    'window,half-close,node-dial',
    'grpc-timeout',
    '5S',
  ].join('\x00'),
);
write(
  'grpc-metadata',
  'bin-and-message',
  ['x-trace-bin', 'AQID,BAU', 'grpc-message', 'bad%20thing%C3%A9%', 'Authorization', 'Bearer x', 'servercount', '3'].join('\x00'),
);
