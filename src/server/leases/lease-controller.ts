/**
 * The server's Lease (`--enable-lease-controller`), as upstream v0.36
 * keeps it (pkg/server/leases, k8s.io/component-helpers lease controller):
 * `konnectivity-proxy-server-<server-id>` in `--lease-namespace`, labelled
 * exactly `--lease-label`, held by the server ID, 30 s long, renewed every
 * 15 s (4 % jitter); every 15 s the expired leases matching the labels are
 * deleted, each with a resourceVersion precondition so a lease renewed
 * meanwhile survives; on stop our own lease is deleted so agents stop
 * counting this server at once rather than 30 s later.
 *
 * A renewal is get-or-create then update with optimistic concurrency: a
 * conflict re-reads the lease and tries once more; a failed renewal is
 * retried with back-off (0.5 s doubling up to the renew interval), each API
 * call bounded by `callTimeoutMs`, so the lease survives a brief API outage
 * and nothing waits forever. Events report every outcome, for upstream's
 * lease metrics.
 */
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import { V1MicroTime, type ConfigurationOptions, type V1Lease } from '@kubernetes/client-node';
import { Backoff } from '../../common/backoff.js';
import { KubeApiError, type KubeApi } from '../../kube/kube-api.js';
import { formatLabels, type Labels } from '../../kube/labels.js';
import {
  DEFAULT_LEASE_NAMESPACE,
  LEASE_DURATION_SECONDS,
  LEASE_GC_INTERVAL_MS,
  LEASE_RENEW_INTERVAL_MS,
  isLeaseValid,
  leaseExpiresAt,
  serverLeaseName,
  timeMs,
} from '../../kube/lease.js';
import { errorMessage } from '../../common/error-message.js';

export interface ServerLeaseControllerOptions {
  api: KubeApi;
  /** `--server-id`: the holder identity and the lease name's suffix. */
  serverId: string;
  /** `--lease-namespace` (default kube-system). */
  namespace?: string;
  /** `--lease-label`, parsed with parseLabels (kube/labels.ts). */
  labels: Labels;
  log: Logger;
  leaseDurationSeconds?: number;
  renewIntervalMs?: number;
  gcIntervalMs?: number;
  /** Deadline of one API call (default 5 s). */
  callTimeoutMs?: number;
}

export interface ServerLeaseControllerEvents {
  /** The API accepted our renewal. */
  renewed: [lease: V1Lease];
  /** A renewal failed; `expired` once the last accepted renewal is older than the lease duration. */
  'renew-failed': [err: KubeApiError, consecutiveFailures: number, expired: boolean];
  /** Someone else renewed our lease: another holder, or a second server with our --server-id. */
  contended: [holder: string];
  /** An expired lease was deleted by us. */
  collected: [name: string];
  /** Listing expired leases, or deleting one, failed. */
  'gc-failed': [err: KubeApiError];
  /** A call of the garbage collection ended: HTTP status (0: no answer) and the API's reason ('' on success). */
  'gc-call': [op: 'list' | 'delete', status: number, reason: string, seconds: number];
}

export interface ServerLeaseControllerStats {
  renewals: number;
  renewFailures: number;
  collected: number;
  gcFailures: number;
  /** When the API last accepted our renewal (ms since the epoch). */
  lastRenewedAt: number | undefined;
}

export class ServerLeaseController extends EventEmitter<ServerLeaseControllerEvents> {
  readonly leaseName: string;
  readonly namespace: string;
  readonly selector: string;
  private readonly durationSeconds: number;
  private readonly renewIntervalMs: number;
  private readonly gcIntervalMs: number;
  private readonly callTimeoutMs: number;
  /** Our lease as the API last returned it; undefined when we must read it first. */
  private current: V1Lease | undefined;
  private running = false;
  private renewTimer: NodeJS.Timeout | undefined;
  private gcTimer: NodeJS.Timeout | undefined;
  /** The renewal or collection in progress; stop() waits for both. */
  private renewing: Promise<void> | undefined;
  private collecting: Promise<void> | undefined;
  /**
   * The renewTimes of our last few writes, answered or not (a write can land
   * after its call timed out): tells our writes from another process's.
   */
  private readonly written: number[] = [];
  private consecutiveFailures = 0;
  private readonly backoff: Backoff;
  private readonly counts: ServerLeaseControllerStats = {
    renewals: 0,
    renewFailures: 0,
    collected: 0,
    gcFailures: 0,
    lastRenewedAt: undefined,
  };

  constructor(private readonly options: ServerLeaseControllerOptions) {
    super();
    this.leaseName = serverLeaseName(options.serverId);
    this.namespace = options.namespace ?? DEFAULT_LEASE_NAMESPACE;
    if (Object.keys(options.labels).length === 0)
      throw new RangeError("--lease-label must name at least one label: it is how servers find each other's leases");
    this.selector = formatLabels(options.labels);
    this.durationSeconds = options.leaseDurationSeconds ?? LEASE_DURATION_SECONDS;
    this.renewIntervalMs = options.renewIntervalMs ?? LEASE_RENEW_INTERVAL_MS;
    this.gcIntervalMs = options.gcIntervalMs ?? LEASE_GC_INTERVAL_MS;
    this.callTimeoutMs = options.callTimeoutMs ?? 5000;
    if (this.renewIntervalMs >= this.durationSeconds * 1000) {
      throw new RangeError(
        `lease renew interval ${this.renewIntervalMs} ms must be shorter than the lease duration ${this.durationSeconds} s`,
      );
    }
    this.backoff = new Backoff(500, this.renewIntervalMs);
  }

  stats(): ServerLeaseControllerStats {
    return { ...this.counts };
  }

  /** Renews at once and then periodically; collects at once and then periodically. */
  start(): void {
    if (this.running) return;
    this.running = true;
    this.scheduleRenewal(0);
    this.scheduleCollection(0);
  }

  /** Stops renewing and deletes our lease (bounded by the call timeout; expiry covers a failure). */
  async stop(): Promise<void> {
    if (!this.running) return;
    this.running = false;
    clearTimeout(this.renewTimer);
    clearTimeout(this.gcTimer);
    await Promise.all([this.renewing, this.collecting]);
    const rv = this.current?.metadata?.resourceVersion;
    if (rv === undefined) return;
    try {
      await this.api(`delete lease ${this.namespace}/${this.leaseName}`, (o) =>
        this.options.api.coordination.deleteNamespacedLease(
          { name: this.leaseName, namespace: this.namespace, body: { preconditions: { resourceVersion: rv } } },
          o,
        ),
      );
      this.options.log.info({ lease: this.leaseName, namespace: this.namespace }, "deleted this server's lease");
    } catch (err) {
      // Conflict: someone renewed it after us (a server sharing our ID); otherwise it expires on its own.
      this.options.log.warn(
        { lease: this.leaseName, err: errorMessage(err) },
        "could not delete this server's lease; it expires on its own",
      );
    }
    this.current = undefined;
  }

  private scheduleRenewal(delayMs: number): void {
    if (!this.running) return;
    this.renewTimer = setTimeout(() => {
      this.renewing = this.renew().finally(() => (this.renewing = undefined));
    }, delayMs);
  }

  private scheduleCollection(delayMs: number): void {
    if (!this.running) return;
    this.gcTimer = setTimeout(() => {
      this.collecting = this.collect().finally(() => (this.collecting = undefined));
    }, delayMs);
  }

  private async renew(): Promise<void> {
    try {
      this.current = await this.writeLease();
      this.consecutiveFailures = 0;
      this.backoff.reset();
      this.counts.renewals++;
      this.counts.lastRenewedAt = Date.now();
      this.emit('renewed', this.current);
      this.scheduleRenewal(this.renewIntervalMs * (1 + Math.random() * 0.04));
    } catch (err) {
      const e =
        err instanceof KubeApiError
          ? err
          : new KubeApiError({ kind: 'client', operation: `renew lease ${this.leaseName}`, message: String(err) });
      this.consecutiveFailures++;
      this.counts.renewFailures++;
      const last = this.counts.lastRenewedAt;
      const expired = last === undefined || Date.now() - last >= this.durationSeconds * 1000;
      this.options.log[expired ? 'error' : 'warn'](
        { lease: this.leaseName, namespace: this.namespace, failures: this.consecutiveFailures, err: e.message },
        expired
          ? "cannot renew this server's lease: agents counting leases do not count this server"
          : "cannot renew this server's lease; retrying",
      );
      this.emit('renew-failed', e, this.consecutiveFailures, expired);
      this.scheduleRenewal(this.backoff.next());
    }
  }

  /** Writes our lease with a fresh renewTime: update what we know, else read, else create. */
  private async writeLease(): Promise<V1Lease> {
    let conflicted = false;
    if (this.current) {
      try {
        return await this.update(this.current);
      } catch (err) {
        if (!(err instanceof KubeApiError) || (err.kind !== 'conflict' && err.kind !== 'not-found')) throw err;
        conflicted = err.kind === 'conflict';
        this.current = undefined; // someone else wrote or deleted it: start from the API's copy
      }
    }
    let existing: V1Lease;
    try {
      existing = await this.api(`get lease ${this.namespace}/${this.leaseName}`, (o) =>
        this.options.api.coordination.readNamespacedLease({ name: this.leaseName, namespace: this.namespace }, o),
      );
    } catch (err) {
      if (!(err instanceof KubeApiError) || err.kind !== 'not-found') throw err;
      return this.api(`create lease ${this.namespace}/${this.leaseName}`, (o) =>
        this.options.api.coordination.createNamespacedLease({ namespace: this.namespace, body: this.desired(undefined) }, o),
      );
    }
    // A valid lease renewed by someone else: another holder, or our own ID renewed by another process.
    const holder = existing.spec?.holderIdentity ?? '';
    const renewedByOther =
      holder !== this.options.serverId || (conflicted && !this.written.includes(timeMs(existing.spec?.renewTime) ?? NaN));
    if (renewedByOther && isLeaseValid(existing, Date.now())) {
      this.options.log.warn(
        { lease: this.leaseName, holder },
        "another process renews this server's lease: do two servers share one --server-id?",
      );
      this.emit('contended', holder);
    }
    return this.update(existing);
  }

  private update(base: V1Lease): Promise<V1Lease> {
    return this.api(`update lease ${this.namespace}/${this.leaseName}`, (o) =>
      this.options.api.coordination.replaceNamespacedLease(
        { name: this.leaseName, namespace: this.namespace, body: this.desired(base) },
        o,
      ),
    );
  }

  /** The lease we want stored, on top of what the API has (its resourceVersion makes the update conditional). */
  private desired(base: V1Lease | undefined): V1Lease {
    const now = Date.now();
    this.written.push(now);
    if (this.written.length > 8) this.written.shift();
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: { ...base?.metadata, name: this.leaseName, namespace: this.namespace, labels: { ...this.options.labels } },
      spec: {
        ...base?.spec,
        holderIdentity: this.options.serverId,
        leaseDurationSeconds: this.durationSeconds,
        // MicroTime: the API parses exactly six fractional digits.
        renewTime: new V1MicroTime(now),
      },
    };
  }

  /** Deletes the expired leases carrying our labels (any server's, as upstream's GC does). */
  private async collect(): Promise<void> {
    try {
      const list = await this.gcCall('list', () =>
        this.api(`list leases in ${this.namespace} (${this.selector})`, (o) =>
          this.options.api.coordination.listNamespacedLease({ namespace: this.namespace, labelSelector: this.selector }, o),
        ),
      );
      const now = Date.now();
      for (const lease of list.items) {
        if (!this.running) break;
        // One lease that cannot be deleted does not keep the others.
        if (!isLeaseValid(lease, now)) await this.collectOne(lease).catch((err: unknown) => this.collectFailed(err));
      }
    } catch (err) {
      this.collectFailed(err);
    }
    this.scheduleCollection(this.gcIntervalMs);
  }

  private async collectOne(lease: V1Lease): Promise<void> {
    const name = lease.metadata?.name ?? '';
    const rv = lease.metadata?.resourceVersion;
    try {
      await this.gcCall('delete', () =>
        this.api(`delete expired lease ${this.namespace}/${name}`, (o) =>
          this.options.api.coordination.deleteNamespacedLease(
            { name, namespace: this.namespace, body: rv ? { preconditions: { resourceVersion: rv } } : {} },
            o,
          ),
        ),
      );
    } catch (err) {
      // Gone already, or renewed since we listed it: either way nothing to collect.
      if (err instanceof KubeApiError && (err.kind === 'not-found' || err.kind === 'conflict')) return;
      throw err;
    }
    this.counts.collected++;
    const expiredAt = leaseExpiresAt(lease);
    this.options.log.info(
      { lease: name, holder: lease.spec?.holderIdentity, expiredAt: expiredAt ? new Date(expiredAt).toISOString() : undefined },
      'deleted an expired server lease',
    );
    this.emit('collected', name);
  }

  private collectFailed(err: unknown): void {
    const e =
      err instanceof KubeApiError ? err : new KubeApiError({ kind: 'client', operation: 'collect expired leases', message: String(err) });
    this.counts.gcFailures++;
    this.options.log.warn({ namespace: this.namespace, err: e.message }, 'cannot collect expired server leases');
    this.emit('gc-failed', e);
  }

  /** Runs one call of the garbage collection and reports how it ended ('gc-call', upstream's lease_list/lease_delete metrics). */
  private async gcCall<T>(op: 'list' | 'delete', call: () => Promise<T>): Promise<T> {
    const started = performance.now();
    const ended = (status: number, reason: string): boolean =>
      this.emit('gc-call', op, status, reason, (performance.now() - started) / 1000);
    try {
      const result = await call();
      ended(200, '');
      return result;
    } catch (err) {
      if (err instanceof KubeApiError) ended(err.status ?? 0, err.reason ?? err.kind);
      else ended(0, 'client');
      throw err;
    }
  }

  private api<T>(operation: string, fn: (options: ConfigurationOptions) => Promise<T>): Promise<T> {
    return this.options.api.call(operation, fn, { timeoutMs: this.callTimeoutMs });
  }
}
