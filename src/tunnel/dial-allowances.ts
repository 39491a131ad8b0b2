/**
 * The dial allowances of identities (dial-allowance.ts), kept across their
 * tunnels: at the server one per agent (credential + agentID) in each
 * tenant's registry, at the agent one per server. A bounded table with idle
 * expiry; its rules, so that no value a peer chooses refills a bucket:
 *
 * - An entry lives while a tunnel uses it, and after that until its buckets
 *   are full again (then forgetting it gives nothing away); it is then
 *   forgotten at the next sweep (at most once a second, or when the table is full).
 * - A group (a credential) holds a bounded number of identities (the
 *   registry's --max-agents-per-credential). A new identity in a group that
 *   already holds that many starts no fuller than the most drained of them,
 *   and takes the place of those no tunnel uses: a node that announces a new
 *   agentID at each reconnect gets no fresh bucket.
 * - The table holds at most `maxEntries`. A new identity that finds it full
 *   (after a sweep) shares one overflow allowance with every other such
 *   identity: nothing already in the table is reset or displaced.
 */
import { DialAllowance, type DialRateLimits } from './dial-allowance.js';

/** Default bound of one table (a tenant's agents): about 1 KiB an entry, 16 MiB full; Kubernetes supports 5,000 nodes a cluster. */
export const DEFAULT_MAX_DIAL_ALLOWANCES = 16_384;
/** Unused entries are looked at no more often than this, unless the table is full. */
const SWEEP_INTERVAL_MS = 1000;

export interface DialAllowancesOptions {
  maxEntries?: number;
  /** Milliseconds, monotonic (tests give a fake clock). */
  now?: () => number;
}

interface Entry {
  group: string;
  id: string;
}

export class DialAllowances {
  /**
   * group -> identity -> its allowance. Invariants: no empty inner map;
   * `count` is the number of entries, at most maxEntries; an allowance is in
   * at most one entry; the overflow allowance is in none.
   */
  private readonly groups = new Map<string, Map<string, DialAllowance>>();
  private count = 0;
  /** Entries whose last tunnel left, oldest first: candidates for the sweep (one may be in use again; the sweep skips it). */
  private readonly unused = new Map<DialAllowance, Entry>();
  /** Shared by the identities that found the table full; made on first need. */
  private overflowAllowance: DialAllowance | undefined;
  private sweptAt = Number.NEGATIVE_INFINITY;
  private readonly maxEntries: number;
  private readonly now: () => number;

  constructor(opts: DialAllowancesOptions = {}) {
    this.maxEntries = opts.maxEntries ?? DEFAULT_MAX_DIAL_ALLOWANCES;
    this.now = opts.now ?? ((): number => performance.now());
  }

  /** Entries held (identities with a tunnel, and those without whose buckets are not yet full). */
  get size(): number {
    return this.count;
  }

  /** True while some identity shares the overflow allowance. */
  get overflowing(): boolean {
    return this.overflowAllowance?.inUse ?? false;
  }

  /**
   * The allowance of identity `id` in `group`, with `limits` applied (a
   * reload keeps the tokens); `groupBound`: identities a group holds before
   * a new one inherits from them.
   */
  allowanceFor(group: string, id: string, limits: DialRateLimits, groupBound = Number.POSITIVE_INFINITY): DialAllowance {
    const known = this.groups.get(group)?.get(id);
    if (known) {
      known.configure(limits);
      return known;
    }
    this.sweep(this.count >= this.maxEntries);
    const members = this.groups.get(group);
    const inherits = members !== undefined && members.size >= groupBound;
    // Those the new one takes the place of, so the group stays at its bound: no tunnel uses them.
    const replaced = inherits ? [...members].filter(([, a]) => !a.inUse).slice(0, members.size + 1 - groupBound) : [];
    if (this.count - replaced.length >= this.maxEntries) return this.overflow(limits);
    const allowance = new DialAllowance({ limits, now: this.now, onUnused: (a) => this.becameUnused(a, group, id) });
    if (inherits) for (const other of members.values()) allowance.noFullerThan(other);
    for (const [otherID, other] of replaced) this.forget(group, otherID, other);
    this.add(group, id, allowance);
    return allowance;
  }

  /** Forgets the entries no tunnel uses whose buckets are full again; `force`: even if it swept less than a second ago. */
  sweep(force = false): void {
    const now = this.now();
    if (!force && now - this.sweptAt < SWEEP_INTERVAL_MS) return;
    this.sweptAt = now;
    for (const [allowance, { group, id }] of this.unused) {
      if (allowance.inUse) this.unused.delete(allowance);
      else if (allowance.idle) this.forget(group, id, allowance);
    }
  }

  private becameUnused(allowance: DialAllowance, group: string, id: string): void {
    if (this.groups.get(group)?.get(id) !== allowance) return;
    this.unused.delete(allowance);
    this.unused.set(allowance, { group, id });
    this.sweep();
  }

  private overflow(limits: DialRateLimits): DialAllowance {
    this.overflowAllowance ??= new DialAllowance({ limits, now: this.now });
    this.overflowAllowance.configure(limits);
    return this.overflowAllowance;
  }

  private add(group: string, id: string, allowance: DialAllowance): void {
    let members = this.groups.get(group);
    if (!members) {
      members = new Map();
      this.groups.set(group, members);
    }
    members.set(id, allowance);
    this.count++;
  }

  private forget(group: string, id: string, allowance: DialAllowance): void {
    const members = this.groups.get(group);
    if (members?.get(id) !== allowance) return;
    members.delete(id);
    if (members.size === 0) this.groups.delete(group);
    this.unused.delete(allowance);
    this.count--;
  }
}
