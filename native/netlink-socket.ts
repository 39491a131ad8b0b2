// A synchronous AF_NETLINK/NETLINK_ROUTE socket over libc via koffi.
//
// Why synchronous: each request is one datagram and one short reply from the
// kernel; there is nothing to overlap with. Why still bounded: SO_RCVTIMEO plus
// an overall deadline, so a lost reply turns into an error instead of a hang.
// Netlink acts on the calling process's network namespace.
// Typed-array views below rely on Buffer.alloc never returning a pooled
// (unaligned) slice.

import koffi from 'koffi';
import { EAGAIN, EINTR, SOCK_CLOEXEC, SOL_SOCKET, getLibc } from './libc.js';
import { NetlinkError, describeErrno } from './netlink-error.js';
import { NLMSG_DONE, NLMSG_ERROR, type NlMessage, parseErrorPayload, parseMessages, readI32 } from './netlink-message.js';

export const AF_NETLINK = 16;
export const SOCK_RAW = 3;
export const NETLINK_ROUTE = 0;
const SO_RCVTIMEO = 20;
const SOL_NETLINK = 270;
const NETLINK_CAP_ACK = 10;
const NETLINK_EXT_ACK = 11;
export const MSG_TRUNC = 0x20;

const RECV_BUFFER_BYTES = 64 * 1024; // larger than any single dump datagram the kernel builds
export const DEFAULT_TIMEOUT_MS = 5000;

export function sysError(operation: string, call: string): NetlinkError {
  const errno = koffi.errno();
  return new NetlinkError(operation, errno, `${operation}: ${call} failed (${describeErrno(errno)})`);
}

/**
 * struct sockaddr_nl { u16 family; u16 pad; u32 pid; u32 groups } — pid 0 is
 * the kernel / "assign me"; groups are the multicast groups to join on bind.
 */
export function sockaddrNl(groups = 0): Buffer {
  const sa = Buffer.alloc(12);
  // Host-endian integers: typed-array views let the platform decide the byte order.
  new Uint16Array(sa.buffer, sa.byteOffset, 1)[0] = AF_NETLINK;
  new Uint32Array(sa.buffer, sa.byteOffset + 8, 1)[0] = groups >>> 0;
  return sa;
}

/** struct timeval { long tv_sec; long tv_usec } with the platform's `long`. */
function timeval(ms: number): Buffer {
  const longSize = koffi.sizeof('long');
  const tv = Buffer.alloc(longSize * 2);
  const sec = Math.floor(ms / 1000);
  const usec = (ms % 1000) * 1000;
  if (longSize === 8) {
    const v = new BigInt64Array(tv.buffer, tv.byteOffset, 2);
    v[0] = BigInt(sec);
    v[1] = BigInt(usec);
  } else {
    const v = new Int32Array(tv.buffer, tv.byteOffset, 2);
    v[0] = sec;
    v[1] = usec;
  }
  return tv;
}

function intOpt(value: number): Buffer {
  const b = Buffer.alloc(4);
  new Int32Array(b.buffer, b.byteOffset, 1)[0] = value;
  return b;
}

export interface NetlinkSocketOptions {
  /** Bound on waiting for the complete answer to one request. */
  timeoutMs?: number;
}

export class NetlinkSocket {
  private fd: number;
  private seq: number;
  private readonly timeoutMs: number;
  private readonly buf = Buffer.alloc(RECV_BUFFER_BYTES);

  private constructor(fd: number, timeoutMs: number) {
    this.fd = fd;
    this.timeoutMs = timeoutMs;
    // Start from the clock like iproute2 does, so replies to a previous socket cannot match.
    this.seq = Math.floor(Date.now() / 1000) >>> 0;
  }

  static open(options: NetlinkSocketOptions = {}): NetlinkSocket {
    const timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const c = getLibc();
    const op = 'open netlink socket';
    const fd = c.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) throw sysError(op, 'socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)');
    try {
      const tv = timeval(timeoutMs);
      if (c.setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, tv, tv.length) < 0) throw sysError(op, 'setsockopt(SO_RCVTIMEO)');
      // Best effort: extended ACK gives kernel error text; CAP_ACK keeps error replies small.
      c.setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, intOpt(1), 4);
      c.setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, intOpt(1), 4);
      const sa = sockaddrNl();
      if (c.bind(fd, sa, sa.length) < 0) throw sysError(op, 'bind');
    } catch (err) {
      c.close(fd);
      throw err;
    }
    return new NetlinkSocket(fd, timeoutMs);
  }

  close(): void {
    if (this.fd >= 0) {
      getLibc().close(this.fd);
      this.fd = -1;
    }
  }

  /**
   * Send one request built for a fresh sequence number and collect every reply
   * message for it until the terminating ACK / NLMSG_DONE. A non-zero error
   * becomes a NetlinkError carrying the errno and the kernel's extack text.
   * Requests must carry NLM_F_ACK (or be dumps) so that a terminator exists.
   */
  request(operation: string, build: (seq: number) => Buffer): NlMessage[] {
    if (this.fd < 0) throw new NetlinkError(operation, 0, `${operation}: netlink socket is closed`);
    const c = getLibc();
    this.seq = (this.seq + 1) >>> 0;
    const seq = this.seq;
    const msg = build(seq);
    const dest = sockaddrNl();
    for (;;) {
      const sent = Number(c.sendto(this.fd, msg, msg.length, 0, dest, dest.length));
      if (sent >= 0) break;
      if (koffi.errno() !== EINTR) throw sysError(operation, 'sendto');
    }

    const deadline = Date.now() + this.timeoutMs;
    const replies: NlMessage[] = [];
    for (;;) {
      if (Date.now() > deadline) {
        throw new NetlinkError(operation, 0, `${operation}: no complete reply from the kernel within ${this.timeoutMs} ms`);
      }
      const n = Number(c.recv(this.fd, this.buf, this.buf.length, MSG_TRUNC));
      if (n < 0) {
        const errno = koffi.errno();
        if (errno === EINTR) continue;
        if (errno === EAGAIN) {
          throw new NetlinkError(operation, 0, `${operation}: no reply from the kernel within ${this.timeoutMs} ms`);
        }
        throw sysError(operation, 'recv');
      }
      if (n > this.buf.length) {
        throw new NetlinkError(operation, 0, `${operation}: netlink reply of ${n} bytes exceeds the ${this.buf.length}-byte buffer`);
      }
      // Copy: the receive buffer is reused for the next datagram.
      for (const m of parseMessages(Buffer.from(this.buf.subarray(0, n)))) {
        if (m.seq !== seq) continue; // stale reply to an earlier (timed-out) request
        if (m.type === NLMSG_ERROR) {
          const e = parseErrorPayload(m);
          if (e.errno === 0) return replies;
          throw kernelError(operation, e.errno, e.extackMessage);
        }
        if (m.type === NLMSG_DONE) {
          const errno = m.payload.length >= 4 ? -readI32(m.payload, 0) : 0;
          if (errno > 0) throw kernelError(operation, errno, undefined);
          return replies;
        }
        replies.push(m);
      }
    }
  }
}

function kernelError(operation: string, errno: number, extack: string | undefined): NetlinkError {
  const detail = extack ? `: ${extack}` : '';
  return new NetlinkError(operation, errno, `${operation} failed (${describeErrno(errno)})${detail}`, extack);
}

/** Open a socket, run `fn`, always close. */
export function withNetlinkSocket<T>(fn: (sock: NetlinkSocket) => T, options?: NetlinkSocketOptions): T {
  const sock = NetlinkSocket.open(options);
  try {
    return fn(sock);
  } finally {
    sock.close();
  }
}
