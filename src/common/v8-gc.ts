/**
 * V8's `gc()` without exposing it to the process. V8 only offers it with
 * --expose-gc; the flag is turned on just long enough to fetch the function
 * from a fresh context, so the process's own global stays untouched. Without
 * it (an embedder that forbids the flag) the callers do without.
 */
import v8 from 'node:v8';
import vm from 'node:vm';

export type GcFunction = (options: { type: 'minor' | 'major'; execution?: 'sync' | 'async' }) => void;

/** undefined: not fetched yet; null: unavailable. */
let gc: GcFunction | null | undefined;

/** The process's one `gc`, fetched on first use; KANAL_GC_PACING=0 keeps Kanal from collecting on its own. */
export function v8Gc(): GcFunction | null {
  if (gc !== undefined) return gc;
  gc = null;
  if (process.env.KANAL_GC_PACING === '0') return gc;
  try {
    v8.setFlagsFromString('--expose-gc');
    const fn = vm.runInNewContext('gc') as unknown;
    v8.setFlagsFromString('--no-expose-gc');
    if (typeof fn === 'function') gc = fn as GcFunction;
  } catch {
    // leave it null
  }
  return gc;
}
