/**
 * How the agent resolves the names the server asks for (KANAL_RESOLVE_REQ,
 * src/tunnel/resolve-answers.ts): inside the cluster, as a pod there would.
 *
 * - With `--cluster-dns`, a name in the cluster goes to the cluster's DNS
 *   Service: one ending in `.svc` (`web.shop.svc`, expanded with
 *   `--cluster-domain` as a pod's search list would: Kubernetes DNS spec,
 *   https://github.com/kubernetes/dns/blob/master/docs/specification.md)
 *   or in `.<cluster-domain>` (`web.shop.svc.cluster.local`, pod and
 *   headless names too). Asked for A and AAAA with node:dns's Resolver
 *   (c-ares: UDP, TCP when the answer is truncated), its answers cached
 *   (name-resolver-cache.ts) for their TTL. An agent on the host network
 *   (systemd) then resolves Service names the same way as one in a pod.
 * - Every other name, and every name without `--cluster-dns`, goes to the
 *   system resolver (getaddrinfo: /etc/hosts, resolv.conf, a pod's search
 *   list). It tells no TTL, so its answers are not cached here (the host's
 *   resolver caches as it is configured to).
 *
 * Concurrent lookups of one name share one query; each caller's own cancel
 * signal only stops its wait.
 */
import { Resolver, lookup as systemLookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { isValidHost, type HostPort } from '../common/host-port.js';
import type { CancelSignal } from '../common/cancel.js';
import { NameNotResolved, type ResolveAnswer } from '../tunnel/name-resolution.js';
import { CACHE_MAX_ADDRESSES, NameResolverCache, type CachedAnswer } from './name-resolver-cache.js';

export const SYSTEM_RESOLVER = 'system resolver';
export const DEFAULT_CLUSTER_DOMAIN = 'cluster.local';

/** getaddrinfo's answer for a name (dns.promises.lookup with all: true). */
export type SystemLookup = (name: string) => Promise<readonly { address: string; family: number }[]>;

export interface NameResolverOptions {
  /** `--cluster-dns`: the cluster's DNS Service (an IP address and port); absent: the system resolver for every name. */
  clusterDns?: HostPort;
  /** `--cluster-domain` (default cluster.local). */
  clusterDomain?: string;
  /** Each try of a cluster DNS query (c-ares' timeout; it tries twice). */
  queryTimeoutMs?: number;
  /** The cache's clock, in ms (tests). */
  now?: () => number;
  /** Replaces getaddrinfo (tests). */
  systemLookup?: SystemLookup;
}

/** Error codes of node:dns that say the name has no address (RFC 2308: cached as negative answers). */
const MISSING_CODES = new Set(['ENOTFOUND', 'ENODATA']);

const WHY: Record<string, string> = {
  ENOTFOUND: 'no such name (NXDOMAIN)',
  ENODATA: 'no A or AAAA records',
  ETIMEOUT: 'the DNS server did not answer in time',
  ECONNREFUSED: 'the DNS server refused the query',
  ESERVFAIL: 'the DNS server failed (SERVFAIL)',
  EREFUSED: 'the DNS server refused the query (REFUSED)',
  EBADRESP: 'the DNS server answered something malformed',
};

function codeOf(err: unknown): string {
  const code: unknown = err instanceof Error ? Reflect.get(err, 'code') : undefined;
  return typeof code === 'string' ? code : 'EUNKNOWN';
}

/** `host:port` as the resolver is named and setServers takes it (IPv6 in brackets). */
function serverText(dns: HostPort): string {
  return isIP(dns.host) === 6 ? `[${dns.host}]:${dns.port}` : `${dns.host}:${dns.port}`;
}

export class NameResolver {
  private readonly cache: NameResolverCache;
  private readonly clusterResolver: Resolver | undefined;
  private readonly clusterName: string;
  private readonly domain: string;
  private readonly lookupSystem: SystemLookup;
  /** Queries under way, by the name asked of the server: later callers wait on the same one. */
  private readonly inflight = new Map<string, Promise<ResolveAnswer>>();

  constructor(opts: NameResolverOptions = {}) {
    this.cache = new NameResolverCache({ ...(opts.now ? { now: opts.now } : {}) });
    this.domain = normalize(opts.clusterDomain ?? DEFAULT_CLUSTER_DOMAIN);
    this.clusterName = opts.clusterDns ? `cluster DNS ${serverText(opts.clusterDns)}` : '';
    if (opts.clusterDns) {
      this.clusterResolver = new Resolver({ timeout: opts.queryTimeoutMs ?? 1500, tries: 2 });
      this.clusterResolver.setServers([serverText(opts.clusterDns)]);
    }
    this.lookupSystem = opts.systemLookup ?? ((name) => systemLookup(name, { all: true, order: 'verbatim' }));
  }

  /** Names cached now (the admin port, tests). */
  get cachedNames(): number {
    return this.cache.size;
  }

  /** The ResolveHandler of the agent's tunnels: `name`'s addresses, or NameNotResolved naming the resolver. */
  resolve = (name: string, signal?: CancelSignal): Promise<ResolveAnswer> => {
    const host = normalize(name);
    if (!isValidHost(host)) return Promise.reject(new NameNotResolved('not a host name', ''));
    const literal = isIP(host) === 0 ? undefined : host;
    if (literal) return Promise.resolve({ addresses: [literal], resolver: 'IP literal' });
    const query = this.clusterQuery(host);
    const key = query ?? host;
    let shared = this.inflight.get(key);
    if (!shared) {
      shared = (query === undefined ? this.askSystem(host) : this.askCluster(query)).finally(() => this.inflight.delete(key));
      this.inflight.set(key, shared);
    }
    return untilCancelled(shared, signal);
  };

  /** The name to ask the cluster DNS for `host`, or undefined when the system resolver answers it. */
  private clusterQuery(host: string): string | undefined {
    if (!this.clusterResolver) return undefined;
    if (host.endsWith('.svc')) return `${host}.${this.domain}`;
    if (host === this.domain || host.endsWith(`.${this.domain}`)) return host;
    return undefined;
  }

  private async askCluster(query: string): Promise<ResolveAnswer> {
    const resolver = this.clusterResolver;
    if (!resolver) throw new Error('no cluster DNS');
    const cached = this.cache.get(query) ?? (await this.queryCluster(resolver, query));
    return answerOf(cached);
  }

  private async queryCluster(resolver: Resolver, query: string): Promise<CachedAnswer> {
    const [v4, v6] = await Promise.allSettled([resolver.resolve4(query, { ttl: true }), resolver.resolve6(query, { ttl: true })]);
    const records = [...(v4.status === 'fulfilled' ? v4.value : []), ...(v6.status === 'fulfilled' ? v6.value : [])];
    if (records.length > 0) {
      const ttl = Math.min(...records.map((r) => r.ttl));
      return this.cache.putAddresses(
        query,
        records.slice(0, CACHE_MAX_ADDRESSES).map((r) => r.address),
        this.clusterName,
        ttl,
      );
    }
    const codes = [v4, v6].map((r) => (r.status === 'rejected' ? codeOf(r.reason) : 'ENODATA'));
    // NXDOMAIN for either type means the name does not exist; otherwise the first failure that is not "no records of this type".
    const code = codes.includes('ENOTFOUND') ? 'ENOTFOUND' : (codes.find((c) => c !== 'ENODATA') ?? 'ENODATA');
    const message = `${query}: ${WHY[code] ?? code}`;
    if (MISSING_CODES.has(code)) return this.cache.putMissing(query, message, this.clusterName);
    // A server that failed or did not answer is not an answer about the name: not cached.
    return { kind: 'missing', message, resolver: this.clusterName };
  }

  private async askSystem(host: string): Promise<ResolveAnswer> {
    let found: readonly { address: string }[];
    try {
      found = await this.lookupSystem(host);
    } catch (err) {
      const code = codeOf(err);
      throw new NameNotResolved(`${host}: ${WHY[code] ?? code}`, SYSTEM_RESOLVER);
    }
    const addresses = [...new Set(found.map((a) => a.address))].slice(0, CACHE_MAX_ADDRESSES);
    if (addresses.length === 0) throw new NameNotResolved(`${host}: no addresses`, SYSTEM_RESOLVER);
    return { addresses, resolver: SYSTEM_RESOLVER };
  }
}

function answerOf(a: CachedAnswer): ResolveAnswer {
  if (a.kind === 'missing') throw new NameNotResolved(a.message, a.resolver);
  return { addresses: a.addresses, resolver: a.resolver, ttlSeconds: a.ttlSeconds };
}

/** Lower case, without the root's trailing dot: one cache entry per name however it is spelled. */
function normalize(name: string): string {
  const lower = name.toLowerCase();
  return lower.endsWith('.') ? lower.slice(0, -1) : lower;
}

/** `work`, or a rejection as soon as `signal` aborts (the shared query itself goes on for the other callers). */
function untilCancelled<T>(work: Promise<T>, signal: CancelSignal | undefined): Promise<T> {
  if (!signal) return work;
  if (signal.aborted) return Promise.reject(new Error('resolve cancelled'));
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(new Error('resolve cancelled'));
    signal.addEventListener('abort', onAbort);
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
