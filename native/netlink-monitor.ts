// rtnetlink notifications: a NETLINK_ROUTE socket subscribed to the link and
// address multicast groups, read without ever blocking (MSG_DONTWAIT), so the
// caller can drain it from a timer on the event loop. The kernel queues the
// notifications in the socket's receive buffer; when that overflows it drops
// them and reports ENOBUFS once, which `poll` turns into `overflowed` so the
// caller knows to re-read the state it watches instead of trusting the events.

import koffi from 'koffi';
import { EAGAIN, EINTR, SOCK_CLOEXEC, getLibc } from './libc.js';
import { AF_NETLINK, MSG_TRUNC, NETLINK_ROUTE, SOCK_RAW, sockaddrNl, sysError } from './netlink-socket.js';
import { parseMessages, type NlMessage } from './netlink-message.js';

const MSG_DONTWAIT = 0x40;
const ENOBUFS = 105;
const OPERATION = 'rtnetlink monitor';

// <linux/rtnetlink.h> multicast groups (bit masks for sockaddr_nl.nl_groups).
export const RTMGRP_LINK = 0x1;
export const RTMGRP_IPV4_IFADDR = 0x10;
export const RTMGRP_IPV6_IFADDR = 0x100;

const RECV_BUFFER_BYTES = 64 * 1024;
/** Datagrams read per poll at most: a burst beyond this waits for the next poll. */
const MAX_DATAGRAMS_PER_POLL = 256;

export interface MonitorBatch {
  messages: NlMessage[];
  /** The kernel dropped notifications (ENOBUFS): re-read the state, do not trust the events. */
  overflowed: boolean;
}

export class NetlinkMonitor {
  private fd: number;
  private readonly buf = Buffer.alloc(RECV_BUFFER_BYTES);

  private constructor(fd: number) {
    this.fd = fd;
  }

  /** Opens a socket in this process's network namespace subscribed to `groups`. */
  static open(groups: number): NetlinkMonitor {
    const c = getLibc();
    const fd = c.socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) throw sysError(OPERATION, 'socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE)');
    const sa = sockaddrNl(groups);
    if (c.bind(fd, sa, sa.length) < 0) {
      const err = sysError(OPERATION, 'bind to the link and address groups');
      c.close(fd);
      throw err;
    }
    return new NetlinkMonitor(fd);
  }

  /** Everything queued now; returns at once when nothing is. */
  poll(): MonitorBatch {
    const batch: MonitorBatch = { messages: [], overflowed: false };
    if (this.fd < 0) return batch;
    const c = getLibc();
    for (let i = 0; i < MAX_DATAGRAMS_PER_POLL; i++) {
      const n = Number(c.recv(this.fd, this.buf, this.buf.length, MSG_DONTWAIT | MSG_TRUNC));
      if (n < 0) {
        const errno = koffi.errno();
        if (errno === EINTR) continue;
        if (errno === EAGAIN) break;
        if (errno === ENOBUFS) {
          batch.overflowed = true;
          continue;
        }
        throw sysError(OPERATION, 'recv');
      }
      // A datagram larger than the buffer is cut; treat it as lost events.
      if (n > this.buf.length) {
        batch.overflowed = true;
        continue;
      }
      try {
        batch.messages.push(...parseMessages(Buffer.from(this.buf.subarray(0, n))));
      } catch {
        batch.overflowed = true;
      }
    }
    return batch;
  }

  close(): void {
    if (this.fd >= 0) {
      getLibc().close(this.fd);
      this.fd = -1;
    }
  }
}
