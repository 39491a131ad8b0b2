/**
 * Joins a tunnelled connection to its local end: a socket (any Duplex), or
 * another tunnelled connection (the server relaying a frontend stream's
 * connection to an agent's). No pipe() and no closure per packet: the
 * socket's 'data' goes to TunnelConnection.send, which says when to pause;
 * the peer's bytes go to socket.write, whose callbacks return credit; FIN and
 * close take one listener each.
 */
import type { Duplex } from 'node:stream';
import { FLUSH_IDLE_MS, TunnelConnection } from './connection.js';
import type { LocalClose, LocalEnd } from './local-end.js';
import { resetBehindEnd, resetSocket } from './socket-reset.js';

export function splice(endpoint: Duplex | TunnelConnection, conn: TunnelConnection): void {
  if (endpoint instanceof TunnelConnection) {
    conn.attach(new PartnerEnd(endpoint));
    endpoint.attach(new PartnerEnd(conn));
  } else {
    new SocketEnd(endpoint, conn);
  }
}

/** A socket as a connection's local end; it lives as long as its listeners on the socket. */
class SocketEnd implements LocalEnd {
  /** True while the socket is paused because the connection is not ready for more. */
  private paused = false;
  /** True while writes to the socket are corked until the next turn (one writev per TLS read's worth of DATA). */
  private corked = false;
  /** The socket's error, if it failed: its close is then abrupt. */
  private failure: Error | undefined;
  /** After the connection closed cleanly: cuts a socket whose reader takes nothing for FLUSH_IDLE_MS. */
  private flushTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly socket: Duplex,
    private readonly conn: TunnelConnection,
  ) {
    socket.on('data', this.onData);
    socket.on('end', this.onEnd);
    socket.on('error', this.onError);
    socket.on('close', this.onClose);
    conn.attach(this);
    // A socket that closed before the splice never emits 'close' again.
    if (socket.closed) {
      this.onClose();
      return;
    }
    // Nor 'end': a CONNECT client's FIN before its 200 is a half-close, passed on after what came before it (docs/frontends.md).
    if (socket.readableEnded) this.onEnd();
    // Paused only behind queued bytes (their send is under way and reports progress); a full
    // transport alone is found by the first send, which then waits for its drain.
    if (conn.queuedBytes === 0) {
      socket.resume();
    } else {
      this.paused = true;
      socket.pause();
    }
  }

  // ---------- the socket's bytes for the peer ----------

  private readonly onData = (chunk: Buffer): void => {
    if (!this.conn.send(chunk) && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
  };

  sendProgress(): void {
    if (this.paused && this.conn.ready) {
      this.paused = false;
      this.socket.resume();
    }
  }

  private readonly onEnd = (): void => {
    // A reset libuv reported as an end (socket-reset.ts) is a failure, not a FIN to pass on.
    const reset = resetBehindEnd(this.socket);
    if (reset) this.socket.destroy(reset);
    else this.conn.end();
  };

  private readonly onError = (err: Error): void => {
    this.failure = err;
  };

  private readonly onClose = (): void => {
    clearInterval(this.flushTimer);
    // Abrupt (error, or closed before its FIN): the connection cannot finish cleanly.
    if (this.failure || !this.socket.readableEnded) this.conn.close(this.failure);
    else this.conn.finish();
  };

  // ---------- the peer's bytes for the socket ----------

  deliver(chunk: Buffer): void {
    const s = this.socket;
    if (s.destroyed) return; // the close is under way
    if (!this.corked) {
      this.corked = true;
      s.cork();
      setImmediate(this.uncork);
    }
    s.write(chunk, this.onWritten);
  }

  private readonly uncork = (): void => {
    this.corked = false;
    this.socket.uncork();
  };

  /** A write left the socket's buffer: its reader took it. */
  private readonly onWritten = (): void => this.conn.taken();

  get undeliveredBytes(): number {
    return this.socket.writableLength;
  }

  peerEnded(): void {
    this.socket.end();
  }

  connectionClosed(how: LocalClose, error?: Error): void {
    const s = this.socket;
    if (s.destroyed) return;
    if (how === 'abort') {
      // A failure is a reset, so the reader cannot take a cut transfer for a whole one; without an
      // error the close was this side's choice (a FIN without half-close, as upstream), and ends with FIN.
      if (error) resetSocket(s, error);
      else s.destroy();
      return;
    }
    if (s.writableFinished) {
      s.destroy();
      return;
    }
    // Let what is queued flush, however slowly (no byte is lost to a slow reader), then release the socket; a stalled reader is cut, with a reset: its bytes are lost.
    let left = s.writableLength;
    this.flushTimer = setInterval(() => {
      if (s.writableLength < left) left = s.writableLength;
      else resetSocket(s, new Error(`reader took nothing for ${FLUSH_IDLE_MS} ms after the connection closed`));
    }, FLUSH_IDLE_MS);
    this.flushTimer.unref();
    s.once('finish', () => s.destroy());
    s.end();
  }
}

/** A relay partner as a connection's local end: the peer's bytes are sent on by the partner. */
class PartnerEnd implements LocalEnd {
  constructor(private readonly partner: TunnelConnection) {}

  deliver(chunk: Buffer): void {
    // The partner's queue is bounded by our receive window (or hold): its answer is not needed.
    this.partner.send(chunk);
  }

  get undeliveredBytes(): number {
    return this.partner.queuedBytes;
  }

  peerEnded(): void {
    this.partner.end();
  }

  connectionClosed(how: LocalClose, error?: Error): void {
    if (how === 'flush') this.partner.finish();
    else this.partner.close(error);
  }

  /** The partner sent bytes it took from us: credit for them. */
  sendProgress(): void {
    this.partner.taken();
  }
}
