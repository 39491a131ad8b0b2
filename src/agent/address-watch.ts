/**
 * Keeps the node's advertise address usable (docs/operations.md): notices when the
 * address is removed or its link goes down or away, restores it when the
 * agent manages it, logs both, and reports the state to /readyz and /metrics
 * until it is restored.
 *
 * Two ways of noticing, because each covers the other's weakness:
 * - rtnetlink notifications (link and address groups), drained without
 *   blocking on every tick (POLL_MS): a change is seen within one tick, at the
 *   cost of one recv(2) per tick when nothing happened;
 * - a full check every CHECK_MS: the kernel drops notifications when the
 *   socket's buffer overflows (a node with heavy pod churn) and the socket
 *   itself can fail, so a lost event costs at most this long.
 * Gardener's apiserver-proxy reconciles every minute only; Kanal's clients
 * (kubelet, pods) fail with ENETUNREACH meanwhile, hence the events.
 */
import { Counter } from '../domain/prom-client.js';
import type { Logger } from 'pino';
import type { Readiness } from '../common/health-server.js';
import type { KanalMetrics } from '../domain/metrics.js';
import { NetlinkMonitor, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK } from '../../native/netlink-monitor.js';
import { errorMessage } from '../common/error-message.js';
import { BIND_ADDRESS, BIND_INTERFACE_TYPE } from './bind-probe.js';

export interface AddressWatchOptions {
  /** e.g. "10.200.0.1 on kanal0", for logs and /readyz. */
  what: string;
  /** What keeps the address from working now; empty when nothing does. */
  inspect: () => Promise<string[]>;
  /** Puts the address back; throws when it cannot. Absent when the agent does not manage the address. */
  restore?: () => void;
  log: Logger;
  metrics: KanalMetrics;
}

/** How often queued notifications are read. */
const POLL_MS = 250;
/** How often the address is checked in full, notifications or not. */
const CHECK_MS = 10_000;
/** While the address is broken and restoring fails, try again this often. */
const RETRY_MS = 1000;

export class AddressWatch {
  /** Current problems; empty while the address works. */
  private problems: string[] = [];
  /** When the address stopped working (Date.now()); 0 while it works. */
  private brokenSince = 0;
  /** What was wrong when it stopped working, for the recovery log line. */
  private lostWith: string[] = [];
  /** Why the last restore attempt failed ('' when it did not). */
  private restoreError = '';
  private nextCheckAt = 0;
  private timer: NodeJS.Timeout | undefined;
  private monitor: NetlinkMonitor | undefined;
  /** A check is running (inspect is async); ticks meanwhile only collect events. */
  private checking = false;
  private eventsPending = false;
  /** Set by stop(): a check still awaiting its inspection must not restore after the owner tore down. */
  private stopped = false;
  private readonly losses: Counter;
  private readonly restorations: Counter;

  constructor(private readonly opts: AddressWatchOptions) {
    const registry = opts.metrics.registry;
    opts.metrics.gauge(
      'kanal_agent_bind_address_ready',
      `Whether the advertise address (${BIND_ADDRESS}) is usable on this node (1) or not (0)`,
      () => (this.problems.length === 0 ? 1 : 0),
    );
    this.losses = new Counter({
      name: 'kanal_agent_bind_address_losses_total',
      help: 'Times the advertise address was found removed, or its interface down or gone',
      registers: [registry],
    });
    this.restorations = new Counter({
      name: 'kanal_agent_bind_address_restorations_total',
      help: 'Times the agent restored the advertise address or its interface',
      registers: [registry],
    });
  }

  /** Checks once now, then keeps watching. */
  async start(): Promise<void> {
    try {
      this.monitor = NetlinkMonitor.open(RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR);
    } catch (err) {
      this.opts.log.warn(
        { err: errorMessage(err), checkEveryMs: CHECK_MS },
        'cannot subscribe to rtnetlink notifications; checking the advertise address periodically only',
      );
    }
    await this.check();
    this.timer = setInterval(() => this.tick(), POLL_MS);
    this.timer.unref();
  }

  stop(): void {
    this.stopped = true;
    clearInterval(this.timer);
    this.timer = undefined;
    this.monitor?.close();
    this.monitor = undefined;
  }

  readiness(): Readiness {
    if (this.problems.length === 0) return { ready: true, detail: `advertise address ${this.opts.what} in place` };
    const since = new Date(this.brokenSince).toISOString();
    const action = this.opts.restore ? `; restoring${this.restoreError ? ` (last attempt failed: ${this.restoreError})` : ''}` : '';
    return { ready: false, detail: `advertise address ${this.opts.what} unusable since ${since}: ${this.problems.join('; ')}${action}` };
  }

  private tick(): void {
    try {
      const batch = this.monitor?.poll();
      if (batch && (batch.messages.length > 0 || batch.overflowed)) this.eventsPending = true;
    } catch (err) {
      this.opts.log.warn(
        { err: errorMessage(err), checkEveryMs: CHECK_MS },
        'rtnetlink notifications failed; checking the advertise address periodically only',
      );
      this.monitor?.close();
      this.monitor = undefined;
    }
    if (this.checking) return;
    if (this.eventsPending || Date.now() >= this.nextCheckAt) void this.check();
  }

  private async check(): Promise<void> {
    this.checking = true;
    this.eventsPending = false;
    try {
      let problems = await this.opts.inspect();
      if (this.stopped) return;
      if (problems.length > 0 && this.brokenSince === 0) {
        this.brokenSince = Date.now();
        this.lostWith = problems;
        this.losses.inc();
        this.opts.log.warn(
          { address: this.opts.what, problems },
          this.opts.restore
            ? 'advertise address lost; restoring it'
            : `advertise address unusable; the agent does not manage it (${BIND_INTERFACE_TYPE} none)`,
        );
      }
      if (problems.length > 0 && this.restore()) problems = await this.opts.inspect();
      this.problems = problems;
      if (problems.length === 0 && this.brokenSince !== 0) {
        this.opts.log.info(
          { address: this.opts.what, problems: this.lostWith, unusableMs: Date.now() - this.brokenSince },
          this.opts.restore ? 'advertise address restored' : 'advertise address usable again',
        );
        this.brokenSince = 0;
        this.lostWith = [];
      }
    } catch (err) {
      this.opts.log.warn({ address: this.opts.what, err: errorMessage(err) }, 'cannot check the advertise address');
    } finally {
      this.nextCheckAt = Date.now() + (this.problems.length > 0 ? RETRY_MS : CHECK_MS);
      this.checking = false;
    }
  }

  /** One restore attempt; true when it went through. Each distinct failure is logged once. */
  private restore(): boolean {
    if (!this.opts.restore) return false;
    try {
      this.opts.restore();
      this.restoreError = '';
      this.restorations.inc();
      return true;
    } catch (err) {
      const message = errorMessage(err);
      if (message !== this.restoreError)
        this.opts.log.error({ address: this.opts.what, err: message, retryInMs: RETRY_MS }, 'cannot restore the advertise address');
      this.restoreError = message;
      return false;
    }
  }
}
