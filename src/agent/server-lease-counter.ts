/**
 * Counts servers by their Leases (`--count-server-leases`): a list and
 * watch of the leases in `--lease-namespace` matching `--lease-label` (as
 * upstream's informer), counted at the moment of asking, so a lease counts
 * exactly while renewTime + duration is in the future, whether or not a
 * server has collected it yet. No valid lease counts as 1 (upstream).
 *
 * Every wait is bounded: the watch asks the API to end it after 5-10 min
 * (client-go's reflector), asks for bookmarks, and a watch that delivers
 * nothing for `watchIdleTimeoutMs` is presumed dead and replaced; failed
 * lists and watches are retried with back-off. While the view is not in sync
 * (API unreachable) the counter answers the count as of the API's last word
 * rather than letting cached leases age out to 1: counting too many servers
 * only costs extra dial attempts, counting too few leaves servers without
 * this agent's tunnel. The cache is bounded (`maxLeases`).
 */
import { EventEmitter } from 'node:events';
import type { Logger } from 'pino';
import type { V1Lease } from '@kubernetes/client-node';
import { Backoff } from '../common/backoff.js';
import { KubeApiError, type KubeApi, type WatchHandle } from '../kube/kube-api.js';
import { LabelSelector } from '../kube/labels.js';
import { DEFAULT_LEASE_LABEL, DEFAULT_LEASE_NAMESPACE, leaseExpiresAt } from '../kube/lease.js';
import { FLAG } from './settings.js';

export interface ServerLeaseCounterOptions {
  api: KubeApi;
  /** `--lease-namespace` (default kube-system). */
  namespace?: string;
  /** The agent's `--lease-label`: a label selector (default k8s-app=konnectivity-server). */
  selector?: string;
  log: Logger;
  /** A watch silent (no event, no bookmark) this long is replaced (default 90 s; the API bookmarks every ~60 s). */
  watchIdleTimeoutMs?: number;
  /** Deadline of a list (default 10 s). */
  listTimeoutMs?: number;
  /** Leases kept at most (default 1000); more matching leases are not counted, and a warning says so. */
  maxLeases?: number;
  /** Back-off after a failed list or watch (default 1 s doubling to 30 s). */
  retryInitialMs?: number;
  retryMaxMs?: number;
}

export interface ServerLeaseCounterEvents {
  /** A list succeeded: the view is in sync. */
  synced: [leases: number];
  /** A list or watch failed: counts are the last in-sync count until the next list. */
  'sync-lost': [err: KubeApiError];
  /** A list, or a watch, ended: HTTP status (0: no answer) and the API's reason ('' on success); upstream's lease metrics. */
  'api-call': [op: 'list' | 'watch', status: number, reason: string, seconds: number];
}

export class ServerLeaseCounter extends EventEmitter<ServerLeaseCounterEvents> {
  readonly namespace: string;
  readonly selector: LabelSelector;
  private readonly watchIdleTimeoutMs: number;
  private readonly listTimeoutMs: number;
  private readonly maxLeases: number;
  private readonly backoff: Backoff;
  /** Lease name → when it stops counting (undefined: never counts); at most maxLeases entries. */
  private readonly leases = new Map<string, number | undefined>();
  /** Where the next watch starts; '' → list first. */
  private resourceVersion = '';
  private inSync = false;
  /** The count when sync was lost; what count() answers until the next list. */
  private fallback: number | undefined;
  /** When the API last told us something (list, event, bookmark): the view is fresh as of then. */
  private lastHeardAt = 0;
  private running = false;
  private loop: Promise<void> | undefined;
  private watch: WatchHandle | undefined;
  /** Wakes the loop from a back-off sleep or a watch wait when stopping. */
  private wake: (() => void) | undefined;
  private overflowWarned = false;

  constructor(private readonly options: ServerLeaseCounterOptions) {
    super();
    this.namespace = options.namespace ?? DEFAULT_LEASE_NAMESPACE;
    this.selector = LabelSelector.parse(options.selector ?? DEFAULT_LEASE_LABEL, FLAG['lease-label']);
    this.watchIdleTimeoutMs = options.watchIdleTimeoutMs ?? 90_000;
    this.listTimeoutMs = options.listTimeoutMs ?? 10_000;
    this.maxLeases = options.maxLeases ?? 1000;
    this.backoff = new Backoff(options.retryInitialMs ?? 1000, options.retryMaxMs ?? 30_000);
  }

  get synced(): boolean {
    return this.inSync;
  }

  /** Valid leases now, or the count at loss of sync; at least 1 (upstream). */
  count(now = Date.now()): number {
    return Math.max(1, this.inSync ? this.validLeases(now) : (this.fallback ?? 0));
  }

  /** Leases in the view that count now (0 when none). */
  validLeases(now = Date.now()): number {
    let n = 0;
    for (const expires of this.leases.values()) if (expires !== undefined && expires > now) n++;
    return n;
  }

  start(): void {
    if (this.running) return;
    this.running = true;
    this.loop = this.run();
  }

  async stop(): Promise<void> {
    this.running = false;
    this.watch?.stop();
    this.wake?.();
    await this.loop;
  }

  private async run(): Promise<void> {
    while (this.running) {
      const started = performance.now();
      try {
        if (this.resourceVersion === '') await this.list();
        await this.watchOnce();
      } catch (err) {
        const e =
          err instanceof KubeApiError
            ? err
            : new KubeApiError({ kind: 'client', operation: `watch leases in ${this.namespace}`, message: String(err) });
        if (e.kind !== 'gone') {
          this.loseSync(e);
          await this.sleep(this.backoff.next());
          continue;
        }
        this.resourceVersion = ''; // too old: list again; the view stays usable meanwhile
      }
      // A watch that ends at once, again and again, must not spin.
      if (performance.now() - started < 1000) await this.sleep(this.backoff.next());
      else this.backoff.reset();
    }
  }

  private async list(): Promise<void> {
    const { api } = this.options;
    const started = performance.now();
    let list;
    try {
      list = await api.call(
        `list leases in ${this.namespace} (${this.selector.text})`,
        (o) => api.coordination.listNamespacedLease({ namespace: this.namespace, labelSelector: this.selector.text }, o),
        { timeoutMs: this.listTimeoutMs },
      );
    } catch (err) {
      this.callEnded('list', started, err);
      throw err;
    }
    this.callEnded('list', started);
    this.leases.clear();
    for (const lease of list.items) this.put(lease);
    this.resourceVersion = list.metadata?.resourceVersion ?? '';
    this.lastHeardAt = Date.now();
    const wasInSync = this.inSync;
    this.inSync = true;
    this.fallback = undefined;
    if (!wasInSync)
      this.options.log.info(
        { namespace: this.namespace, selector: this.selector.text, leases: this.leases.size },
        'server lease view in sync',
      );
    this.emit('synced', this.leases.size);
  }

  /** Resolves when the watch ended cleanly; rejects with why it failed. */
  private watchOnce(): Promise<void> {
    if (!this.running) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      let idle: NodeJS.Timeout | undefined;
      const started = performance.now();
      let reported = false;
      const settle = (err?: KubeApiError): void => {
        // The idle timeout settles, then stopping the handle ends it again: one report per watch.
        if (!reported) this.callEnded('watch', started, err);
        reported = true;
        clearTimeout(idle);
        this.watch = undefined;
        this.wake = undefined;
        if (err) reject(err);
        else resolve();
      };
      const armIdle = (): void => {
        clearTimeout(idle);
        idle = setTimeout(() => {
          settle(
            new KubeApiError({
              kind: 'timeout',
              operation: `watch leases in ${this.namespace}`,
              message: `no event or bookmark for ${this.watchIdleTimeoutMs} ms; replacing the watch`,
            }),
          );
          handle.stop();
        }, this.watchIdleTimeoutMs);
      };
      const query = {
        labelSelector: this.selector.text,
        resourceVersion: this.resourceVersion,
        allowWatchBookmarks: 'true',
        // client-go's reflector: a random 5-10 min, so watches of many agents do not end together.
        timeoutSeconds: String(300 + Math.floor(Math.random() * 300)),
      };
      const handle = this.options.api.watch(`/apis/coordination.k8s.io/v1/namespaces/${encodeURIComponent(this.namespace)}/leases`, query, {
        onEvent: (type, object) => {
          this.lastHeardAt = Date.now();
          armIdle();
          this.apply(type, object);
        },
        onEnd: (err) => settle(err),
      });
      this.watch = handle;
      this.wake = () => handle.stop();
      armIdle();
    });
  }

  private callEnded(op: 'list' | 'watch', started: number, err?: unknown): void {
    const seconds = (performance.now() - started) / 1000;
    if (err === undefined) this.emit('api-call', op, 200, '', seconds);
    else if (err instanceof KubeApiError) this.emit('api-call', op, err.status ?? 0, err.reason ?? err.kind, seconds);
    else this.emit('api-call', op, 0, 'client', seconds);
  }

  private apply(type: string, lease: V1Lease): void {
    const rv = lease.metadata?.resourceVersion;
    if (type === 'ADDED' || type === 'MODIFIED') this.put(lease);
    else if (type === 'DELETED') this.leases.delete(lease.metadata?.name ?? '');
    if (rv) this.resourceVersion = rv;
  }

  private put(lease: V1Lease): void {
    const name = lease.metadata?.name;
    if (!name) return;
    if (!this.leases.has(name) && this.leases.size >= this.maxLeases) {
      if (!this.overflowWarned) {
        this.overflowWarned = true;
        this.options.log.warn(
          { namespace: this.namespace, selector: this.selector.text, maxLeases: this.maxLeases },
          'more server leases match than the counter keeps; the extra ones are not counted',
        );
      }
      return;
    }
    this.leases.set(name, leaseExpiresAt(lease));
  }

  private loseSync(err: KubeApiError): void {
    if (!this.running) return;
    if (this.inSync) {
      // As of the last word from the API: a stalled watch is noticed late, when its leases look expired.
      this.fallback = this.validLeases(this.lastHeardAt);
      this.inSync = false;
      this.options.log.warn(
        { namespace: this.namespace, err: err.message, count: this.fallback },
        'server lease view out of sync; counting the last known servers until it recovers',
      );
    }
    this.resourceVersion = '';
    this.emit('sync-lost', err);
  }

  private sleep(ms: number): Promise<void> {
    if (!this.running) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      function done(): void {
        clearTimeout(timer);
        resolve();
      }
      this.wake = done;
    });
  }
}
