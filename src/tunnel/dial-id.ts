import { randomBytes } from 'node:crypto';

/** A random positive int64, as upstream's rand.Int63() produces for dial IDs. */
export function randomDialID(): bigint {
  const v = randomBytes(8).readBigUInt64BE() & 0x7fff_ffff_ffff_ffffn;
  return v === 0n ? 1n : v;
}
