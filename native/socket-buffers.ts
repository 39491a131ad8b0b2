/**
 * Kernel send-buffer size of a connected TCP socket (SO_SNDBUF), read and set
 * through libc: Node has no API for it on TCP sockets.
 */
import type net from 'node:net';
import { SOL_SOCKET, getLibc } from './libc.js';

const SO_SNDBUF = 7;
const SO_SNDBUFFORCE = 32;

/** The file descriptor under a net.Socket or a TLS socket over one, or -1. */
export function socketFd(socket: net.Socket): number {
  type Handle = { fd?: number; _parent?: Handle };
  const handle = (socket as unknown as { _handle?: Handle })._handle;
  const fd = handle?.fd ?? handle?._parent?.fd;
  return typeof fd === 'number' ? fd : -1;
}

// Reused: sizing runs on every accepted frontend Unix socket (a dial), one call at a time.
const value = Buffer.alloc(4);
const len = Buffer.alloc(4);

/** The kernel's send-buffer size for `fd` (what it accounts, about twice what was asked for), or -1. */
export function sendBufferBytes(fd: number): number {
  len.writeUInt32LE(4);
  if (getLibc().getsockopt(fd, SOL_SOCKET, SO_SNDBUF, value, len) !== 0) return -1;
  return value.readInt32LE(0);
}

/**
 * Makes the kernel account at least `accounted` bytes of send buffer for
 * `fd` (it doubles what is asked for): beyond net.core.wmem_max with
 * CAP_NET_ADMIN (SO_SNDBUFFORCE), else up to that limit. Leaves a buffer that
 * is already large enough alone. Returns what the kernel now accounts, or -1.
 */
export function growSendBuffer(fd: number, accounted: number): number {
  if (fd < 0) return -1;
  const now = sendBufferBytes(fd);
  if (now >= accounted) return now;
  return setSendBuffer(fd, accounted);
}

/**
 * Makes the kernel account `accounted` bytes of send buffer for `fd`, larger
 * or smaller than now, as growSendBuffer does. With CAP_NET_ADMIN that is one
 * system call (SO_SNDBUFFORCE accounts exactly twice what is asked): it runs
 * on every accepted frontend connection, i.e. on every dial. Returns
 * what the kernel now accounts, or -1.
 */
export function setSendBuffer(fd: number, accounted: number): number {
  if (fd < 0) return -1;
  const half = Math.ceil(accounted / 2);
  value.writeInt32LE(half);
  const libc = getLibc();
  if (libc.setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, value, 4) === 0) return 2 * half;
  libc.setsockopt(fd, SOL_SOCKET, SO_SNDBUF, value, 4);
  return sendBufferBytes(fd);
}
