/**
 * The client's PINGs on one HTTP/2 session (ClientKeepalive, transport.ts):
 * a server that is frozen (SIGSTOP) or behind a path that drops packets
 * silently sends no FIN or RST; only an unanswered PING tells. Any byte
 * received after a PING counts as an answer: on a slow path the PING's ACK may
 * queue behind megabytes of data, and data arriving proves the server alive.
 *
 * State: `inFlight` is set from a PING's sending until its answer, a byte
 * received by its deadline, or the deadline without one (then the session is
 * destroyed and the pinger stops, for good). PINGs go out every `interval` while a
 * stream is open and none is in flight; `interval` is the policed one until
 * relax() (transport.ts, POLICED_PING_INTERVAL_MS).
 */
import type { ClientHttp2Session } from 'node:http2';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../liveness.js';
import { POLICED_PING_INTERVAL_MS, type ClientKeepalive } from '../transport.js';

export interface SessionPingerOptions {
  keepalive: ClientKeepalive;
  /** Bytes received on the connection so far (its socket's bytesRead). */
  bytesRead: () => number;
  /** Streams open on the session: an idle connection is not PINGed. */
  streams: () => number;
  /** The server stopped answering: destroy the session with this reason. */
  onDead: (reason: string) => void;
}

interface InFlight {
  deadline: NodeJS.Timeout;
  /** bytesRead when the PING was sent. */
  bytesAtPing: number;
}

export class SessionPinger {
  private timer: NodeJS.Timeout | undefined;
  private inFlight: InFlight | undefined;
  private interval: number;
  private stopped = false;
  private readonly fastInterval: number;

  constructor(
    private readonly session: ClientHttp2Session,
    private readonly opts: SessionPingerOptions,
  ) {
    this.fastInterval = Math.max(MIN_KEEPALIVE_INTERVAL_MS, opts.keepalive.intervalMs);
    this.interval = opts.keepalive.acceptsFrequentPings ? Math.max(POLICED_PING_INTERVAL_MS, this.fastInterval) : this.fastInterval;
    this.schedule();
    session.once('close', () => this.stop());
  }

  /** The server said it accepts PINGs every intervalMs: from now on. */
  relax(): void {
    if (this.interval === this.fastInterval || this.stopped) return;
    this.interval = this.fastInterval;
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.inFlight) clearTimeout(this.inFlight.deadline);
    this.inFlight = undefined;
  }

  private schedule(): void {
    clearTimeout(this.timer);
    if (this.stopped) return;
    this.timer = setTimeout(this.tick, this.interval);
    this.timer.unref();
  }

  private readonly tick = (): void => {
    this.schedule();
    if (this.inFlight || this.session.destroyed || this.opts.streams() === 0) return;
    const inFlight: InFlight = {
      deadline: setTimeout(() => this.expired(inFlight), this.opts.keepalive.timeoutMs),
      bytesAtPing: this.opts.bytesRead(),
    };
    inFlight.deadline.unref();
    this.inFlight = inFlight;
    let sent = false;
    try {
      // false: too many PINGs unanswered already (nghttp2's bound); the deadline still runs.
      sent = this.session.ping((err) => {
        if (!err) this.settle(inFlight);
      });
    } catch {
      // The session is going away; its 'close' stops us.
    }
    if (!sent && this.session.destroyed) this.stop();
  };

  private settle(inFlight: InFlight): void {
    if (this.inFlight !== inFlight) return;
    clearTimeout(inFlight.deadline);
    this.inFlight = undefined;
  }

  /**
   * The deadline passed. Judged after the event loop's next poll for I/O: a
   * process that was itself stalled or stopped (SIGSTOP, a VM paused) runs its
   * timers before reading the answer that waits in the socket meanwhile.
   */
  private expired(inFlight: InFlight): void {
    setImmediate(() => this.judge(inFlight));
  }

  private judge(inFlight: InFlight): void {
    if (this.inFlight !== inFlight || this.stopped) return;
    // Bytes arrived, the ACK did not yet: it waits behind them.
    if (this.opts.bytesRead() !== inFlight.bytesAtPing) {
      this.settle(inFlight);
      return;
    }
    this.stop();
    this.opts.onDead(`no answer to an HTTP/2 PING within ${this.opts.keepalive.timeoutMs} ms`);
  }
}
