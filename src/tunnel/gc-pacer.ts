/**
 * Paces young-generation GCs to the bytes this process moves.
 *
 * Every socket read and every HTTP/2 read hands JS a fresh ArrayBuffer whose
 * memory lives outside the V8 heap. Those die young, but only a scavenge frees
 * them, and scavenges run when the JS heap's new space fills — which the data
 * path, allocating few JS objects per byte, does slowly. Meanwhile the
 * external memory grows by the full throughput, and V8 answers its
 * "external memory pressure" (every ~32 MB) with a full mark-compact. A
 * minor GC every GC_PACE_BYTES moved frees the same buffers with a scavenge
 * of the small young generation, a fraction of the cost.
 *
 * The scavenges promote what is still in flight, so the old generation grows
 * by a little garbage each time. V8 sizes the old generation's limit by a
 * factor it picks between 1.1 and 4 (deps/v8/src/heap/heap-controller.h):
 * after an idle spell it picks the low end, and the headroom left is so
 * small that the next mark-compact starts as soon as one finishes; under
 * connection churn it picks the high end, and the old generation swings by
 * three times its live size. From enableGcPacing on, the factor is pinned at
 * HEAP_GROWING_PERCENT, inside V8's own range. Figures: docs/memory.md
 * ("Connection churn"), bench/RESULTS.md; test: test/tunnel/gc-pacer.test.ts.
 *
 * `gc` comes from common/v8-gc.ts; without it pacing is off and V8 behaves
 * as before. Pacing is off until a command turns it on (enableGcPacing;
 * `kanal server` and `kanal agent` do), so a process that embeds the tunnel
 * keeps V8's settings; KANAL_GC_PACING=0 keeps it off.
 */
import v8 from 'node:v8';
import { v8Gc, type GcFunction } from '../common/v8-gc.js';

/** Bytes moved between two minor GCs. */
export const GC_PACE_BYTES = 8 * 1024 * 1024;

/** Old-generation limit after a mark-compact = live size × (1 + this / 100); why 100: docs/memory.md, "Connection churn". */
export const HEAP_GROWING_PERCENT = 100;

/** Set once by enableGcPacing; until then noteBytesMoved does nothing. */
let enabled = false;
/** Fetched by enableGcPacing; null: unavailable (or not enabled). */
let gc: GcFunction | null = null;
let moved = 0;
let scheduled = false;
/** Called once before the next paced minor GC; each re-registers when it holds young objects again. */
const beforeScavenge = new Set<() => void>();

/**
 * What a holder of short-lived objects needs to let them die young: whether
 * the minor GCs are paced here, and a call just before the next one.
 */
export interface PacedScavenges {
  /** True when minor GCs come from this pacer (GC_PACE_BYTES apart), so beforeNext() runs before each. */
  readonly active: boolean;
  /** Calls `fn` once, just before the next paced minor GC; one entry per function. */
  beforeNext(fn: () => void): void;
  /** Takes back a beforeNext() that is no longer needed (its holder let go of everything). */
  cancel(fn: () => void): void;
}

/** The process's paced minor GCs. */
export const pacedScavenges: PacedScavenges = {
  get active(): boolean {
    return gc !== null;
  },
  beforeNext(fn: () => void): void {
    beforeScavenge.add(fn);
  },
  cancel(fn: () => void): void {
    beforeScavenge.delete(fn);
  },
};

/** Turns pacing on for this process and pins V8's heap growing factor (process-wide); KANAL_GC_PACING=0 leaves both off. */
export function enableGcPacing(): void {
  if (enabled) return;
  enabled = true;
  gc = v8Gc();
  // V8 reads the flag whenever it sets a new limit, so it applies from the next collection on.
  if (gc) v8.setFlagsFromString(`--heap-growing-percent=${HEAP_GROWING_PERCENT}`);
}

function collect(): void {
  scheduled = false;
  moved = 0;
  if (beforeScavenge.size > 0) {
    const due = [...beforeScavenge];
    beforeScavenge.clear();
    for (const fn of due) fn();
  }
  gc?.({ type: 'minor' });
}

/** Counts `bytes` received into fresh buffers; schedules a minor GC every GC_PACE_BYTES. */
export function noteBytesMoved(bytes: number): void {
  if (!enabled) return;
  moved += bytes;
  if (moved < GC_PACE_BYTES || scheduled) return;
  if (!gc) {
    moved = 0;
    return;
  }
  scheduled = true;
  setImmediate(collect);
}
