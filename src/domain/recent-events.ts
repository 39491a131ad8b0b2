/**
 * Counts of events by kind over the last minutes, for the admin port's status
 * document (docs/operations.md, "What is connected: `kanal status`"): a ring of
 * per-minute buckets, as the load averages of uptime(1) are read over 1, 5 and
 * 15 minutes. The kinds are a fixed set named in code (refusal reasons,
 * throttles), never a peer's words, so each bucket holds a bounded number of keys.
 */
import { REFUSAL_REASONS, type RefusalReason } from './refusal-reason.js';

/** What slows a peer down without refusing it: kanal_stream_read_pauses_total and kanal_streams_closed_total, by reason. */
export const THROTTLES = ['read_pause_slow_reader', 'read_pause_peer_not_reading', 'stream_closed_peer_not_reading'] as const;
export type Throttle = (typeof THROTTLES)[number];

/** An event the status document counts: a refusal (kanal_refusals_total's reason) or a throttle. */
export type RecentKind = RefusalReason | Throttle;

/** The windows reported, in minutes. */
export const RECENT_WINDOWS = [1, 5, 15] as const;

/** Counts by kind in each window; kinds with no event in 15 minutes are left out. */
export interface RecentCounts {
  refusals: Partial<Record<RefusalReason, WindowCounts>>;
  throttles: Partial<Record<Throttle, WindowCounts>>;
}

export interface WindowCounts {
  '1m': number;
  '5m': number;
  '15m': number;
}

const MINUTE_MS = 60_000;
/** The current minute and the 15 whole ones before it. */
const SLOTS = 16;
const REFUSAL_SET: ReadonlySet<string> = new Set(REFUSAL_REASONS);

interface Slot {
  /** Which minute (performance.now() / 60 s, floored) the counts are of. */
  minute: number;
  readonly counts: Map<RecentKind, number>;
}

export class RecentEvents {
  /** Allocated on the first event: most tunnels never see one. Invariant: SLOTS long once set; slot i holds a minute m with m % SLOTS === i. */
  private slots: Slot[] | undefined;

  constructor(private readonly now: () => number = () => performance.now()) {}

  add(kind: RecentKind, n = 1): void {
    const minute = Math.floor(this.now() / MINUTE_MS);
    this.slots ??= Array.from({ length: SLOTS }, () => ({ minute: -1, counts: new Map<RecentKind, number>() }));
    const slot = this.slots[minute % SLOTS];
    if (slot.minute !== minute) {
      slot.minute = minute;
      slot.counts.clear();
    }
    slot.counts.set(kind, (slot.counts.get(kind) ?? 0) + n);
  }

  /**
   * Window N counts the current minute and the N whole minutes before it, so
   * "1m" holds every event of the last 60 s and at most 60 s more.
   */
  counts(): RecentCounts {
    const out: RecentCounts = { refusals: {}, throttles: {} };
    if (!this.slots) return out;
    const minute = Math.floor(this.now() / MINUTE_MS);
    for (const slot of this.slots) {
      const age = minute - slot.minute;
      if (age < 0 || age > RECENT_WINDOWS[RECENT_WINDOWS.length - 1]) continue;
      for (const [kind, n] of slot.counts) {
        const into = REFUSAL_SET.has(kind) ? out.refusals : out.throttles;
        const w = ((into as Record<string, WindowCounts>)[kind] ??= { '1m': 0, '5m': 0, '15m': 0 });
        if (age <= 1) w['1m'] += n;
        if (age <= 5) w['5m'] += n;
        w['15m'] += n;
      }
    }
    return out;
  }
}

/** Several rings read as one (a server's process and its tenants; an agent's tunnels). */
export function addCounts(into: RecentCounts, from: RecentCounts): RecentCounts {
  for (const part of ['refusals', 'throttles'] as const) {
    const target = into[part] as Record<string, WindowCounts>;
    for (const [kind, w] of Object.entries(from[part] as Record<string, WindowCounts>)) {
      const t = (target[kind] ??= { '1m': 0, '5m': 0, '15m': 0 });
      t['1m'] += w['1m'];
      t['5m'] += w['5m'];
      t['15m'] += w['15m'];
    }
  }
  return into;
}
