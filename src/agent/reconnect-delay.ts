/**
 * How long an agent waits before it connects to one server address again
 * (docs/ha.md). A failed connect is retried after FIRST_RETRY_MS, then every
 * sync interval for as long as the sync-interval cap (a server restart or a
 * network blip takes seconds: the agent is back within a sync interval of
 * the server listening again), and only then with exponential back-off up to
 * the cap. Reaching a server the agent already holds is no failure (behind a
 * load balancer the next connect may reach another): it waits one sync
 * interval and starts afresh, as upstream's agent does (pkg/agent/clientset.go,
 * sync: the back-off is reset while it holds fewer tunnels than servers).
 */
import { Backoff } from '../common/backoff.js';

/** The first retry after a connect that failed, or a tunnel that was lost. */
export const FIRST_RETRY_MS = 100;
/**
 * While a lost tunnel's connections wait to resume (docs/protocol.md), retries
 * come at least this often (with jitter): they are paused until the path is
 * back, and the resume timeout bounds how long an agent retries this fast.
 */
export const RESUME_RETRY_MS = 250;

export class ReconnectDelay {
  /** When the first of the current run of failures happened; undefined after a success. */
  private failingSince: number | undefined;
  /** Past the cap's worth of failures: doubling from twice the sync interval. */
  private readonly backoff: Backoff;

  constructor(
    private readonly reconnect: { initialMs: number; maxMs: number },
    private readonly now: () => number = Date.now,
  ) {
    this.backoff = new Backoff(Math.min(reconnect.maxMs, 2 * reconnect.initialMs), reconnect.maxMs);
  }

  /** The wait after a connect that failed; `resuming`: the agent holds tunnels waiting to resume. */
  failed(resuming = false): number {
    const now = this.now();
    if (this.failingSince === undefined) {
      this.failingSince = now;
      return Math.min(FIRST_RETRY_MS, this.reconnect.initialMs);
    }
    if (resuming) return Math.min(this.interval(), Math.round(RESUME_RETRY_MS / 2 + Math.random() * (RESUME_RETRY_MS / 2)));
    if (now - this.failingSince < this.reconnect.maxMs) return this.interval();
    return this.backoff.next();
  }

  /** The wait after a connect that reached a server but did not add a tunnel (one already held); the run of failures is over. */
  reachedHeld(): number {
    this.succeeded();
    return this.interval();
  }

  succeeded(): void {
    this.failingSince = undefined;
    this.backoff.reset();
  }

  /** The sync interval with jitter (half fixed, half random: agents started together spread out). */
  private interval(): number {
    const ms = this.reconnect.initialMs;
    return Math.round(ms / 2 + Math.random() * (ms / 2));
  }
}
