/**
 * nodejs_eventloop_lag_* read what the event loop was late by (docs/metrics.md),
 * on the real server and agent processes: near 0 when idle (prom-client's
 * gauges read their sampling interval there), and a loop held for 300 ms
 * (the process stopped with SIGSTOP: its loop runs nothing meanwhile, as
 * under a blocking callback) shows in the max of the next scrape.
 */
import test from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { SAMPLE_MS } from '../../src/domain/event-loop-lag.js';
import { makeWorkspace, scrapeMetrics, startAgent, startServer, type KanalProcess } from '../helpers/kanal-processes.js';

const BLOCK_MS = 300;
/** An idle loop's lateness is scheduling noise; a shared 2-core test machine gets tens of ms, never the 100 ms interval. */
const IDLE_MAX_SECONDS = 0.08;

/** Short name -> gauge. */
const LAG = {
  now: 'nodejs_eventloop_lag_seconds',
  min: 'nodejs_eventloop_lag_min_seconds',
  max: 'nodejs_eventloop_lag_max_seconds',
  mean: 'nodejs_eventloop_lag_mean_seconds',
  stddev: 'nodejs_eventloop_lag_stddev_seconds',
  p50: 'nodejs_eventloop_lag_p50_seconds',
  p90: 'nodejs_eventloop_lag_p90_seconds',
  p99: 'nodejs_eventloop_lag_p99_seconds',
} as const;

/** The lag gauges of one scrape (NaN for one that is missing). */
async function lag(healthPort: number): Promise<Record<keyof typeof LAG, number>> {
  const m = await scrapeMetrics(healthPort);
  const read = (k: keyof typeof LAG): number => m.get(LAG[k]) ?? NaN;
  return {
    now: read('now'),
    min: read('min'),
    max: read('max'),
    mean: read('mean'),
    stddev: read('stddev'),
    p50: read('p50'),
    p90: read('p90'),
    p99: read('p99'),
  };
}

/** Stops `p` for `ms`, then lets it run on (even if the wait throws: a stopped child would outlive the test's cleanup). */
async function hold(p: KanalProcess, ms: number): Promise<void> {
  process.kill(p.pid, 'SIGSTOP');
  try {
    await sleep(ms);
  } finally {
    process.kill(p.pid, 'SIGCONT');
  }
}

test('server and agent: an idle loop reads near 0 s of lag, a loop held 300 ms reads it in max', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: ['--log-level', 'info'] });
  const agent = await startAgent(t, ws, server, { extraArgs: ['--log-level', 'info'] });
  for (const [name, p] of [
    ['server', server],
    ['agent', agent],
  ] as const) {
    await lag(p.healthPort); // ends the window that holds start-up
    await sleep(1000);
    const idle = await lag(p.healthPort);
    t.true(
      Object.values(idle).every((v) => Number.isFinite(v) && v >= 0),
      `${name}: every lag gauge is there, a number of at least 0: ${JSON.stringify(idle)}`,
    );
    t.true(idle.max < IDLE_MAX_SECONDS, `${name} idle: max ${idle.max} s, want below ${IDLE_MAX_SECONDS} s`);
    t.true(idle.p50 < IDLE_MAX_SECONDS && idle.mean < IDLE_MAX_SECONDS, `${name} idle: ${JSON.stringify(idle)}`);

    await sleep(3 * SAMPLE_MS); // a few firings on time before the hold
    await hold(p, BLOCK_MS);
    const held = await lag(p.healthPort);
    // A firing falls inside any hold longer than the interval; it reads the part of the hold after it.
    const least = (BLOCK_MS - SAMPLE_MS) / 1000;
    t.true(held.max >= least && held.max < 2, `${name} held ${BLOCK_MS} ms: max ${held.max} s, want ${least} s to 2 s`);
    t.true(held.min < IDLE_MAX_SECONDS, `${name}: the firings around the hold were on time: min ${held.min} s`);

    const after = await lag(p.healthPort);
    t.true(after.max < IDLE_MAX_SECONDS, `${name}: the next window starts afresh: max ${after.max} s`);
  }
});
