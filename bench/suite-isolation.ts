/**
 * 4. Isolation: throughput of one connection while another connection on
 * the same tunnel has a stalled reader, as a ratio to its throughput alone,
 * and how much the server's and agent's RSS grow during the stall; Kanal's
 * and upstream's tunnels in turn.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { bulkRun, measureReceive, openFlows, pairOf, pairRss, restartUpstream, runnable, waitIdle, type Env } from './env.js';
import { productOf, type Path } from './loadgen-protocol.js';
import type { Row } from './report.js';
import { inRepOrder, median, medianRatio } from './stats.js';
import { errorMessage } from '../src/common/error-message.js';

const MiB = 1024 * 1024;

const CASES = [
  { key: 'stalled-client', label: 'download, stalled client', measured: 'down', stalled: 'stall-client' },
  { key: 'stalled-backend', label: 'upload, stalled backend', measured: 'up', stalled: 'stall-backend' },
] as const;

/** How long the proxy has to close the backend's ends once the client side is gone: 1-3 s by mode. */
const teardownMs = (env: Env): number => Math.min(3000, Math.max(1000, env.params.measureMs * 2.5));
const SETTLE_MS = 500;

interface Runs {
  alone: number[];
  stalled: number[];
  /** Runs in which the measured connection could not even open, or moved no byte. */
  blocked: number;
  /** Connections the proxy still held open teardownMs after their clients had gone (the bench then closed them). */
  leftOpen: number;
  growth: { server: number[]; agent: number[] };
}

/** One connection's throughput while another on the same tunnel stalls, and the pair's peak RSS growth meanwhile. */
async function nextToStall(env: Env, c: (typeof CASES)[number], path: Path, runs: Runs): Promise<void> {
  const pair = pairOf(env, productOf(path)!);
  const base = pairRss(pair);
  const peak = { ...base };
  const sample = (): void => {
    const r = pairRss(pair);
    peak.server = Math.max(peak.server, r.server);
    peak.agent = Math.max(peak.agent, r.agent);
  };
  const stall = await openFlows(env, path, c.stalled, 1);
  try {
    await sleep(env.params.stallFillMs); // the stalled connection fills its share of the tunnel
    sample();
    let bytesPerSec = 0;
    try {
      // Upstream's cannot open at all (its tunnel is blocked): give it as long as a measurement.
      const measured = await openFlows(env, path, c.measured, 1, Math.max(1000, env.params.measureMs));
      try {
        const s = await measureReceive(env, path, c.measured === 'up', async () => {
          const end = Date.now() + env.params.measureMs;
          while (Date.now() < end) {
            sample();
            await sleep(100);
          }
        });
        bytesPerSec = s.bytesPerSec;
      } finally {
        await measured.stop();
      }
    } catch (err) {
      runs.blocked++;
      env.progress(`isolation ${path} ${c.label}: blocked (${errorMessage(err).split('\n')[0]})`);
    }
    runs.stalled.push(bytesPerSec);
    sample();
  } finally {
    await stall.stop();
    // A stalled backend never reads, so it never sees the tunnel's FIN: release it.
    await env.backend.call('unstall', null);
    // A dial the blocked tunnel held back may reach the backend only now.
    await sleep(SETTLE_MS);
    if (!(await waitIdle(env, teardownMs(env), true))) {
      const [c, b] = await Promise.all([env.client.call('closeAll', null), env.backend.call('closeAll', null)]);
      runs.leftOpen += c.destroyed + b.destroyed;
      await waitIdle(env);
    }
  }
  runs.growth.server.push((peak.server - base.server) / MiB);
  runs.growth.agent.push((peak.agent - base.agent) / MiB);
}

export async function runIsolation(env: Env): Promise<Row[]> {
  const rows: Row[] = [];
  const paths = runnable(env, [{ path: 'kanal-cp' as const }, { path: 'upstream-cp' as const }]).map((p) => p.path);
  for (const c of CASES) {
    const runs = new Map<Path, Runs>(
      paths.map((p) => [p, { alone: [], stalled: [], blocked: 0, leftOpen: 0, growth: { server: [], agent: [] } }]),
    );
    for (let rep = 0; rep < env.params.reps; rep++) {
      for (const path of inRepOrder(paths, rep)) {
        const r = runs.get(path)!;
        env.progress(`isolation ${path} ${c.label}: alone, run ${rep + 1}/${env.params.reps}`);
        r.alone.push((await bulkRun(env, path, c.measured, 1)).bytesPerSec);
        env.progress(`isolation ${path} ${c.label}: next to a stalled connection, run ${rep + 1}/${env.params.reps}`);
        await nextToStall(env, c, path, r);
      }
    }
    // Upstream's tunnel went through a blocked phase: the next sections get a fresh pair.
    if (env.upstream) await restartUpstream(env);
    for (const path of paths) {
      const r = runs.get(path)!;
      const upstream = productOf(path) === 'upstream';
      rows.push({
        id: upstream ? `isolation.${c.key}.upstream` : `isolation.${c.key}`,
        section: 'isolation',
        label: `${upstream ? 'upstream' : 'Kanal'} CP->node ${c.label}`,
        values: {
          aloneMbps: median(r.alone) / 1e6,
          stalledMbps: median(r.stalled) / 1e6,
          ratio: medianRatio(r.stalled, r.alone),
          blockedRuns: r.blocked,
          leftOpen: r.leftOpen,
          serverGrowthMiB: Math.max(...r.growth.server),
          agentGrowthMiB: Math.max(...r.growth.agent),
        },
        signed: ['stalledMbps', 'ratio', 'blockedRuns', 'leftOpen', 'serverGrowthMiB', 'agentGrowthMiB'],
      });
    }
  }
  return rows;
}
