/**
 * Whether a client that half-closed while its dial is pending has really
 * gone. Node reads no more after a FIN, so such a client is checked once a
 * second: on a Unix socket with an empty write, which fails (EPIPE) once the
 * client closed both ways (Linux, unix_stream_sendmsg: SEND_SHUTDOWN), so
 * the socket's 'error' and 'close' follow; over TCP in the kernel's TCP
 * state, which says when a reset came. A TCP client that sent its FIN and
 * left without a reset is found when its answer cannot be written
 * (docs/frontends.md). Shared by the HTTP door's CONNECT and SOCKS5.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { resetBehindEnd } from '../../tunnel/socket-reset.js';
import { socketFd } from '../../../native/socket-buffers.js';
import { TCP_CLOSE, tcpState } from '../../../native/tcp-state.js';

/** How often a half-closed client whose dial is pending is checked for its departure. */
export const GONE_CHECK_INTERVAL_MS = 1000;

const EMPTY = Buffer.alloc(0);

/**
 * Call after `socket`'s 'end': calls `gone` once the client turns out to
 * have left (at once for a reset libuv reported as an end). Returns the
 * function that stops watching; the socket's own 'error'/'close' listeners
 * see what the empty write provokes.
 */
export function watchDeparture(socket: Duplex, gone: () => void): () => void {
  if (socket.destroyed) return () => undefined;
  if (resetBehindEnd(socket)) {
    gone();
    return () => undefined;
  }
  const fd = socket instanceof net.Socket ? socketFd(socket) : -1;
  // TCP: the kernel's state says whether a reset came. Otherwise (a Unix socket, or no libc to ask
  // through native/tcp-state.ts) the empty write.
  const tcp = tcpState(fd) >= 0;
  let stopped = false;
  const check = (): void => {
    if (stopped || socket.destroyed) return;
    if (!tcp) socket.write(EMPTY);
    else if (tcpState(fd) === TCP_CLOSE) gone();
  };
  check();
  const timer = setInterval(check, GONE_CHECK_INTERVAL_MS);
  timer.unref();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
