/** 2. Dial latency (idle, and next to a bulk flow) and short requests per second: Kanal, upstream, the backend directly. */
import { setTimeout as sleep } from 'node:timers/promises';
import { productOf, type Path } from './loadgen-protocol.js';
import { openFlows, proxyPids, runnable, waitIdle, withFreshPair, type Env } from './env.js';
import { cpuSecondsOf } from './proc.js';
import type { Row } from './report.js';
import { inRepOrder, median, medianRatio, percentile, spread } from './stats.js';

interface PathSpec {
  path: Path;
  key: string;
  label: string;
  baseline?: Path;
  /** Upstream's path this Kanal path is compared with. */
  upstream?: Path;
}

const ALL_PATHS: PathSpec[] = [
  { path: 'direct-tcp', key: 'direct-tcp', label: 'direct TCP' },
  { path: 'direct-tls', key: 'direct-tls', label: 'direct TLS' },
  { path: 'kanal-cp', key: 'cp-node', label: 'Kanal CP->node', baseline: 'direct-tcp', upstream: 'upstream-cp' },
  { path: 'upstream-cp', key: 'upstream-cp-node', label: 'upstream CP->node', baseline: 'direct-tcp' },
  { path: 'kanal-cp-tls', key: 'cp-node-tls', label: 'Kanal CP->node, TLS inside', baseline: 'direct-tls', upstream: 'upstream-cp-tls' },
  { path: 'upstream-cp-tls', key: 'upstream-cp-node-tls', label: 'upstream CP->node, TLS inside', baseline: 'direct-tls' },
  { path: 'kanal-node', key: 'node-cp', label: 'Kanal node->CP', baseline: 'direct-tcp' },
];

const labelOf = (path: Path): string => ALL_PATHS.find((p) => p.path === path)!.label;

function failuresWarning(env: Env, what: string, r: { errors: number; firstError?: string }): void {
  if (r.errors > 0) env.warnings.push(`${what}: ${r.errors} failure(s), first: ${r.firstError ?? '?'}`);
}

/** One path's dials: the latencies of each repetition, and that repetition's dials per second. */
interface DialRuns {
  latencies: number[][];
  rates: number[];
  /** CPU seconds of the proxy's server and agent over all repetitions (teardown included). */
  cpuS: number;
}

const emptyRuns = (): DialRuns => ({ latencies: [], rates: [], cpuS: 0 });

/**
 * `n` dials along `path`, `concurrency` at a time, added to `into`; the
 * proxy's CPU is read once every connection of the batch is torn down.
 */
async function dialBatch(env: Env, path: Path, n: number, concurrency: number, into: DialRuns, what: string): Promise<void> {
  const pids = proxyPids(env, path);
  const cpu0 = cpuSecondsOf(pids);
  const r = await env.client.call('dials', { path, n, concurrency }, 600_000);
  await waitIdle(env);
  into.cpuS += cpuSecondsOf(pids) - cpu0;
  failuresWarning(env, what, r);
  into.latencies.push(r.latenciesMs);
  into.rates.push((r.latenciesMs.length * 1000) / r.elapsedMs);
}

const pooled = (r: DialRuns): number[] => r.latencies.flat();

/**
 * p50/p99 of pooled dial latencies and the spread of the per-repetition
 * percentiles, with ratios of pooled percentiles to the baseline's and to
 * upstream's when there are those.
 */
function latencyValues(r: DialRuns, baseline?: DialRuns, upstream?: DialRuns): Record<string, number> {
  const s = pooled(r);
  const values: Record<string, number> = {
    p50Ms: percentile(s, 50),
    p99Ms: percentile(s, 99),
    p50Spread: spread(r.latencies.map((x) => percentile(x, 50))),
    p99Spread: spread(r.latencies.map((x) => percentile(x, 99))),
    samples: s.length,
  };
  if (baseline) {
    values.ratioP50 = values.p50Ms / percentile(pooled(baseline), 50);
    values.ratioP99 = values.p99Ms / percentile(pooled(baseline), 99);
  }
  if (upstream) {
    values.vsUpstreamP50 = values.p50Ms / percentile(pooled(upstream), 50);
    values.vsUpstreamP99 = values.p99Ms / percentile(pooled(upstream), 99);
  }
  return values;
}

/** CPU µs per dial of the proxy (server + agent), with the ratio to upstream's; nothing for the direct paths. */
function cpuValues(path: Path, r: DialRuns, upstream?: DialRuns): Record<string, number> {
  if (!productOf(path)) return {};
  const values: Record<string, number> = { cpuUsPerDial: (r.cpuS * 1e6) / pooled(r).length };
  // CPU comes in 10 ms ticks: a short run may have none on either side, and then no ratio.
  if (upstream && upstream.cpuS > 0 && r.cpuS > 0)
    values.vsUpstreamCpu = values.cpuUsPerDial / ((upstream.cpuS * 1e6) / pooled(upstream).length);
  return values;
}

/**
 * Dial latency and dials per second of every path, sequential (one dial at a
 * time) and `dialConcurrency` at a time.
 */
export async function runLatency(env: Env): Promise<Row[]> {
  const { reps, dials, dialConcurrency } = env.params;
  const paths = runnable(env, ALL_PATHS);
  const perRep = Math.max(1, Math.ceil(dials / reps));
  const concurrencies = [1, dialConcurrency];
  const runs = new Map<string, DialRuns>();
  const key = (path: Path, c: number): string => `${path}/${c}`;
  const rows = await runColdDials(env);
  // Warm-up, discarded: timed dials should meet optimised code, not V8 still tiering up.
  for (const p of paths) {
    const n = p.path === 'kanal-cp' ? env.params.dialWarmup : Math.ceil(env.params.dialWarmup / 5);
    env.progress(`dial warm-up: ${n} dials ${p.label}`);
    await env.client.call('dials', { path: p.path, n, concurrency: 1 }, 600_000);
  }
  await waitIdle(env);
  for (let rep = 0; rep < reps; rep++) {
    for (const c of concurrencies) {
      for (const p of inRepOrder(paths, rep)) {
        env.progress(`dial latency ${p.label}, ${c === 1 ? 'sequential' : `${c} at a time`}, run ${rep + 1}/${reps}`);
        const k = key(p.path, c);
        const d = runs.get(k) ?? emptyRuns();
        runs.set(k, d);
        await dialBatch(env, p.path, perRep, c, d, `dials ${p.label} c=${c}`);
      }
    }
  }
  for (const c of concurrencies) {
    for (const p of paths) {
      const r = runs.get(key(p.path, c))!;
      const up = p.upstream && runs.get(key(p.upstream, c));
      const values: Record<string, number> = {
        ...latencyValues(r, p.baseline && runs.get(key(p.baseline, c)), up),
        ...cpuValues(p.path, r, up),
        dialsPerS: median(r.rates),
        rateSpread: spread(r.rates),
      };
      if (up) values.vsUpstreamRate = medianRatio(r.rates, up.rates);
      rows.push({
        id: c === 1 ? `latency.${p.key}` : `latency.${p.key}.c${c}`,
        section: 'latency',
        label: `${p.label.padEnd(29)} ${c === 1 ? 'sequential' : `${c} at a time`}`,
        values,
        signed: ['p50Spread', 'p99Spread', 'rateSpread'],
        baseline: p.baseline && labelOf(p.baseline),
      });
    }
  }
  return rows;
}

/**
 * The first `coldDials` dials through a freshly started pair of each product,
 * sequential: what a restarted server and agent cost until V8 has optimised
 * the dial path (upstream's Go is compiled ahead of time). One run each.
 */
async function runColdDials(env: Env): Promise<Row[]> {
  const cases = runnable(env, [
    { path: 'kanal-cp' as const, key: 'cp-node', label: 'Kanal CP->node' },
    { path: 'upstream-cp' as const, key: 'upstream-cp-node', label: 'upstream CP->node' },
  ]);
  const runs = new Map<Path, DialRuns>();
  for (const c of cases) {
    const product = productOf(c.path)!;
    await withFreshPair(env, product, `cold-${product}`, async (fresh) => {
      env.progress(`dial latency ${c.label}: the first ${env.params.coldDials} dials after start`);
      const r = emptyRuns();
      await dialBatch(fresh, c.path, env.params.coldDials, 1, r, `cold dials ${c.label}`);
      runs.set(c.path, r);
    });
  }
  const up = runs.get('upstream-cp');
  return cases.map((c) => {
    const r = runs.get(c.path)!;
    const upstream = c.path === 'kanal-cp' ? up : undefined;
    const values: Record<string, number> = {
      ...latencyValues(r, undefined, upstream),
      ...cpuValues(c.path, r, upstream),
      dialsPerS: median(r.rates),
    };
    if (upstream) values.vsUpstreamRate = medianRatio(r.rates, upstream.rates);
    return {
      id: `latency.${c.key}.cold`,
      section: 'latency' as const,
      label: `${c.label.padEnd(29)} first ${env.params.coldDials} after start`,
      values,
      signed: ['p50Spread', 'p99Spread'],
    };
  });
}

const LOADED: { path: Path; key: string; label: string; load: Path; baseline?: Path; upstream?: Path }[] = [
  { path: 'direct-tcp', key: 'direct-tcp', label: 'direct TCP', load: 'direct-tls' },
  { path: 'kanal-cp', key: 'cp-node', label: 'Kanal CP->node', load: 'kanal-cp', baseline: 'direct-tcp', upstream: 'upstream-cp' },
  { path: 'upstream-cp', key: 'upstream-cp-node', label: 'upstream CP->node', load: 'upstream-cp', baseline: 'direct-tcp' },
  { path: 'kanal-node', key: 'node-cp', label: 'Kanal node->CP', load: 'kanal-cp', baseline: 'direct-tcp' },
];

/**
 * Dial latency while one bulk download runs: for a proxy through the same
 * tunnel, so every DIAL_REQ/DIAL_RSP and first byte queues behind that
 * flow's data in flight (what its window lets it have); the baseline dials
 * direct TCP while a direct TLS flow keeps the same cores busy.
 */
export async function runLoadedLatency(env: Env): Promise<Row[]> {
  const { reps, dials, warmupMs } = env.params;
  const cases = runnable(env, LOADED);
  const perRep = Math.max(1, Math.ceil(dials / reps));
  const runs = new Map<Path, DialRuns>(cases.map((c) => [c.path, emptyRuns()]));
  const bulk = new Map<Path, number[]>(cases.map((c) => [c.path, []]));
  for (let rep = 0; rep < reps; rep++) {
    for (const c of inRepOrder(cases, rep)) {
      env.progress(`dial latency next to a bulk flow: ${c.label}, run ${rep + 1}/${reps}`);
      const flow = await openFlows(env, c.load, 'down', 1);
      try {
        await sleep(warmupMs); // the flow is up to speed and its window has grown
        const rx0 = await env.client.call('counters', null);
        const r = await env.client.call('dials', { path: c.path, n: perRep, concurrency: 1 }, 300_000);
        const rx1 = await env.client.call('counters', null);
        failuresWarning(env, `dials next to a bulk flow ${c.label}`, r);
        runs.get(c.path)!.latencies.push(r.latenciesMs);
        runs.get(c.path)!.rates.push((r.latenciesMs.length * 1000) / r.elapsedMs);
        bulk.get(c.path)!.push(((rx1.rx - rx0.rx) * 1000) / Math.max(1, rx1.t - rx0.t));
      } finally {
        await flow.stop();
        await waitIdle(env);
      }
    }
  }
  return cases.map((c) => {
    const values = {
      ...latencyValues(runs.get(c.path)!, c.baseline && runs.get(c.baseline), c.upstream && runs.get(c.upstream)),
      bulkMbps: median(bulk.get(c.path)!) / 1e6,
    };
    return {
      id: `loaded.${c.key}`,
      section: 'loaded' as const,
      label: c.label,
      values,
      signed: ['p50Spread', 'p99Spread'],
      baseline: c.baseline && labelOf(c.baseline),
    };
  });
}

export async function runRequests(env: Env): Promise<Row[]> {
  const { reps, requestMs, requestConcurrency } = env.params;
  const paths = runnable(env, ALL_PATHS);
  const concurrencies = [1, requestConcurrency];
  const rps = new Map<string, number[]>();
  const counts = new Map<string, number>();
  const key = (path: Path, c: number): string => `${path}/${c}`;
  for (let rep = 0; rep < reps; rep++) {
    for (const c of concurrencies) {
      for (const p of inRepOrder(paths, rep)) {
        env.progress(`requests ${p.label} concurrency ${c}, run ${rep + 1}/${reps}`);
        const r = await env.client.call(
          'requests',
          { path: p.path, concurrency: c, durationMs: requestMs, maxRequests: Math.ceil(requestMs * 30) },
          120_000,
        );
        failuresWarning(env, `requests ${p.label} c=${c}`, r);
        if (r.completed === 0) throw new Error(`requests ${p.label}: none completed (${r.firstError ?? 'no error'})`);
        const k = key(p.path, c);
        rps.set(k, [...(rps.get(k) ?? []), (r.completed * 1000) / r.elapsedMs]);
        counts.set(k, (counts.get(k) ?? 0) + r.completed);
        await waitIdle(env);
      }
    }
  }
  const rows: Row[] = [];
  for (const c of concurrencies) {
    for (const p of paths) {
      const s = rps.get(key(p.path, c))!;
      const values: Record<string, number> = { rps: median(s), spread: spread(s), requests: counts.get(key(p.path, c))! };
      if (p.baseline) values.ratio = medianRatio(s, rps.get(key(p.baseline, c))!);
      const up = p.upstream && rps.get(key(p.upstream, c));
      if (up) values.vsUpstream = medianRatio(s, up);
      rows.push({
        id: `requests.${p.key}.c${c}`,
        section: 'requests',
        label: `${p.label.padEnd(29)} ${c === 1 ? 'sequential' : `concurrency ${c}`}`,
        values,
        signed: ['spread'],
        baseline: p.baseline && labelOf(p.baseline),
        runs: s.map((x) => Math.round(x)),
      });
    }
  }
  return rows;
}
