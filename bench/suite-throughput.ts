/** 1. Bulk throughput, both directions of a tunnelled connection, 1 and 8 flows, upload and download. */
import type { Path } from './loadgen-protocol.js';
import { bulkRun, runnable, type Env, type FlowSample } from './env.js';
import type { Row } from './report.js';
import { inRepOrder, median, medianRatio, spread } from './stats.js';

/** The baseline (direct TLS) first; `upstream` names the row a Kanal row is compared with. */
const ALL_PATHS: { path: Path; key: string; label: string; upstream?: Path }[] = [
  { path: 'direct-tls', key: 'direct-tls', label: 'direct TLS' },
  { path: 'kanal-cp', key: 'cp-node', label: 'Kanal CP->node', upstream: 'upstream-cp' },
  { path: 'upstream-cp', key: 'upstream-cp-node', label: 'upstream CP->node' },
  { path: 'kanal-node', key: 'node-cp', label: 'Kanal node->CP' },
];

export async function runThroughput(env: Env, flowCounts: number[] = [1, 8]): Promise<Row[]> {
  const PATHS = runnable(env, ALL_PATHS);
  const cases: { mode: 'up' | 'down'; flows: number }[] = [];
  for (const mode of ['up', 'down'] as const) for (const flows of flowCounts) cases.push({ mode, flows });
  // samples[case][path] = one sample per rep
  const samples = cases.map(() => PATHS.map(() => [] as FlowSample[]));
  // Untimed warm-up of every proxied path and direction, so JIT compilation lands in no run.
  const warm: Env = { ...env, params: { ...env.params, warmupMs: 100, measureMs: Math.min(300, env.params.measureMs) } };
  for (const p of env.params.bulkWarmupRuns > 0 ? PATHS.slice(1) : []) {
    for (const mode of ['up', 'down'] as const) {
      env.progress(`throughput warm-up ${p.label} ${mode}`);
      await bulkRun(warm, p.path, mode, 1);
    }
  }
  for (let rep = 0; rep < env.params.reps; rep++) {
    for (const [ci, c] of cases.entries()) {
      for (const pi of inRepOrder(
        PATHS.map((_, i) => i),
        rep,
      )) {
        const p = PATHS[pi];
        env.progress(`throughput ${p.label} ${c.mode} ${c.flows} flow(s), run ${rep + 1}/${env.params.reps}`);
        samples[ci][pi].push(await bulkRun(env, p.path, c.mode, c.flows));
      }
    }
  }
  const rows: Row[] = [];
  for (const [ci, c] of cases.entries()) {
    const direct = samples[ci][0];
    for (const [pi, p] of PATHS.entries()) {
      const s = samples[ci][pi];
      const rates = s.map((x) => x.bytesPerSec);
      const isDirect = pi === 0;
      const values: Record<string, number> = {
        mbps: median(rates) / 1e6,
        gbps: (median(rates) * 8) / 1e9,
        spread: spread(rates),
        endpointCpuSPerGB: median(s.map((x) => x.endpointCpuSPerGB)),
      };
      if (!isDirect) {
        values.ratio = medianRatio(
          rates,
          direct.map((x) => x.bytesPerSec),
        );
        const cpu = s.map((x) => x.proxyCpuSPerGB);
        values.proxyCpuSPerGB = median(cpu);
        values.proxyCpuSpread = spread(cpu);
      }
      const up = p.upstream && PATHS.findIndex((q) => q.path === p.upstream);
      if (up !== undefined && up >= 0) {
        const u = samples[ci][up];
        values.vsUpstream = medianRatio(
          rates,
          u.map((x) => x.bytesPerSec),
        );
        values.cpuVsUpstream = medianRatio(
          s.map((x) => x.proxyCpuSPerGB),
          u.map((x) => x.proxyCpuSPerGB),
        );
      }
      rows.push({
        id: `throughput.${p.key}.${c.mode}.${c.flows}`,
        section: 'throughput',
        label: `${p.label.padEnd(17)} ${c.mode === 'up' ? 'upload  ' : 'download'} ${c.flows} flow${c.flows > 1 ? 's' : ''}`,
        values,
        signed: ['spread', 'proxyCpuSpread'],
        baseline: isDirect ? undefined : 'direct TLS',
        runs: rates.map((r) => Math.round(r / 1e5) / 10),
      });
    }
  }
  return rows;
}
