/**
 * A tiny DNS server on 127.0.0.1 (UDP, RFC 1035 section 4) standing in for
 * a cluster's DNS Service: A and AAAA records with a TTL, NXDOMAIN, a name
 * with records of neither type (NODATA), a "flood" name answering with many
 * records, and a silent name that is never answered. It counts the queries
 * per name, so a test sees what a cache saved. Answers fit 512 bytes (no
 * truncation, no TCP).
 */
import dgram from 'node:dgram';
import { once } from 'node:events';
import { isIPv4 } from 'node:net';

export type StandInRecord =
  { kind: 'records'; a?: readonly string[]; aaaa?: readonly string[]; ttl: number } | { kind: 'nxdomain' } | { kind: 'silent' };

const TYPE_A = 1;
const TYPE_AAAA = 28;

export interface DnsStandIn {
  host: string;
  port: number;
  /** What each name (lower case, no trailing dot) answers; a name not here is NXDOMAIN. */
  records: Map<string, StandInRecord>;
  /** Queries received, by name (either type). */
  queries: Map<string, number>;
  totalQueries(): number;
  close(): Promise<void>;
}

/** 16 bytes of an IPv6 literal. */
function ipv6Bytes(text: string): Buffer {
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const words = (s: string | undefined): number[] => (s ? s.split(':').map((w) => parseInt(w, 16)) : []);
  const h = words(head);
  const t = words(tail);
  const all = tail === undefined ? h : [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  const out = Buffer.alloc(16);
  all.forEach((w, i) => out.writeUInt16BE(w, i * 2));
  return out;
}

function ipv4Bytes(text: string): Buffer {
  return Buffer.from(text.split('.').map(Number));
}

/** The question's name, type and where the question ends, or undefined for what is not a query. */
function question(msg: Buffer): { name: string; type: number; end: number } | undefined {
  if (msg.length < 12 || msg.readUInt16BE(4) !== 1) return undefined;
  const labels: string[] = [];
  let pos = 12;
  for (let i = 0; i < 128 && pos < msg.length; i++) {
    const len = msg[pos++];
    if (len === 0) {
      if (pos + 4 > msg.length) return undefined;
      return { name: labels.join('.').toLowerCase(), type: msg.readUInt16BE(pos), end: pos + 4 };
    }
    if (len > 63) return undefined;
    labels.push(msg.subarray(pos, pos + len).toString('latin1'));
    pos += len;
  }
  return undefined;
}

function answer(msg: Buffer, q: { name: string; type: number; end: number }, record: StandInRecord | undefined): Buffer {
  const header = Buffer.alloc(12);
  msg.copy(header, 0, 0, 2);
  const rcode = record === undefined || record.kind === 'nxdomain' ? 3 : 0;
  // QR, opcode 0, AA, RD copied as asked, RA; then the rcode.
  header.writeUInt16BE(0x8400 | (msg.readUInt16BE(2) & 0x0100) | 0x0080 | rcode, 2);
  header.writeUInt16BE(1, 4);
  const rrs: Buffer[] = [];
  if (record?.kind === 'records') {
    const values = q.type === TYPE_A ? (record.a ?? []) : q.type === TYPE_AAAA ? (record.aaaa ?? []) : [];
    for (const v of values) {
      const data = isIPv4(v) ? ipv4Bytes(v) : ipv6Bytes(v);
      const rr = Buffer.alloc(12);
      rr.writeUInt16BE(0xc00c, 0); // a pointer to the question's name
      rr.writeUInt16BE(q.type, 2);
      rr.writeUInt16BE(1, 4);
      rr.writeUInt32BE(record.ttl, 6);
      rr.writeUInt16BE(data.length, 10);
      rrs.push(rr, data);
    }
    header.writeUInt16BE(rrs.length / 2, 6);
  }
  return Buffer.concat([header, msg.subarray(12, q.end), ...rrs]);
}

export async function startDnsStandIn(): Promise<DnsStandIn> {
  const socket = dgram.createSocket('udp4');
  const records = new Map<string, StandInRecord>();
  const queries = new Map<string, number>();
  socket.on('message', (msg, rinfo) => {
    const q = question(msg);
    if (!q) return;
    queries.set(q.name, (queries.get(q.name) ?? 0) + 1);
    const record = records.get(q.name);
    if (record?.kind === 'silent') return;
    socket.send(answer(msg, q, record), rinfo.port, rinfo.address);
  });
  socket.bind(0, '127.0.0.1');
  await once(socket, 'listening');
  const { port } = socket.address();
  return {
    host: '127.0.0.1',
    port,
    records,
    queries,
    totalQueries: () => [...queries.values()].reduce((a, b) => a + b, 0),
    close: () => new Promise<void>((resolve) => socket.close(() => resolve())),
  };
}
