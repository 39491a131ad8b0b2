/**
 * The Lease storage of the Kubernetes API stand-in: what the kube-apiserver
 * and etcd do for coordination.k8s.io/v1 Leases, within what Kanal and
 * upstream's client-go use:
 * - one resourceVersion counter for every write (etcd's revision); a write
 *   that changes nothing is no write (no new version, no event);
 * - create refuses an existing name (409 AlreadyExists); update with a stale
 *   resourceVersion is a 409 Conflict, without one it is unconditional
 *   (leases allow unconditional update); update of a missing lease is a 404
 *   (leases do not create on update); delete honours preconditions;
 * - watches replay from a bounded history and answer 410 Expired for a
 *   resourceVersion older than it; a lease whose labels leave a watch's
 *   selector is DELETED for that watch, one that enters it ADDED.
 */
import { randomUUID } from 'node:crypto';
import { LabelSelector } from '../../../src/kube/labels.js';

export const LEASE_GROUP = 'coordination.k8s.io';
const API_VERSION = `${LEASE_GROUP}/v1`;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** An API error, answered as a `Status` object. */
export class StatusError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
  }
}

export interface LeaseMeta {
  name: string;
  namespace: string;
  uid: string;
  resourceVersion: string;
  creationTimestamp: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface LeaseSpec {
  holderIdentity?: string;
  leaseDurationSeconds?: number;
  acquireTime?: string;
  renewTime?: string;
  leaseTransitions?: number;
  strategy?: string;
  preferredHolder?: string;
}

export interface Lease {
  apiVersion: typeof API_VERSION;
  kind: 'Lease';
  metadata: LeaseMeta;
  spec: LeaseSpec;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface LeaseWatcher {
  namespace: string | undefined;
  selector: LabelSelector;
  send(type: WatchEventType, lease: Lease): void;
}

interface Change {
  rv: number;
  type: WatchEventType;
  lease: Lease;
  previous: Lease | undefined;
}

const HISTORY = 1000;

export class LeaseStore {
  /** The last resourceVersion handed out. */
  private revision = 0;
  /** Leases by `namespace/name`. */
  private readonly leases = new Map<string, Lease>();
  /** The last {@link HISTORY} changes, oldest first; `compactedRv` is the newest one dropped. */
  private readonly history: Change[] = [];
  private compactedRv = 0;
  private readonly watchers = new Set<LeaseWatcher>();

  get resourceVersion(): string {
    return String(this.revision);
  }

  list(namespace: string | undefined, selector: LabelSelector): { items: Lease[]; resourceVersion: string } {
    const items = [...this.leases.values()].filter((l) => matches(l, namespace, selector));
    items.sort((a, b) => `${a.metadata.namespace}/${a.metadata.name}`.localeCompare(`${b.metadata.namespace}/${b.metadata.name}`));
    return { items: structuredClone(items), resourceVersion: this.resourceVersion };
  }

  get(namespace: string, name: string): Lease {
    const lease = this.leases.get(`${namespace}/${name}`);
    if (!lease) throw notFound(name);
    return structuredClone(lease);
  }

  create(namespace: string, body: unknown): Lease {
    const given = asLease(body, namespace);
    if (given.metadata.resourceVersion)
      throw new StatusError(500, 'InternalError', 'resourceVersion should not be set on objects to be created');
    const name = validName(given.metadata.name);
    if (this.leases.has(`${namespace}/${name}`)) {
      throw new StatusError(409, 'AlreadyExists', `leases.${LEASE_GROUP} ${JSON.stringify(name)} already exists`, {
        name,
        group: LEASE_GROUP,
        kind: 'leases',
      });
    }
    const lease: Lease = {
      apiVersion: API_VERSION,
      kind: 'Lease',
      metadata: {
        ...optionalMaps(given.metadata),
        name,
        namespace,
        uid: randomUUID(),
        resourceVersion: '',
        creationTimestamp: new Date().toISOString().replace(/\.\d+Z$/, 'Z'),
      },
      spec: validSpec(given.spec, name),
    };
    return this.write('ADDED', lease, undefined);
  }

  update(namespace: string, name: string, body: unknown): Lease {
    const given = asLease(body, namespace);
    if (given.metadata.name !== name) {
      throw new StatusError(
        400,
        'BadRequest',
        `the name of the object (${given.metadata.name}) does not match the name on the URL (${name})`,
      );
    }
    const current = this.leases.get(`${namespace}/${name}`);
    if (!current) throw notFound(name);
    if (given.metadata.resourceVersion && given.metadata.resourceVersion !== current.metadata.resourceVersion)
      throw conflict(name, 'the object has been modified; please apply your changes to the latest version and try again');
    const next: Lease = {
      ...current,
      metadata: {
        ...optionalMaps(given.metadata),
        name,
        namespace,
        uid: current.metadata.uid,
        resourceVersion: current.metadata.resourceVersion,
        creationTimestamp: current.metadata.creationTimestamp,
      },
      spec: validSpec(given.spec, name),
    };
    if (JSON.stringify(next) === JSON.stringify(current)) return structuredClone(current);
    return this.write('MODIFIED', next, current);
  }

  delete(namespace: string, name: string, preconditions: { resourceVersion?: string; uid?: string } = {}): Lease {
    const current = this.leases.get(`${namespace}/${name}`);
    if (!current) throw notFound(name);
    if (preconditions.uid && preconditions.uid !== current.metadata.uid) {
      throw conflict(name, `Precondition failed: UID in precondition: ${preconditions.uid}, UID in object meta: ${current.metadata.uid}`);
    }
    if (preconditions.resourceVersion && preconditions.resourceVersion !== current.metadata.resourceVersion) {
      throw conflict(
        name,
        `Precondition failed: ResourceVersion in precondition: ${preconditions.resourceVersion}, ResourceVersion in object meta: ${current.metadata.resourceVersion}`,
      );
    }
    return this.write('DELETED', current, current);
  }

  /**
   * Registers a watcher and replays what it missed: the current state for
   * `sinceRv` "" or "0", else every change after it (410 when too old).
   * Returns the function that unregisters it.
   */
  watch(watcher: LeaseWatcher, sinceRv: string): () => void {
    if (sinceRv === '' || sinceRv === '0') {
      for (const lease of this.list(watcher.namespace, watcher.selector).items) watcher.send('ADDED', lease);
    } else {
      const since = Number(sinceRv);
      if (!Number.isSafeInteger(since) || since < 0)
        throw new StatusError(400, 'BadRequest', `invalid resourceVersion ${JSON.stringify(sinceRv)}`);
      if (since < this.compactedRv) throw new StatusError(410, 'Expired', `too old resource version: ${since} (${this.compactedRv + 1})`);
      for (const change of this.history) if (change.rv > since) deliver(watcher, change);
    }
    this.watchers.add(watcher);
    return () => this.watchers.delete(watcher);
  }

  /** Forgets the whole history, as etcd compaction does: older watches get 410. */
  compact(): void {
    this.compactedRv = this.revision;
    this.history.length = 0;
  }

  private write(type: WatchEventType, lease: Lease, previous: Lease | undefined): Lease {
    const rv = ++this.revision;
    const stored: Lease = { ...lease, metadata: { ...lease.metadata, resourceVersion: String(rv) } };
    if (type === 'DELETED') this.leases.delete(`${lease.metadata.namespace}/${lease.metadata.name}`);
    else this.leases.set(`${lease.metadata.namespace}/${lease.metadata.name}`, stored);
    const change: Change = { rv, type, lease: stored, previous };
    this.history.push(change);
    if (this.history.length > HISTORY) this.compactedRv = this.history.shift()!.rv;
    for (const w of this.watchers) deliver(w, change);
    return structuredClone(stored);
  }
}

function deliver(w: LeaseWatcher, change: Change): void {
  const before = change.previous !== undefined && matches(change.previous, w.namespace, w.selector);
  const after = change.type !== 'DELETED' && matches(change.lease, w.namespace, w.selector);
  if (before && after) w.send('MODIFIED', structuredClone(change.lease));
  else if (after) w.send('ADDED', structuredClone(change.lease));
  else if (before) w.send('DELETED', structuredClone(change.lease));
}

function matches(lease: Lease, namespace: string | undefined, selector: LabelSelector): boolean {
  return (namespace === undefined || lease.metadata.namespace === namespace) && selector.matches(lease.metadata.labels);
}

function notFound(name: string): StatusError {
  return new StatusError(404, 'NotFound', `leases.${LEASE_GROUP} ${JSON.stringify(name)} not found`, {
    name,
    group: LEASE_GROUP,
    kind: 'leases',
  });
}

function conflict(name: string, why: string): StatusError {
  return new StatusError(409, 'Conflict', `Operation cannot be fulfilled on leases.${LEASE_GROUP} ${JSON.stringify(name)}: ${why}`, {
    name,
    group: LEASE_GROUP,
    kind: 'leases',
  });
}

function invalid(name: string, field: string, detail: string): StatusError {
  return new StatusError(422, 'Invalid', `Lease.${LEASE_GROUP} ${JSON.stringify(name)} is invalid: ${field}: ${detail}`, {
    name,
    group: LEASE_GROUP,
    kind: 'Lease',
  });
}

function asLease(body: unknown, namespace: string): { metadata: Partial<LeaseMeta>; spec: Record<string, unknown> } {
  if (typeof body !== 'object' || body === null) throw new StatusError(400, 'BadRequest', 'the request body is not a Lease object');
  const obj = body as { apiVersion?: unknown; kind?: unknown; metadata?: unknown; spec?: unknown };
  if ((obj.kind !== undefined && obj.kind !== 'Lease') || (obj.apiVersion !== undefined && obj.apiVersion !== API_VERSION)) {
    throw new StatusError(400, 'BadRequest', `the body is ${String(obj.apiVersion)}/${String(obj.kind)}, not ${API_VERSION}/Lease`);
  }
  const metadata = (typeof obj.metadata === 'object' && obj.metadata !== null ? obj.metadata : {}) as Partial<LeaseMeta>;
  if (metadata.namespace && metadata.namespace !== namespace) {
    throw new StatusError(400, 'BadRequest', 'the namespace of the provided object does not match the namespace sent on the request');
  }
  return { metadata, spec: (typeof obj.spec === 'object' && obj.spec !== null ? obj.spec : {}) as Record<string, unknown> };
}

function optionalMaps(meta: Partial<LeaseMeta>): Pick<LeaseMeta, 'labels' | 'annotations'> {
  return {
    ...(meta.labels && Object.keys(meta.labels).length > 0 ? { labels: { ...meta.labels } } : {}),
    ...(meta.annotations && Object.keys(meta.annotations).length > 0 ? { annotations: { ...meta.annotations } } : {}),
  };
}

function validName(name: string | undefined): string {
  if (!name) throw invalid('', 'metadata.name', 'Required value: name or generateName is required');
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) {
    throw invalid(
      name,
      'metadata.name',
      `Invalid value: ${JSON.stringify(name)}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character`,
    );
  }
  return name;
}

function validSpec(spec: Record<string, unknown>, name: string): LeaseSpec {
  const out: LeaseSpec = {};
  if (typeof spec.holderIdentity === 'string') out.holderIdentity = spec.holderIdentity;
  if (spec.leaseDurationSeconds !== undefined && spec.leaseDurationSeconds !== null) {
    const d = spec.leaseDurationSeconds;
    if (typeof d !== 'number' || !Number.isInteger(d))
      throw new StatusError(400, 'BadRequest', `spec.leaseDurationSeconds: ${JSON.stringify(d)} is not an integer`);
    if (d <= 0) throw invalid(name, 'spec.leaseDurationSeconds', `Invalid value: ${d}: must be greater than 0`);
    out.leaseDurationSeconds = d;
  }
  for (const field of ['acquireTime', 'renewTime'] as const) {
    const t = microTime(spec[field]);
    if (t !== undefined) out[field] = t;
  }
  if (typeof spec.leaseTransitions === 'number') out.leaseTransitions = spec.leaseTransitions;
  if (typeof spec.strategy === 'string') out.strategy = spec.strategy;
  if (typeof spec.preferredHolder === 'string') out.preferredHolder = spec.preferredHolder;
  return out;
}

/**
 * metav1.MicroTime: time.Parse with RFC3339Micro, which demands exactly six
 * fractional digits ("2006-01-02T15:04:05.000000Z07:00"); stored in UTC.
 */
function microTime(value: unknown): string | undefined {
  if (value === undefined || value === null) return undefined;
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  const m = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.(\d{6})(Z|[+-]\d\d:\d\d)$/.exec(text);
  const ms = Date.parse(text);
  if (typeof value !== 'string' || !m || !Number.isFinite(ms)) {
    throw new StatusError(
      400,
      'BadRequest',
      `Lease in version "v1" cannot be handled as a Lease: parsing time ${JSON.stringify(text)} as "2006-01-02T15:04:05.000000Z07:00": cannot parse as RFC 3339 with microseconds`,
    );
  }
  return `${new Date(ms).toISOString().slice(0, 19)}.${m[1]}Z`;
}
