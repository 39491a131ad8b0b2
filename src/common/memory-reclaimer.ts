/**
 * Gives memory back after connection churn. Each connection leaves native
 * memory behind that neither V8 nor glibc hands back on its own: pages glibc
 * keeps in its arenas once freed (it returns only a free tail of the main
 * heap), and buffers of sockets whose JS wrappers wait for a major GC (V8
 * does not count them, so nothing hurries it). Every RECLAIM_CHECK_MS,
 * malloc_trim(0) returns the free pages (microseconds when there are none);
 * when RSS stands RECLAIM_GROWTH_BYTES above its floor (the lowest seen since
 * the last collection), a major GC runs first. Figures and the cost of each:
 * docs/memory.md, "Connection churn".
 */
import type { Logger } from 'pino';
import { mallocTrim, type MallocTrim } from '../../native/malloc-trim.js';
import { v8Gc, type GcFunction } from './v8-gc.js';
import { StateMachine, type Lifecycle } from './state-machine.js';

export const RECLAIM_CHECK_MS = 10_000;
export const RECLAIM_GROWTH_BYTES = 8 * 1024 * 1024;

export interface Reclaim {
  /** RSS before and after, bytes. */
  before: number;
  after: number;
  /** Whether a major GC ran (RSS stood RECLAIM_GROWTH_BYTES above its floor). */
  collected: boolean;
  /** Wall time the reclaim held the event loop. */
  ms: number;
}

export interface MemoryReclaimerOptions {
  checkMs?: number;
  growthBytes?: number;
  /** Injected by tests; default process.memoryUsage.rss, v8Gc(), mallocTrim(). */
  rss?: () => number;
  gc?: GcFunction | null;
  trim?: MallocTrim | null;
  /** Called after every check that collected or gave memory back. */
  onReclaim?: (r: Reclaim) => void;
}

/**
 * stopped: no timer. watching: a timer checks every `checkMs`.
 * Invariant (watching): floor ≤ every RSS read since the last collection,
 * and ≤ the RSS right after it.
 */
type State = { readonly kind: 'stopped' } | { readonly kind: 'watching'; readonly timer: NodeJS.Timeout; readonly floor: number };

/** stop() when stopped changes nothing; each check moves watching to watching (a new floor). */
const RECLAIMER: Lifecycle<State> = {
  name: 'memory reclaimer',
  moves: { stopped: ['stopped', 'watching'], watching: ['watching', 'stopped'] },
};
const STOPPED: State = { kind: 'stopped' };

export class MemoryReclaimer {
  private readonly life = new StateMachine<State>(STOPPED, RECLAIMER);
  private readonly rss: () => number;
  private readonly gc: GcFunction | null;
  private readonly trim: MallocTrim | null;

  constructor(private readonly opts: MemoryReclaimerOptions = {}) {
    this.rss = opts.rss ?? (() => process.memoryUsage.rss());
    this.gc = opts.gc !== undefined ? opts.gc : v8Gc();
    this.trim = opts.trim !== undefined ? opts.trim : mallocTrim();
  }

  /** Whether a reclaim can do anything here (a V8 gc or a glibc malloc_trim). */
  get available(): boolean {
    return this.gc !== null || this.trim !== null;
  }

  start(): void {
    if (this.life.kind === 'watching' || !this.available) return;
    const timer = setInterval(() => this.check(), this.opts.checkMs ?? RECLAIM_CHECK_MS);
    timer.unref();
    this.to({ kind: 'watching', timer, floor: this.rss() });
  }

  stop(): void {
    this.to(STOPPED);
  }

  /** One check (the timer's); returns what it did, if it collected or gave memory back. */
  check(): Reclaim | undefined {
    const s = this.life.state;
    if (s.kind !== 'watching') return undefined;
    const started = performance.now();
    const before = this.rss();
    const collected = this.gc !== null && before - s.floor >= (this.opts.growthBytes ?? RECLAIM_GROWTH_BYTES);
    if (collected) this.gc?.({ type: 'major' });
    this.trim?.();
    const after = this.rss();
    this.to({ ...s, floor: collected ? after : Math.min(s.floor, after) });
    if (!collected && after >= before) return undefined;
    const reclaim = { before, after, collected, ms: performance.now() - started };
    this.opts.onReclaim?.(reclaim);
    return reclaim;
  }

  private to(next: State): void {
    const s = this.life.state;
    if (s.kind === 'watching' && next.kind === 'stopped') clearInterval(s.timer);
    this.life.to(next);
  }
}

const mib = (bytes: number): number => Math.round(bytes / 104857.6) / 10;

/** The counters a reclaimer moves (KanalMetrics' kanal_memory_collections_total and kanal_memory_reclaimed_bytes_total). */
export interface ReclaimCounters {
  memoryCollections: { inc(): void };
  memoryReclaimedBytes: { inc(bytes: number): void };
}

/** Starts a process's reclaimer: counted in `metrics`, a reclaim of 1 MiB or more logged at debug. Stop it with the process. */
export function startMemoryReclaimer(metrics: ReclaimCounters, log: Logger): MemoryReclaimer {
  const reclaimer = new MemoryReclaimer({
    onReclaim: (r) => {
      if (r.collected) metrics.memoryCollections.inc();
      metrics.memoryReclaimedBytes.inc(Math.max(0, r.before - r.after));
      if (r.collected || r.before - r.after >= 1024 * 1024) {
        log.debug(
          { rssBeforeMiB: mib(r.before), rssAfterMiB: mib(r.after), collected: r.collected, ms: Math.round(r.ms * 10) / 10 },
          'memory reclaimed',
        );
      }
    },
  });
  reclaimer.start();
  return reclaimer;
}
