/** 2. Dial latency (idle, and next to a bulk flow) and short requests per second, Kanal vs the backend directly. */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Path } from './loadgen-protocol.js';
import { openFlows, waitIdle, type Env } from './env.js';
import type { Row } from './report.js';
import { median, percentile, spread } from './stats.js';

interface PathSpec {
  path: Path;
  key: string;
  label: string;
  baseline?: Path;
}

const PATHS: PathSpec[] = [
  { path: 'direct-tcp', key: 'direct-tcp', label: 'direct TCP' },
  { path: 'direct-tls', key: 'direct-tls', label: 'direct TLS' },
  { path: 'kanal-cp', key: 'cp-node', label: 'Kanal CP->node', baseline: 'direct-tcp' },
  { path: 'kanal-cp-tls', key: 'cp-node-tls', label: 'Kanal CP->node, TLS inside', baseline: 'direct-tls' },
  { path: 'kanal-node', key: 'node-cp', label: 'Kanal node->CP', baseline: 'direct-tcp' },
];

const labelOf = (path: Path): string => PATHS.find((p) => p.path === path)!.label;

function failuresWarning(env: Env, what: string, r: { errors: number; firstError?: string }): void {
  if (r.errors > 0) env.warnings.push(`${what}: ${r.errors} failure(s), first: ${r.firstError ?? '?'}`);
}

/** p50/p99 of pooled dial latencies, with ratios to the baseline's pooled percentiles when there is one. */
function latencyValues(s: number[], baseline?: number[]): Record<string, number> {
  const values: Record<string, number> = { p50Ms: percentile(s, 50), p99Ms: percentile(s, 99), samples: s.length };
  if (baseline) {
    values.ratioP50 = values.p50Ms! / percentile(baseline, 50);
    values.ratioP99 = values.p99Ms! / percentile(baseline, 99);
  }
  return values;
}

export async function runLatency(env: Env): Promise<Row[]> {
  const { reps, dials } = env.params;
  const perRep = Math.max(1, Math.ceil(dials / reps));
  const samples = new Map<Path, number[]>(PATHS.map((p) => [p.path, []]));
  for (const p of PATHS) await env.client.call('dials', { path: p.path, n: 5 }, 60_000); // warm-up, discarded
  for (let rep = 0; rep < reps; rep++) {
    for (const p of rep % 2 === 0 ? PATHS : [...PATHS].reverse()) {
      env.progress(`dial latency ${p.label}, run ${rep + 1}/${reps}`);
      const r = await env.client.call('dials', { path: p.path, n: perRep }, 300_000);
      failuresWarning(env, `dials ${p.label}`, r);
      samples.get(p.path)!.push(...r.latenciesMs);
    }
  }
  await waitIdle(env);
  return PATHS.map((p) => {
    const values = latencyValues(samples.get(p.path)!, p.baseline && samples.get(p.baseline));
    return { id: `latency.${p.key}`, section: 'latency' as const, label: p.label, values, baseline: p.baseline && labelOf(p.baseline) };
  });
}

const LOADED: { path: Path; key: string; label: string; load: Path; baseline?: string }[] = [
  { path: 'direct-tcp', key: 'direct-tcp', label: 'direct TCP', load: 'direct-tls' },
  { path: 'kanal-cp', key: 'cp-node', label: 'Kanal CP->node', load: 'kanal-cp', baseline: 'direct TCP' },
  { path: 'kanal-node', key: 'node-cp', label: 'Kanal node->CP', load: 'kanal-cp', baseline: 'direct TCP' },
];

/**
 * Dial latency while one bulk download runs: for Kanal through the same
 * tunnel, so every DIAL_REQ/DIAL_RSP and first byte queues behind that
 * flow's data in flight (what its window lets it have); the baseline dials
 * direct TCP while a direct TLS flow keeps the same cores busy.
 */
export async function runLoadedLatency(env: Env): Promise<Row[]> {
  const { reps, dials, warmupMs } = env.params;
  const perRep = Math.max(1, Math.ceil(dials / reps));
  const samples = new Map<string, number[]>(LOADED.map((c) => [c.key, []]));
  const bulk = new Map<string, number[]>(LOADED.map((c) => [c.key, []]));
  for (let rep = 0; rep < reps; rep++) {
    for (const c of rep % 2 === 0 ? LOADED : [...LOADED].reverse()) {
      env.progress(`dial latency next to a bulk flow: ${c.label}, run ${rep + 1}/${reps}`);
      const flow = await openFlows(env, c.load, 'down', 1);
      try {
        await sleep(warmupMs); // the flow is up to speed and its window has grown
        const rx0 = await env.client.call('counters', null);
        const r = await env.client.call('dials', { path: c.path, n: perRep }, 300_000);
        const rx1 = await env.client.call('counters', null);
        failuresWarning(env, `dials next to a bulk flow ${c.label}`, r);
        samples.get(c.key)!.push(...r.latenciesMs);
        bulk.get(c.key)!.push(((rx1.rx - rx0.rx) * 1000) / Math.max(1, rx1.t - rx0.t));
      } finally {
        await flow.stop();
        await waitIdle(env);
      }
    }
  }
  const direct = samples.get('direct-tcp')!;
  return LOADED.map((c) => {
    const values = { ...latencyValues(samples.get(c.key)!, c.baseline ? direct : undefined), bulkMbps: median(bulk.get(c.key)!) / 1e6 };
    return { id: `loaded.${c.key}`, section: 'loaded' as const, label: c.label, values, baseline: c.baseline };
  });
}

export async function runRequests(env: Env): Promise<Row[]> {
  const { reps, requestMs, requestConcurrency } = env.params;
  const concurrencies = [1, requestConcurrency];
  const rps = new Map<string, number[]>();
  const counts = new Map<string, number>();
  const key = (path: Path, c: number): string => `${path}/${c}`;
  for (let rep = 0; rep < reps; rep++) {
    for (const c of concurrencies) {
      for (const p of rep % 2 === 0 ? PATHS : [...PATHS].reverse()) {
        env.progress(`requests ${p.label} concurrency ${c}, run ${rep + 1}/${reps}`);
        const r = await env.client.call('requests', { path: p.path, concurrency: c, durationMs: requestMs, maxRequests: Math.ceil(requestMs * 30) }, 120_000);
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
    for (const p of PATHS) {
      const s = rps.get(key(p.path, c))!;
      const values: Record<string, number> = { rps: median(s), spread: spread(s), requests: counts.get(key(p.path, c))! };
      if (p.baseline) {
        const b = rps.get(key(p.baseline, c))!;
        values.ratio = median(s.map((x, i) => x / b[i]!));
      }
      rows.push({
        id: `requests.${p.key}.c${c}`,
        section: 'requests',
        label: `${p.label.padEnd(26)} ${c === 1 ? 'sequential' : `concurrency ${c}`}`,
        values,
        signed: ['spread'],
        baseline: p.baseline && labelOf(p.baseline),
        runs: s.map((x) => Math.round(x)),
      });
    }
  }
  return rows;
}
