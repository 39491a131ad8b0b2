// rtnetlink link and address messages (pure: no sockets, no kernel), on the
// netlink framing of netlink-message.ts.
//
// Addresses inside attributes are in network order; everything else in host
// order. Keeping this module free of I/O lets the byte layout be unit-tested without root.

import { isIP } from 'node:net';
import {
  NLM_F_ACK,
  NLM_F_CREATE,
  NLM_F_DUMP,
  NLM_F_EXCL,
  NLM_F_REQUEST,
  encodeAttr,
  encodeMessage,
  encodeNestedAttr,
  encodeStringAttr,
  parseAttrs,
  attrString,
  readI32,
  readU32,
  writeI32,
  writeU32,
  type NlMessage,
} from './netlink-message.js';

// <linux/rtnetlink.h>
export const RTM_NEWLINK = 16;
export const RTM_DELLINK = 17;
export const RTM_GETLINK = 18;
export const RTM_NEWADDR = 20;
export const RTM_DELADDR = 21;
export const RTM_GETADDR = 22;
export const RT_SCOPE_UNIVERSE = 0;
export const RT_SCOPE_HOST = 254;

// <linux/if_link.h>
export const IFLA_IFNAME = 3;
export const IFLA_LINKINFO = 18;
export const IFLA_IFALIAS = 20;
export const IFLA_INFO_KIND = 1;
// <linux/if.h>: an alias is at most IFALIASZ - 1 bytes (the kernel adds the NUL).
export const IFALIASZ = 256;

// <linux/if_addr.h>
export const IFA_ADDRESS = 1;
export const IFA_LOCAL = 2;
// Skip duplicate address detection: an IPv6 address stays "tentative" (and
// cannot be bound) until DAD finishes, which never happens on a link without
// carrier. A host-scoped address has nobody to collide with.
export const IFA_F_NODAD = 0x02;

// <linux/if.h>
export const IFF_UP = 0x1;

// <sys/socket.h>
export const AF_UNSPEC = 0;
export const AF_INET = 2;
export const AF_INET6 = 10;

export const IFINFOMSG_LEN = 16;
export const IFADDRMSG_LEN = 8;

// ---------------------------------------------------------------- ifinfomsg (links)

/** ifinfomsg: u8 family, u8 pad, u16 type, s32 index, u32 flags, u32 change. */
export function encodeIfinfomsg(index: number, flags = 0, change = 0): Buffer {
  const out = Buffer.alloc(IFINFOMSG_LEN);
  out.writeUInt8(AF_UNSPEC, 0);
  writeI32(out, index, 4);
  writeU32(out, flags, 8);
  writeU32(out, change, 12);
  return out;
}

/** RTM_NEWLINK creating `name` of `kind`; EXCL so an existing link is reported, not modified. */
export function buildNewLink(seq: number, name: string, kind: string): Buffer {
  return encodeMessage(
    RTM_NEWLINK,
    NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
    seq,
    Buffer.concat([
      encodeIfinfomsg(0),
      encodeStringAttr(IFLA_IFNAME, name),
      encodeNestedAttr(IFLA_LINKINFO, [encodeStringAttr(IFLA_INFO_KIND, kind)]),
    ]),
  );
}

export function buildDelLink(seq: number, ifindex: number): Buffer {
  return encodeMessage(RTM_DELLINK, NLM_F_REQUEST | NLM_F_ACK, seq, encodeIfinfomsg(ifindex));
}

/** Set IFF_UP only: ifi_change masks which flag bits the kernel should touch. */
export function buildSetLinkUp(seq: number, ifindex: number): Buffer {
  return encodeMessage(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK, seq, encodeIfinfomsg(ifindex, IFF_UP, IFF_UP));
}

/**
 * Set the link's alias (IFLA_IFALIAS, `ip link set <dev> alias ...`). Sent as a
 * separate request because the kernel ignores IFLA_IFALIAS when it creates a
 * link (rtnl_create_link does not apply it; only do_setlink does). Like
 * iproute2 the value is sent without a trailing NUL; the kernel stores
 * exactly these bytes and reports them back NUL-terminated. An empty alias
 * would delete the alias, so it is refused here.
 */
export function buildSetLinkAlias(seq: number, ifindex: number, alias: string): Buffer {
  const value = Buffer.from(alias, 'utf8');
  if (value.length === 0 || value.length > IFALIASZ - 1 || value.includes(0)) {
    throw new Error(`interface alias must be 1..${IFALIASZ - 1} bytes without NUL, got ${value.length} bytes`);
  }
  return encodeMessage(
    RTM_NEWLINK,
    NLM_F_REQUEST | NLM_F_ACK,
    seq,
    Buffer.concat([encodeIfinfomsg(ifindex), encodeAttr(IFLA_IFALIAS, value)]),
  );
}

/**
 * RTM_GETLINK for one link by name; the answer is one RTM_NEWLINK (or ENODEV).
 * NLM_F_ACK adds a trailing ACK so every request ends the same way.
 */
export function buildGetLinkByName(seq: number, name: string): Buffer {
  return encodeMessage(
    RTM_GETLINK,
    NLM_F_REQUEST | NLM_F_ACK,
    seq,
    Buffer.concat([encodeIfinfomsg(0), encodeStringAttr(IFLA_IFNAME, name)]),
  );
}

export interface LinkInfo {
  ifindex: number;
  flags: number;
  name?: string;
  /** IFLA_INFO_KIND; absent for links without a driver kind (e.g. physical NICs, lo). */
  kind?: string;
  /** IFLA_IFALIAS; the kernel omits the attribute when the link has no alias. */
  alias?: string;
}

export function parseLink(msg: NlMessage): LinkInfo {
  const p = msg.payload;
  if (p.length < IFINFOMSG_LEN) throw new Error(`short ifinfomsg (${p.length} bytes)`);
  const info: LinkInfo = { ifindex: readI32(p, 4), flags: readU32(p, 8) };
  for (const a of parseAttrs(p, IFINFOMSG_LEN)) {
    if (a.type === IFLA_IFNAME) info.name = attrString(a.value);
    else if (a.type === IFLA_IFALIAS) info.alias = attrString(a.value);
    else if (a.type === IFLA_LINKINFO) {
      for (const n of parseAttrs(a.value)) {
        if (n.type === IFLA_INFO_KIND) info.kind = attrString(n.value);
      }
    }
  }
  return info;
}

// ---------------------------------------------------------------- ifaddrmsg (addresses)

/** Parse an IPv4 or IPv6 literal into its network-order bytes. Throws on anything else. */
export function addressBytes(address: string): { family: number; bytes: Buffer } {
  const v = isIP(address);
  if (v === 4) return { family: AF_INET, bytes: Buffer.from(address.split('.').map(Number)) };
  if (v === 6 && !address.includes('%')) return { family: AF_INET6, bytes: ipv6Bytes(address) };
  throw new Error(`not an IPv4 or IPv6 literal: ${JSON.stringify(address)}`);
}

function ipv6Bytes(address: string): Buffer {
  // Expand an embedded dotted IPv4 tail (::ffff:1.2.3.4) into two hex groups first.
  let text = address;
  const lastColon = text.lastIndexOf(':');
  const tail = text.slice(lastColon + 1);
  if (tail.includes('.')) {
    const o = tail.split('.').map(Number);
    text = `${text.slice(0, lastColon + 1)}${((o[0] << 8) | o[1]).toString(16)}:${((o[2] << 8) | o[3]).toString(16)}`;
  }
  const [head, rest] = text.split('::') as [string, string | undefined];
  const headGroups = head === '' ? [] : head.split(':');
  const tailGroups = rest === undefined || rest === '' ? [] : rest.split(':');
  const fill = rest === undefined ? 0 : 8 - headGroups.length - tailGroups.length;
  const groups = [...headGroups, ...new Array<string>(fill).fill('0'), ...tailGroups];
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2));
  return out;
}

/** Format network-order address bytes back to text (for parsed dumps). */
export function formatAddress(family: number, bytes: Buffer): string {
  if (family === AF_INET) return Array.from(bytes.subarray(0, 4)).join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(bytes.readUInt16BE(i).toString(16));
  // Compress the longest run of zero groups, as inet_ntop does.
  let best = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (groups[i] !== '0') {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === '0') j++;
    if (j - i > bestLen && j - i > 1) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  if (best === -1) return groups.join(':');
  return `${groups.slice(0, best).join(':')}::${groups.slice(best + bestLen).join(':')}`;
}

/** ifaddrmsg: u8 family, u8 prefixlen, u8 flags, u8 scope, u32 index. */
// Positional on purpose: the parameters mirror struct ifaddrmsg field by field (<linux/if_addr.h>).
export function encodeIfaddrmsg(family: number, prefixlen: number, flags: number, scope: number, index: number): Buffer {
  const out = Buffer.alloc(IFADDRMSG_LEN);
  out.writeUInt8(family, 0);
  out.writeUInt8(prefixlen, 1);
  out.writeUInt8(flags, 2);
  out.writeUInt8(scope, 3);
  writeU32(out, index, 4);
  return out;
}

/** Full-length prefix: /32 for IPv4, /128 for IPv6 (a single host address, no subnet route). */
export function hostPrefixLen(family: number): number {
  return family === AF_INET ? 32 : 128;
}

function addrPayload(ifindex: number, address: string, scope: number): Buffer {
  const { family, bytes } = addressBytes(address);
  const flags = family === AF_INET6 ? IFA_F_NODAD : 0;
  return Buffer.concat([
    encodeIfaddrmsg(family, hostPrefixLen(family), flags, scope, ifindex),
    encodeAttr(IFA_LOCAL, bytes),
    encodeAttr(IFA_ADDRESS, bytes),
  ]);
}

/**
 * RTM_NEWADDR address/32|/128 with scope host. EXCL makes an existing address
 * answer EEXIST instead of silently replacing its flags.
 */
export function buildNewAddr(seq: number, ifindex: number, address: string, scope = RT_SCOPE_HOST): Buffer {
  return encodeMessage(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, seq, addrPayload(ifindex, address, scope));
}

export function buildDelAddr(seq: number, ifindex: number, address: string): Buffer {
  return encodeMessage(RTM_DELADDR, NLM_F_REQUEST | NLM_F_ACK, seq, addrPayload(ifindex, address, RT_SCOPE_UNIVERSE));
}

/** Dump all addresses of one family; the kernel may ignore the index, so callers filter. */
export function buildGetAddrDump(seq: number, family: number, ifindex = 0): Buffer {
  return encodeMessage(RTM_GETADDR, NLM_F_REQUEST | NLM_F_DUMP, seq, encodeIfaddrmsg(family, 0, 0, 0, ifindex));
}

export interface AddrInfo {
  family: number;
  prefixlen: number;
  flags: number;
  scope: number;
  ifindex: number;
  local?: string;
  address?: string;
}

export function parseAddr(msg: NlMessage): AddrInfo {
  const p = msg.payload;
  if (p.length < IFADDRMSG_LEN) throw new Error(`short ifaddrmsg (${p.length} bytes)`);
  const info: AddrInfo = {
    family: p.readUInt8(0),
    prefixlen: p.readUInt8(1),
    flags: p.readUInt8(2),
    scope: p.readUInt8(3),
    ifindex: readU32(p, 4),
  };
  for (const a of parseAttrs(p, IFADDRMSG_LEN)) {
    if (a.type === IFA_LOCAL) info.local = formatAddress(info.family, a.value);
    else if (a.type === IFA_ADDRESS) info.address = formatAddress(info.family, a.value);
  }
  return info;
}
