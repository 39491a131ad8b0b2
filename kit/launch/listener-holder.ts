/**
 * Which process holds the TCP listener of host:port, read from Linux's /proc.
 * The LISTEN socket's inode comes from a network namespace's
 * /proc/<pid>/net/tcp and tcp6, its holders are the processes whose
 * /proc/<pid>/fd/* link to `socket:[inode]` (proc(5)). A readiness wait uses
 * it to accept an answer only from the process it started, not from another
 * one that took the same port.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';

/** Who holds the listener that takes connections to host:port. */
export type ListenerHolder =
  /** No LISTEN socket takes host:port in that namespace (or /proc could not be read). */
  | { kind: 'none' }
  /** The process asked about, or one of its descendants: `pid` holds it. */
  | { kind: 'own'; pid: number }
  /** Someone else: the pids whose fds could be read (none when no holder is readable). */
  | { kind: 'other'; pids: number[] };

/** One row of /proc/net/tcp or tcp6. */
export interface SocketRow {
  /** The local address in network byte order (4 or 16 bytes). */
  address: Buffer;
  port: number;
  /** The state as the kernel prints it ('0A' is LISTEN). */
  state: string;
  inode: string;
}

/** TCP_LISTEN (include/net/tcp_states.h), as the kernel prints it in the `st` column. */
const LISTEN = '0A';

/**
 * The rows of a /proc/net/tcp or tcp6 text. The kernel prints an address as
 * 32-bit words in host byte order (`%08X` each; 127.0.0.1 is 0100007F on
 * little-endian) and the port already in host order.
 */
export function parseSocketTable(text: string): SocketRow[] {
  const rows: SocketRow[] = [];
  for (const line of text.split('\n').slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10) continue;
    const [hex, port] = f[1].split(':');
    if (port === undefined || !/^[0-9A-F]+$/i.test(hex) || hex.length % 8 !== 0) continue;
    const address = Buffer.alloc(hex.length / 2);
    for (let i = 0; i < address.length / 4; i++) {
      const word = parseInt(hex.slice(i * 8, i * 8 + 8), 16);
      if (os.endianness() === 'LE') address.writeUInt32LE(word, i * 4);
      else address.writeUInt32BE(word, i * 4);
    }
    rows.push({ address, port: parseInt(port, 16), state: f[3].toUpperCase(), inode: f[9] });
  }
  return rows;
}

/** An IP literal's bytes (a URL's `[::1]` too); undefined for a name. */
function ipBytes(host: string): Buffer | undefined {
  const h = host.replace(/^\[(.*)\]$/, '$1').replace(/%.*$/, '');
  if (net.isIPv4(h)) return Buffer.from(h.split('.').map(Number));
  if (!net.isIPv6(h)) return undefined;
  // A trailing dotted quad (::ffff:127.0.0.1) is the last two 16-bit groups.
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(h);
  const text = quad
    ? `${h.slice(0, quad.index)}${((+quad[1] << 8) | +quad[2]).toString(16)}:${((+quad[3] << 8) | +quad[4]).toString(16)}`
    : h;
  const [head, tail] = text.split('::');
  const groups = (s: string | undefined): string[] => (s ? s.split(':') : []);
  const all =
    tail === undefined
      ? groups(head)
      : [...groups(head), ...Array<string>(8 - groups(head).length - groups(tail).length).fill('0'), ...groups(tail)];
  const out = Buffer.alloc(16);
  all.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2));
  return out;
}

const V4_ANY = Buffer.alloc(4);
const V6_ANY = Buffer.alloc(16);
const v4Mapped = (v4: Buffer): Buffer => Buffer.concat([Buffer.alloc(10), Buffer.from([0xff, 0xff]), v4]);

function readTable(file: string): SocketRow[] {
  try {
    return parseSocketTable(fs.readFileSync(file, 'utf8'));
  } catch {
    // no IPv6 in that kernel, or the process whose view this is has gone
    return [];
  }
}

/**
 * The inodes of the LISTEN sockets that take a connection to host:port in the
 * network namespace of `viewPid`: those bound to the address itself if any,
 * else those bound to the wildcard (the kernel looks up the exact address
 * first: inet_lhash2_lookup in net/ipv4/inet_hashtables.c). A name (not an IP
 * literal) matches a listener on any address.
 */
export function listenerInodes(host: string, port: number, viewPid: number = process.pid): string[] {
  const listening = (file: string): SocketRow[] =>
    readTable(`/proc/${viewPid}/net/${file}`).filter((r) => r.state === LISTEN && r.port === port);
  const v4 = listening('tcp');
  const v6 = listening('tcp6');
  const ip = ipBytes(host);
  if (ip === undefined) return [...v4, ...v6].map((r) => r.inode);
  const is = (r: SocketRow, b: Buffer): boolean => r.address.equals(b);
  // A v4 address also reaches a v6 socket bound to its mapped form or to :: (unless IPV6_V6ONLY, which /proc does not show).
  const exact = ip.length === 4 ? [...v4.filter((r) => is(r, ip)), ...v6.filter((r) => is(r, v4Mapped(ip)))] : v6.filter((r) => is(r, ip));
  const wildcard =
    ip.length === 4 ? [...v4.filter((r) => is(r, V4_ANY)), ...v6.filter((r) => is(r, V6_ANY))] : v6.filter((r) => is(r, V6_ANY));
  return (exact.length > 0 ? exact : wildcard).map((r) => r.inode);
}

/** Every process's parent, from /proc/<pid>/stat (present on every kernel, unlike task/<tid>/children, which needs CONFIG_PROC_CHILDREN). */
function parents(): Map<number, number> {
  const out = new Map<number, number>();
  for (const name of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${name}/stat`, 'utf8');
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      out.set(Number(name), ppid);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** `root` and its descendants (wrappers that fork rather than exec leave the program below them). */
export function processTree(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const [pid, ppid] of parents()) children.set(ppid, [...(children.get(ppid) ?? []), pid]);
  const tree = [root];
  for (let i = 0; i < tree.length; i++) tree.push(...(children.get(tree[i]) ?? []));
  return tree;
}

/** Which of `inodes` each of `pids` holds (fds unreadable, or of a process gone, count as none). */
function heldBy(pids: Iterable<number>, inodes: ReadonlySet<string>): Map<string, number> {
  const out = new Map<string, number>();
  for (const pid of pids) {
    let fds: string[];
    try {
      fds = fs.readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const fd of fds) {
      try {
        const inode = /^socket:\[(\d+)\]$/.exec(fs.readlinkSync(`/proc/${pid}/fd/${fd}`))?.[1];
        if (inode !== undefined && inodes.has(inode) && !out.has(inode)) out.set(inode, pid);
      } catch {
        // closed meanwhile
      }
    }
  }
  return out;
}

/**
 * Who holds the listener that takes connections to host:port, asked about
 * `pid`: 'own' when every such socket is held by it or a descendant (two
 * holders, e.g. SO_REUSEPORT, leave who answered unknown), 'other' otherwise.
 * `viewPid` names the network namespace: that of the process that connects
 * (this one by default).
 */
export function listenerHolder(host: string, port: number, pid: number, viewPid: number = process.pid): ListenerHolder {
  const inodes = new Set(listenerInodes(host, port, viewPid));
  if (inodes.size === 0) return { kind: 'none' };
  const own = heldBy(processTree(pid), inodes);
  if (own.size === inodes.size) return { kind: 'own', pid: [...own.values()][0] };
  const foreign = new Set([...inodes].filter((i) => !own.has(i)));
  const all = fs
    .readdirSync('/proc')
    .filter((n) => /^\d+$/.test(n))
    .map(Number);
  return { kind: 'other', pids: [...new Set(heldBy(all, foreign).values())].sort((a, b) => a - b) };
}
