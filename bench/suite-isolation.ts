/**
 * 4. Isolation: throughput of one connection while another connection on
 * the same tunnel has a stalled reader, as a ratio to its throughput alone,
 * and how much the server's and agent's RSS grow during the stall.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { bulkRun, kanalRss, measureReceive, openFlows, waitIdle, type Env } from './env.js';
import type { Row } from './report.js';
import { median } from './stats.js';

const MiB = 1024 * 1024;

const CASES = [
  { key: 'stalled-client', label: 'download, stalled client', measured: 'down', stalled: 'stall-client' },
  { key: 'stalled-backend', label: 'upload, stalled backend', measured: 'up', stalled: 'stall-backend' },
] as const;

export async function runIsolation(env: Env): Promise<Row[]> {
  const rows: Row[] = [];
  for (const c of CASES) {
    const alone: number[] = [];
    const stalled: number[] = [];
    const growth = { server: [] as number[], agent: [] as number[] };
    for (let rep = 0; rep < env.params.reps; rep++) {
      env.progress(`isolation ${c.label}: alone, run ${rep + 1}/${env.params.reps}`);
      alone.push((await bulkRun(env, 'kanal-cp', c.measured, 1)).bytesPerSec);

      env.progress(`isolation ${c.label}: next to a stalled connection, run ${rep + 1}/${env.params.reps}`);
      const base = kanalRss(env);
      const peak = { ...base };
      const sample = (): void => {
        const r = kanalRss(env);
        peak.server = Math.max(peak.server, r.server);
        peak.agent = Math.max(peak.agent, r.agent);
      };
      const stall = await openFlows(env, 'kanal-cp', c.stalled, 1);
      try {
        await sleep(env.params.stallFillMs); // the stalled connection fills its share of the tunnel
        sample();
        const measured = await openFlows(env, 'kanal-cp', c.measured, 1);
        try {
          const s = await measureReceive(env, c.measured === 'up', async () => {
            const end = Date.now() + env.params.measureMs;
            while (Date.now() < end) {
              sample();
              await sleep(100);
            }
          });
          stalled.push(s.bytesPerSec);
          sample();
        } finally {
          await measured.stop();
        }
      } finally {
        await stall.stop();
        // A stalled backend never reads, so it never sees the tunnel's FIN: release it.
        await env.backend.call('unstall', null);
        await waitIdle(env);
      }
      growth.server.push((peak.server - base.server) / MiB);
      growth.agent.push((peak.agent - base.agent) / MiB);
    }
    rows.push({
      id: `isolation.${c.key}`,
      section: 'isolation',
      label: `CP->node ${c.label}`,
      values: {
        aloneMbps: median(alone) / 1e6,
        stalledMbps: median(stalled) / 1e6,
        ratio: median(stalled.map((s, i) => s / alone[i]!)),
        serverGrowthMiB: Math.max(...growth.server),
        agentGrowthMiB: Math.max(...growth.agent),
      },
      signed: ['serverGrowthMiB', 'agentGrowthMiB'],
    });
  }
  return rows;
}
