/**
 * Which worker serves a tenant: rendezvous hashing (highest random weight,
 * Thaler and Ravishankar 1998) over the tenant's name, so every process
 * computes the same owner without talking, and a tenant added or removed
 * moves no other tenant.
 */
import { createHash } from 'node:crypto';

export function ownerOf(tenant: string, workers: number): number {
  let best = 0;
  let bestWeight = -1;
  for (let i = 0; i < workers; i++) {
    const weight = createHash('sha256').update(`${tenant}\n${i}`).digest().readUInt32BE(0);
    if (weight > bestWeight) {
      best = i;
      bestWeight = weight;
    }
  }
  return best;
}
