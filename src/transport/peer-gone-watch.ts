/**
 * Closes a tunnel socket whose peer is gone when Node's HTTP/2 has not
 * noticed. When a write to a dead peer fails, Node's TLS layer keeps its
 * write-in-progress mark (src/tls_wrap.cc: OnStreamAfterWrite returns on an
 * error before clearing write_size_), so every later write waits in its
 * queue, and HTTP/2, which stops reading while a write is in progress,
 * never reads again: no 'error', 'end' or 'close' ever comes, and the
 * session, its streams and every tunnelled connection stay open. The kernel
 * knows, so its TCP state is read once a second: closed (reset, or both
 * sides done), or the peer's FIN still unanswered a second later, means the
 * connection is over. Proven by test/transport/peer-gone.test.ts and the
 * SIGKILL case of test/e2e/failover.test.ts.
 */
import type net from 'node:net';
import { socketFd } from '../../native/socket-buffers.js';
import { TCP_CLOSE, TCP_CLOSE_WAIT, tcpState } from '../../native/tcp-state.js';

export const PEER_CHECK_INTERVAL_MS = 1000;

/** The socket's TCP state, or -1 (not TCP, closed, or no libc through koffi). */
function stateOf(socket: net.Socket): number {
  try {
    return tcpState(socketFd(socket));
  } catch {
    return -1;
  }
}

/**
 * Starts watching `socket` (TCP, or TLS over TCP); `onGone` runs just before
 * it is destroyed. Anything else (a Unix socket) is not watched at all.
 */
export function closeWhenPeerGone(socket: net.Socket, onGone: (reason: string) => void, intervalMs = PEER_CHECK_INTERVAL_MS): void {
  if (stateOf(socket) < 0) return;
  let finSeen = false;
  const timer = setInterval(() => {
    const state = stateOf(socket);
    // A FIN Node is about to read is normal; one still there a second later is not.
    const gone = state === TCP_CLOSE || (state === TCP_CLOSE_WAIT && finSeen);
    finSeen = state === TCP_CLOSE_WAIT;
    if (!gone || socket.destroyed) return;
    const reason = state === TCP_CLOSE ? 'connection reset or closed' : 'peer closed its side';
    onGone(reason);
    socket.destroy(new Error(`${reason} (seen in the kernel's TCP state)`));
  }, intervalMs);
  timer.unref();
  socket.once('close', () => clearInterval(timer));
}
