/**
 * Node's HTTP/2 stops reading its socket while one of its own writes is
 * pending (a CVE-2019-9511/9517 mitigation). Two Node peers that both send
 * bulk data through one connection can then each wait for the other to read:
 * once both directions hold more than the kernel's buffers, the tunnel stalls
 * until keepalive closes it (seen about once in ten runs of a 64 MiB echo
 * test with 4 MiB stream windows and autotuned buffers). A write never stays
 * pending while the socket's send buffer can hold everything the peer's
 * stream window lets this side have in flight, so both ends of a tunnel ask
 * for such a buffer; one end getting it is enough to rule the stall out.
 */
import type net from 'node:net';
import { growSendBuffer, socketFd } from '../../native/socket-buffers.js';
import { DEFAULT_STREAM_WINDOW_BYTES } from './h2/tuning.js';

/** What the kernel must account (it counts about twice the payload it holds). */
export const TUNNEL_SEND_BUFFER_BYTES = 2 * DEFAULT_STREAM_WINDOW_BYTES;

export interface SendBufferResult {
  /** Bytes the kernel now accounts for the send buffer (-1 when unknown). */
  have: number;
  want: number;
}

/** Asks for TUNNEL_SEND_BUFFER_BYTES on a connected tunnel socket (TCP, or TLS over TCP). */
export function sizeTunnelSendBuffer(socket: net.Socket): SendBufferResult {
  const want = TUNNEL_SEND_BUFFER_BYTES;
  let have = -1;
  try {
    have = growSendBuffer(socketFd(socket), want);
  } catch {
    // no libc through koffi: leave the kernel's autotuning alone
  }
  return { have, want };
}
