/**
 * The agent's cache of the cluster DNS's answers (name-resolver.ts): bounded
 * in entries (least recently used out first) and in addresses per name, each
 * answer kept for its DNS TTL clamped to 1-300 s (RFC 2181 section 8 makes a
 * TTL up to 2^31-1 s legal; a Service that moves must not stay stale for
 * long), and a name that does not exist (NXDOMAIN, no records: RFC 2308
 * negative answers) for 2 s, so a client asking again and again for a
 * missing name does not load the DNS Service.
 */

export const CACHE_MAX_ENTRIES = 1024;
export const CACHE_MIN_TTL_S = 1;
export const CACHE_MAX_TTL_S = 300;
export const CACHE_NEGATIVE_TTL_S = 2;
export const CACHE_MAX_ADDRESSES = 16;

/** What the cache holds for a name: its addresses, or why it has none. */
export type CachedAnswer =
  | { readonly kind: 'addresses'; readonly addresses: readonly string[]; readonly resolver: string; readonly ttlSeconds: number }
  | { readonly kind: 'missing'; readonly message: string; readonly resolver: string };

interface Entry {
  answer: CachedAnswer;
  /** now() in ms after which the entry is gone. */
  expiresAt: number;
}

export interface NameResolverCacheOptions {
  maxEntries?: number;
  /** The clock, in ms (default Date.now): tests move it instead of sleeping. */
  now?: () => number;
}

export class NameResolverCache {
  /** Insertion order is recency: a hit moves its entry to the end, the first one is evicted. */
  private readonly entries = new Map<string, Entry>();
  private readonly maxEntries: number;
  private readonly now: () => number;

  constructor(opts: NameResolverCacheOptions = {}) {
    this.maxEntries = opts.maxEntries ?? CACHE_MAX_ENTRIES;
    this.now = opts.now ?? Date.now;
  }

  get size(): number {
    return this.entries.size;
  }

  /** The live answer for `name` (its TTL left, for an answer), or undefined. */
  get(name: string): CachedAnswer | undefined {
    const entry = this.entries.get(name);
    if (!entry) return undefined;
    const left = entry.expiresAt - this.now();
    if (left <= 0) {
      this.entries.delete(name);
      return undefined;
    }
    this.entries.delete(name);
    this.entries.set(name, entry);
    const a = entry.answer;
    return a.kind === 'addresses' ? { ...a, ttlSeconds: Math.max(1, Math.ceil(left / 1000)) } : a;
  }

  /** Keeps `addresses` (the first CACHE_MAX_ADDRESSES) for `ttlSeconds` clamped to 1-300 s; returns what was kept. */
  putAddresses(name: string, addresses: readonly string[], resolver: string, ttlSeconds: number): CachedAnswer {
    const ttl = Math.min(CACHE_MAX_TTL_S, Math.max(CACHE_MIN_TTL_S, Math.floor(Number.isFinite(ttlSeconds) ? ttlSeconds : 0)));
    const answer: CachedAnswer = { kind: 'addresses', addresses: addresses.slice(0, CACHE_MAX_ADDRESSES), resolver, ttlSeconds: ttl };
    this.put(name, answer, ttl);
    return answer;
  }

  /** Keeps "`name` does not exist" for CACHE_NEGATIVE_TTL_S. */
  putMissing(name: string, message: string, resolver: string): CachedAnswer {
    const answer: CachedAnswer = { kind: 'missing', message, resolver };
    this.put(name, answer, CACHE_NEGATIVE_TTL_S);
    return answer;
  }

  private put(name: string, answer: CachedAnswer, ttlSeconds: number): void {
    this.entries.delete(name);
    // Expired entries leave when read; a full cache drops its least recently used one (Map order).
    while (this.entries.size >= this.maxEntries) {
      const oldest = this.entries.keys().next();
      if (oldest.done) break;
      this.entries.delete(oldest.value);
    }
    this.entries.set(name, { answer, expiresAt: this.now() + ttlSeconds * 1000 });
  }
}
