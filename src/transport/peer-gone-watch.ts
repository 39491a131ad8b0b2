/**
 * Closes a tunnel socket whose peer is gone when Node's HTTP/2 has not
 * noticed. Node can leave an HTTP/2-over-TLS socket that nothing polls: in
 * the case caught here, 82 bytes waited in the TLS layer's write queue, the
 * kernel had the connection reset, and for as long as the test watched (10
 * s) neither a read nor a write reached the socket, so no 'error', 'end' or
 * 'close' came. A peer that dies then (an agent killed with SIGKILL) leaves
 * the session, its streams and every tunnelled connection open (about one
 * run in five of the failover test with the machine under load). The kernel
 * knows, so its TCP state is read once a second: closed (reset, or both
 * sides done), or the peer's FIN still unanswered a second later, means the
 * connection is over.
 */
import type net from 'node:net';
import { socketFd } from '../../native/socket-buffers.js';
import { TCP_CLOSE, TCP_CLOSE_WAIT, tcpState } from '../../native/tcp-state.js';

export const PEER_CHECK_INTERVAL_MS = 1000;

/** Starts watching `socket` (TCP, or TLS over TCP); `onGone` runs just before it is destroyed. */
export function closeWhenPeerGone(socket: net.Socket, onGone: (reason: string) => void, intervalMs = PEER_CHECK_INTERVAL_MS): void {
  let finSeen = false;
  const timer = setInterval(() => {
    let state: number;
    try {
      state = tcpState(socketFd(socket));
    } catch {
      clearInterval(timer); // no libc through koffi: nothing to watch with
      return;
    }
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
