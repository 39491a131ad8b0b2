/**
 * The `nodejs_eventloop_lag_*` gauges, under prom-client's names and help,
 * measured so that they read what the loop was late by.
 *
 * prom-client feeds them from `monitorEventLoopDelay({ resolution })`, whose
 * histogram records the time between two firings of a repeating libuv timer,
 * i.e. the resolution plus the lateness (Node's src/histogram.cc,
 * `ELDHistogram::OnInterval` -> `RecordDelta`): an idle process reads the
 * resolution itself. Kanal samples every SAMPLE_MS instead of prom-client's
 * 10 ms (a 10 ms timer woke an idle process 100 times a second:
 * bench/notes/dial-profile.md finding 6), so the offset is large; this
 * module subtracts it.
 *
 * What a timer can see: a block longer than SAMPLE_MS always holds one
 * firing and reads between (block - SAMPLE_MS) and block; a shorter one
 * reads only if a firing falls inside it (docs/metrics.md).
 */
import { monitorEventLoopDelay, type IntervalHistogram } from 'node:perf_hooks';
import { setImmediate as nextTurn } from 'node:timers/promises';
import { Gauge, type Registry } from './prom-client.js';

/** 10 wake-ups a second (upstream's idle Go processes wake 0-11 times); about 0.3 ms of CPU a second (docs/metrics.md). */
export const SAMPLE_MS = 100;

/** The names prom-client's own event-loop-lag collector registers; KanalMetrics removes them before registering these. */
export const EVENT_LOOP_LAG_NAMES = [
  'nodejs_eventloop_lag_seconds',
  'nodejs_eventloop_lag_min_seconds',
  'nodejs_eventloop_lag_max_seconds',
  'nodejs_eventloop_lag_mean_seconds',
  'nodejs_eventloop_lag_stddev_seconds',
  'nodejs_eventloop_lag_p50_seconds',
  'nodejs_eventloop_lag_p90_seconds',
  'nodejs_eventloop_lag_p99_seconds',
] as const;

/**
 * One sampler for the process, started on first use: a second registry in
 * the same process (tests run several servers) shares its timer, and each
 * scrape reads and resets the window since the previous one, as prom-client's.
 */
let sampler: IntervalHistogram | undefined;

function processSampler(): IntervalHistogram {
  if (!sampler) {
    sampler = monitorEventLoopDelay({ resolution: SAMPLE_MS });
    sampler.enable();
  }
  return sampler;
}

/** Nanoseconds between firings, as the histogram holds them, to seconds late (never below 0: libuv's clock is in whole ms). */
const lateSeconds = (ns: number): number => Math.max(0, ns - SAMPLE_MS * 1e6) / 1e9;

interface Window {
  min: number;
  max: number;
  mean: number;
  stddev: number;
  p50: number;
  p90: number;
  p99: number;
}

/** What the loop was late by since the last read (all 0 when no firing was recorded), and a new window. */
function takeWindow(h: IntervalHistogram): Window {
  const w =
    h.count === 0
      ? { min: 0, max: 0, mean: 0, stddev: 0, p50: 0, p90: 0, p99: 0 }
      : {
          min: lateSeconds(h.min),
          max: lateSeconds(h.max),
          mean: lateSeconds(h.mean),
          stddev: h.stddev / 1e9,
          p50: lateSeconds(h.percentile(50)),
          p90: lateSeconds(h.percentile(90)),
          p99: lateSeconds(h.percentile(99)),
        };
  h.reset();
  return w;
}

/** Registers the eight gauges on `registry`; they are read from the process's sampler at scrape time. */
export function registerEventLoopLag(registry: Registry): void {
  const registers = [registry];
  const h = processSampler();
  // Registered first, as prom-client does: a scrape calls each gauge's get() in registration order, and
  // this collect sets the seven below before their get() reads them.
  new Gauge({
    name: 'nodejs_eventloop_lag_seconds',
    help: 'Lag of event loop in seconds.',
    registers,
    aggregator: 'average',
    async collect() {
      const w = takeWindow(h);
      for (const key of Object.keys(stats) as (keyof Window)[]) stats[key].set(w[key]);
      // Its own reading, as prom-client's: how long a callback queued now waits for its turn.
      const start = process.hrtime.bigint();
      await nextTurn();
      this.set(Number(process.hrtime.bigint() - start) / 1e9);
    },
  });
  const gauge = (name: (typeof EVENT_LOOP_LAG_NAMES)[number], help: string, aggregator: 'min' | 'max' | 'average'): Gauge =>
    new Gauge({ name, help, registers, aggregator });
  const stats: Record<keyof Window, Gauge> = {
    min: gauge('nodejs_eventloop_lag_min_seconds', 'The minimum recorded event loop delay.', 'min'),
    max: gauge('nodejs_eventloop_lag_max_seconds', 'The maximum recorded event loop delay.', 'max'),
    mean: gauge('nodejs_eventloop_lag_mean_seconds', 'The mean of the recorded event loop delays.', 'average'),
    stddev: gauge('nodejs_eventloop_lag_stddev_seconds', 'The standard deviation of the recorded event loop delays.', 'average'),
    p50: gauge('nodejs_eventloop_lag_p50_seconds', 'The 50th percentile of the recorded event loop delays.', 'average'),
    p90: gauge('nodejs_eventloop_lag_p90_seconds', 'The 90th percentile of the recorded event loop delays.', 'average'),
    p99: gauge('nodejs_eventloop_lag_p99_seconds', 'The 99th percentile of the recorded event loop delays.', 'average'),
  };
}
