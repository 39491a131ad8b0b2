/**
 * Kernel send buffers of sockets whose defaults cost a stall or throughput:
 * tunnel sockets, and the server's end of frontend Unix sockets (below).
 *
 * Tunnel sockets: Node's HTTP/2 stops reading its socket while one of its
 * own writes is pending (a CVE-2019-9511/9517 mitigation). Two Node peers
 * that both send bulk data through one connection can then each wait for
 * the other to read: once both directions hold more than the kernel's
 * buffers, the tunnel stalls until keepalive closes it (the 64 MiB echo of
 * test/e2e/transfer.test.ts). A write never stays pending while the
 * socket's send buffer can hold everything the peer's stream window lets
 * this side have in flight, so both ends of a tunnel ask for such a buffer;
 * one end getting it is enough to rule the stall out.
 */
import type net from 'node:net';
import { growSendBuffer, setSendBuffer, socketFd } from '../../native/socket-buffers.js';
import { DEFAULT_STREAM_WINDOW_BYTES } from './h2/tuning.js';

/** What the kernel must account (it counts about twice the payload it holds). */
export const TUNNEL_SEND_BUFFER_BYTES = 2 * DEFAULT_STREAM_WINDOW_BYTES;

export interface SendBufferResult {
  /** Bytes the kernel now accounts for the send buffer (-1 when unknown). */
  have: number;
  want: number;
}

/** Asks for TUNNEL_SEND_BUFFER_BYTES on a connected tunnel socket (TCP, or TLS over TCP); a larger (autotuned) one is kept. */
export function sizeTunnelSendBuffer(socket: net.Socket): SendBufferResult {
  return sizeSendBuffer(socket, TUNNEL_SEND_BUFFER_BYTES, growSendBuffer);
}

/**
 * A Unix socket's send buffer never autotunes: it stays at
 * net.core.wmem_default (208 KiB) where a loopback TCP one grows to
 * net.ipv4.tcp_wmem's maximum (4 MiB). A frontend client on the Unix socket
 * (the KAS) then has to be scheduled for every 208 KiB of a download, and the
 * server sits idle in between (figures: bench/RESULTS.md).
 */
export const UNIX_FRONTEND_SEND_BUFFER_BYTES = 2 * 1024 * 1024;

/**
 * Sets UNIX_FRONTEND_SEND_BUFFER_BYTES on an accepted frontend Unix socket
 * without reading it first: it starts at wmem_default and nothing grows it.
 */
export function sizeUnixFrontendSendBuffer(socket: net.Socket): SendBufferResult {
  return sizeSendBuffer(socket, UNIX_FRONTEND_SEND_BUFFER_BYTES, setSendBuffer);
}

function sizeSendBuffer(socket: net.Socket, want: number, size: (fd: number, accounted: number) => number): SendBufferResult {
  let have = -1;
  try {
    have = size(socketFd(socket), want);
  } catch {
    // no libc through koffi: leave the kernel's defaults alone
  }
  return { have, want };
}
