/**
 * The kernel's state of a TCP connection (TCP_INFO's first field,
 * tcpi_state), read through libc: Node has no API for it.
 */
import { getLibc } from './libc.js';

const IPPROTO_TCP = 6;
const TCP_INFO = 11;

/** Values of tcpi_state (include/net/tcp_states.h). */
export const TCP_ESTABLISHED = 1;
export const TCP_CLOSE = 7;
export const TCP_CLOSE_WAIT = 8;

// Reused: this is called once a second per tunnel socket, and JavaScript runs one call at a time.
const info = Buffer.alloc(8);
const len = Buffer.alloc(4);

/** tcpi_state of `fd`, or -1 when it is not a TCP socket (or not open). */
export function tcpState(fd: number): number {
  if (fd < 0) return -1;
  // The kernel copies min(len, sizeof(struct tcp_info)): the first byte is all we read.
  len.writeUInt32LE(info.length);
  if (getLibc().getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, len) !== 0) return -1;
  return info[0];
}
