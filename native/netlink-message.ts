// Netlink framing (pure: no sockets, no kernel): nlmsghdr, nlmsgerr and rtattr
// TLVs, the layer under every rtnetlink message (<linux/netlink.h>, RFC 3549).
//
// Netlink headers and attributes are in host byte order and padded to 4 bytes
// (NLMSG_ALIGN / RTA_ALIGN). Keeping this module free of I/O lets the byte
// layout be unit-tested without root.

import { endianness } from 'node:os';

// <linux/netlink.h>
export const NLMSG_ERROR = 2;
export const NLMSG_DONE = 3;
export const NLM_F_REQUEST = 0x1;
export const NLM_F_ACK = 0x4;
export const NLM_F_ROOT = 0x100;
export const NLM_F_MATCH = 0x200;
export const NLM_F_DUMP = NLM_F_ROOT | NLM_F_MATCH;
export const NLM_F_EXCL = 0x200;
export const NLM_F_CREATE = 0x400;
// Flags the kernel sets on NLMSG_ERROR replies (NETLINK_CAP_ACK / NETLINK_EXT_ACK).
export const NLM_F_CAPPED = 0x100;
export const NLM_F_ACK_TLVS = 0x200;
export const NLMSGERR_ATTR_MSG = 1;

export const NLMSG_HDRLEN = 16;
const RTA_HDRLEN = 4;

const LE = endianness() === 'LE';

export function align4(n: number): number {
  return (n + 3) & ~3;
}

// Host-order integer helpers: netlink is native-endian, not network-endian.
export function writeU16(buf: Buffer, value: number, offset: number): void {
  if (LE) buf.writeUInt16LE(value, offset);
  else buf.writeUInt16BE(value, offset);
}
export function writeU32(buf: Buffer, value: number, offset: number): void {
  if (LE) buf.writeUInt32LE(value >>> 0, offset);
  else buf.writeUInt32BE(value >>> 0, offset);
}
export function writeI32(buf: Buffer, value: number, offset: number): void {
  if (LE) buf.writeInt32LE(value, offset);
  else buf.writeInt32BE(value, offset);
}
export function readU16(buf: Buffer, offset: number): number {
  return LE ? buf.readUInt16LE(offset) : buf.readUInt16BE(offset);
}
export function readU32(buf: Buffer, offset: number): number {
  return LE ? buf.readUInt32LE(offset) : buf.readUInt32BE(offset);
}
export function readI32(buf: Buffer, offset: number): number {
  return LE ? buf.readInt32LE(offset) : buf.readInt32BE(offset);
}

// ---------------------------------------------------------------- rtattr TLVs

export interface RtAttr {
  type: number;
  value: Buffer;
}

/** One rtattr: u16 len (header + value, unpadded), u16 type, value, pad to 4. */
export function encodeAttr(type: number, value: Buffer): Buffer {
  const len = RTA_HDRLEN + value.length;
  const out = Buffer.alloc(align4(len));
  writeU16(out, len, 0);
  writeU16(out, type, 2);
  value.copy(out, RTA_HDRLEN);
  return out;
}

/** NUL-terminated string attribute (IFLA_IFNAME, IFLA_INFO_KIND). */
export function encodeStringAttr(type: number, value: string): Buffer {
  return encodeAttr(type, Buffer.concat([Buffer.from(value, 'utf8'), Buffer.alloc(1)]));
}

/** Nested attribute: the value is a sequence of already-encoded attributes. */
export function encodeNestedAttr(type: number, children: Buffer[]): Buffer {
  return encodeAttr(type, Buffer.concat(children));
}

export function parseAttrs(buf: Buffer, start = 0, end = buf.length): RtAttr[] {
  const attrs: RtAttr[] = [];
  let off = start;
  while (off + RTA_HDRLEN <= end) {
    const len = readU16(buf, off);
    const type = readU16(buf, off + 2);
    if (len < RTA_HDRLEN || off + len > end) break; // malformed: stop, do not throw on kernel data
    // Mask NLA_F_NESTED / NLA_F_NET_BYTEORDER so callers can match on the plain type.
    attrs.push({ type: type & 0x3fff, value: buf.subarray(off + RTA_HDRLEN, off + len) });
    off += align4(len);
  }
  return attrs;
}

export function attrString(value: Buffer): string {
  const nul = value.indexOf(0);
  return value.subarray(0, nul === -1 ? value.length : nul).toString('utf8');
}

// ---------------------------------------------------------------- nlmsghdr

export interface NlMessage {
  type: number;
  flags: number;
  seq: number;
  pid: number;
  /** Bytes after the 16-byte header, up to nlmsg_len. */
  payload: Buffer;
}

/** nlmsghdr: u32 len, u16 type, u16 flags, u32 seq, u32 pid (0: let the kernel fill it). */
export function encodeMessage(type: number, flags: number, seq: number, payload: Buffer): Buffer {
  const len = NLMSG_HDRLEN + payload.length;
  const out = Buffer.alloc(align4(len));
  writeU32(out, len, 0);
  writeU16(out, type, 4);
  writeU16(out, flags, 6);
  writeU32(out, seq, 8);
  writeU32(out, 0, 12);
  payload.copy(out, NLMSG_HDRLEN);
  return out;
}

/** Split one datagram into its netlink messages. */
export function parseMessages(buf: Buffer): NlMessage[] {
  const msgs: NlMessage[] = [];
  let off = 0;
  while (off + NLMSG_HDRLEN <= buf.length) {
    const len = readU32(buf, off);
    if (len < NLMSG_HDRLEN || off + len > buf.length) {
      throw new Error(`malformed netlink message at offset ${off}: nlmsg_len ${len}, datagram ${buf.length} bytes`);
    }
    msgs.push({
      type: readU16(buf, off + 4),
      flags: readU16(buf, off + 6),
      seq: readU32(buf, off + 8),
      pid: readU32(buf, off + 12),
      payload: buf.subarray(off + NLMSG_HDRLEN, off + len),
    });
    off += align4(len);
  }
  return msgs;
}

export interface NlError {
  /** Positive errno; 0 means this NLMSG_ERROR is a plain ACK. */
  errno: number;
  /** Kernel's extended-ACK text (NLMSGERR_ATTR_MSG), when it sent one. */
  extackMessage?: string;
}

/**
 * nlmsgerr: s32 error (negative errno), then the offending request's header
 * (only the header when NLM_F_CAPPED), then extack TLVs when NLM_F_ACK_TLVS.
 */
export function parseErrorPayload(msg: NlMessage): NlError {
  const p = msg.payload;
  if (p.length < 4) return { errno: 0 };
  const errno = -readI32(p, 0);
  const result: NlError = { errno };
  if ((msg.flags & NLM_F_ACK_TLVS) !== 0 && p.length >= 4 + NLMSG_HDRLEN) {
    const origLen = readU32(p, 4);
    const tlvStart = 4 + ((msg.flags & NLM_F_CAPPED) !== 0 ? NLMSG_HDRLEN : align4(origLen));
    if (tlvStart <= p.length) {
      for (const a of parseAttrs(p, tlvStart)) {
        if (a.type === NLMSGERR_ATTR_MSG) result.extackMessage = attrString(a.value);
      }
    }
  }
  return result;
}
