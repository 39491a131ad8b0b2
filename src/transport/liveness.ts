/**
 * Liveness of one HTTP/2 connection, proven by PING answers. A peer
 * that is frozen (SIGSTOP) or behind a path that drops packets silently
 * sends no FIN or RST; only an unanswered PING tells. The connection is
 * pinged every `intervalMs` (and on demand, probe()); a PING unanswered for
 * `quietAfterMs` makes it quiet (routing prefers other tunnels), for
 * `timeoutMs` dead (the session is destroyed, which ends its streams).
 *
 * grpc-go clients (upstream's agent) answer every server PING and enforce no
 * policy on them (internal/transport/http2_client.go, handlePing); Node's
 * nghttp2 answers them by itself.
 */
import { EventEmitter } from 'node:events';
import type { Http2Session } from 'node:http2';
import { GrpcStatus, GrpcStatusError } from './grpc-status.js';

/** A PING unanswered this long marks the connection quiet, unless the timeout is shorter. */
export const QUIET_AFTER_MS = 2000;
/** Server PINGs more often than this would be noise, not information. */
export const MIN_KEEPALIVE_INTERVAL_MS = 1000;

export interface KeepaliveOptions {
  /** PING every this many ms. */
  intervalMs: number;
  /** A PING unanswered this long ends the connection. */
  timeoutMs: number;
  /** Called (with the reason) just before a dead connection is destroyed. */
  onTimeout?: (peer: string, reason: string) => void;
}

export interface LivenessEvents {
  /** A PING has gone unanswered for the quiet threshold. */
  quiet: [];
  /** A PING was answered after the connection had been quiet. */
  alive: [];
}

/** What routing sees of a connection's liveness. */
export interface Liveness {
  /** True from the quiet threshold of an unanswered PING until it is answered. */
  readonly quiet: boolean;
  /** When a PING was last answered (Date.now()), if one was: the admin port's /status shows it. */
  readonly lastAnsweredAt?: number;
  /**
   * PINGs now (unless a PING is already in flight) and resolves true when it
   * is answered within `withinMs` (default: the quiet threshold), false
   * otherwise or once the connection closes.
   */
  probe(withinMs?: number): Promise<boolean>;
  on<K extends keyof LivenessEvents>(event: K, listener: (...args: LivenessEvents[K]) => void): this;
  off<K extends keyof LivenessEvents>(event: K, listener: (...args: LivenessEvents[K]) => void): this;
}

interface InFlight {
  quietTimer: NodeJS.Timeout;
  deadTimer: NodeJS.Timeout;
  /** probe() callers waiting for the answer (or the end). */
  waiters: ((answered: boolean) => void)[];
}

export class SessionLiveness extends EventEmitter<LivenessEvents> implements Liveness {
  /** Invariant: true only while `inFlight` is set and older than quietAfterMs. */
  quiet = false;
  lastAnsweredAt: number | undefined;
  private inFlight: InFlight | undefined;
  private readonly interval: NodeJS.Timeout;
  private stopped = false;
  private readonly quietAfterMs: number;
  private readonly timeoutMs: number;

  constructor(
    private readonly session: Http2Session,
    private readonly peer: string,
    private readonly opts: KeepaliveOptions,
  ) {
    super();
    this.timeoutMs = opts.timeoutMs;
    this.quietAfterMs = Math.min(QUIET_AFTER_MS, opts.timeoutMs);
    this.interval = setInterval(() => this.ping(), Math.max(MIN_KEEPALIVE_INTERVAL_MS, opts.intervalMs));
    this.interval.unref();
    session.once('close', () => this.stop());
  }

  probe(withinMs = this.quietAfterMs): Promise<boolean> {
    this.ping();
    const inFlight = this.inFlight;
    if (!inFlight || this.stopped) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const timer = setTimeout(() => resolve(false), withinMs);
      inFlight.waiters.push((answered) => {
        clearTimeout(timer);
        resolve(answered);
      });
    });
  }

  private ping(): void {
    if (this.inFlight || this.stopped || this.session.destroyed) return;
    const inFlight: InFlight = {
      quietTimer: setTimeout(() => this.becomeQuiet(), this.quietAfterMs),
      deadTimer: setTimeout(() => this.die(), this.timeoutMs),
      waiters: [],
    };
    inFlight.quietTimer.unref();
    inFlight.deadTimer.unref();
    this.inFlight = inFlight;
    try {
      // An error here means the session is going away; its 'close' stops us.
      this.session.ping((err) => {
        if (!err && this.inFlight === inFlight) this.answered(inFlight);
      });
    } catch {
      this.stop();
    }
  }

  private becomeQuiet(): void {
    this.quiet = true;
    this.emit('quiet');
  }

  private answered(inFlight: InFlight): void {
    this.lastAnsweredAt = Date.now();
    clearTimeout(inFlight.quietTimer);
    clearTimeout(inFlight.deadTimer);
    this.inFlight = undefined;
    this.settle(inFlight, true);
    if (this.quiet) {
      this.quiet = false;
      this.emit('alive');
    }
  }

  private die(): void {
    const reason = `no answer to an HTTP/2 PING within ${this.timeoutMs} ms`;
    this.opts.onTimeout?.(this.peer, reason);
    this.stop();
    this.session.destroy(new GrpcStatusError(GrpcStatus.UNAVAILABLE, reason));
  }

  private settle(inFlight: InFlight, answered: boolean): void {
    for (const w of inFlight.waiters.splice(0)) w(answered);
  }

  private stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.interval);
    const inFlight = this.inFlight;
    if (inFlight) {
      clearTimeout(inFlight.quietTimer);
      clearTimeout(inFlight.deadTimer);
      this.settle(inFlight, false);
    }
  }
}
