/**
 * Which workers serve a tenant: rendezvous hashing (highest random weight,
 * Thaler and Ravishankar 1998) over the tenant's name, so every process
 * computes the same owners without talking, and a tenant added or removed
 * moves no other tenant. A tenant of `tenant-workers: K` is served by the K
 * workers of highest weight; its first owner is the one a tenant of one
 * worker has.
 */
import { createHash } from 'node:crypto';

/** The `share` workers (at most `workers`) of highest weight for `tenant`, highest first. */
export function ownersOf(tenant: string, share: number, workers: number): number[] {
  const weights = Array.from({ length: workers }, (_, i) => ({
    i,
    weight: createHash('sha256').update(`${tenant}\n${i}`).digest().readUInt32BE(0),
  }));
  // Ties (one in 2^32) go to the lower index, as a strict comparison over 0..workers-1 would.
  weights.sort((a, b) => b.weight - a.weight || a.i - b.i);
  return weights.slice(0, Math.max(1, Math.min(share, workers))).map((w) => w.i);
}

/** The one worker of a tenant served whole by one. */
export function ownerOf(tenant: string, workers: number): number {
  return ownersOf(tenant, 1, workers)[0];
}
