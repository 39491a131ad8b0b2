/**
 * `npm run build && node dist/bench/resume-profile.js [options]`: what resume
 * costs the sending side of bulk flows, resume on (`--resume-timeout=30s`)
 * against off (`0s`), this build and optionally another (`--compare`).
 *
 * One fresh pair per case (CP -> node, 1 and 8 flows, download and upload)
 * under `node --cpu-prof`, builds and settings interleaved over `--rounds`:
 * MB/s, proxy CPU per GB, and per process the GC share of its busy samples
 * in the measured window and the share spent copying (`Buffer.prototype.copy`,
 * where unacknowledged bytes go into the slabs: src/tunnel/resend-buffer.ts).
 * The shares are ratios within one process's samples, so a busy machine
 * moves them far less than the rates (bench/RESULTS.md, 2026-12-02).
 */
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { setTimeout as sleep } from 'node:timers/promises';
import { cleanUp } from './children.js';
import { measureReceive, openFlows, setUp, waitIdle, withFreshPair, type Env } from './env.js';
import { PARAMS } from './params.js';
import { summariseProfile } from './profile.js';
import { median } from './stats.js';

const USAGE = `usage: node dist/bench/resume-profile.js [--rounds R] [--measure-ms MS] [--cases LIST] [--compare DIR]
  --rounds R       interleaved rounds (default 2)
  --measure-ms MS  measured window per case (default 4000, after 700 ms of warm-up)
  --cases LIST     comma-separated down1,up1,down8,up8 (default all four)
  --compare DIR    also run the Kanal CLI of DIR/dist (another checkout, built) in the same rounds`;

interface CpuProfileNode {
  id: number;
  callFrame: { functionName: string };
  children?: number[];
}

/** Share of busy samples under Buffer.prototype.copy (Node's copyImpl and _copyActual, and the native copy below them). */
function copyShare(file: string): number {
  const prof = JSON.parse(fs.readFileSync(file, 'utf8')) as { nodes: CpuProfileNode[]; samples: number[] };
  const byId = new Map(prof.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of prof.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  let busy = 0;
  let copy = 0;
  for (const s of prof.samples) {
    if (byId.get(s)?.callFrame.functionName === '(idle)') continue;
    busy++;
    let q: number | undefined = s;
    for (let depth = 0; depth < 4 && q !== undefined; depth++) {
      const name = byId.get(q)?.callFrame.functionName;
      if (name === 'copyImpl' || name === '_copyActual') {
        copy++;
        break;
      }
      q = parent.get(q);
    }
  }
  return busy > 0 ? copy / busy : 0;
}

interface Cell {
  mbps: number[];
  cpuSPerGB: number[];
  senderGc: number[];
  senderCopy: number[];
  receiverGc: number[];
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      rounds: { type: 'string', default: '2' },
      'measure-ms': { type: 'string', default: '4000' },
      cases: { type: 'string', default: 'down1,up1,down8,up8' },
      compare: { type: 'string' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(USAGE);
    return;
  }
  const rounds = Number(values.rounds);
  const measureMs = Number(values['measure-ms']);
  const cases = values.cases.split(',').map((c) => {
    const m = /^(up|down)(\d+)$/.exec(c.trim());
    if (!m) throw new Error(`--cases: ${c} is not up<N> or down<N>`);
    return { name: c.trim(), mode: m[1] as 'up' | 'down', flows: Number(m[2]) };
  });
  const builds: { label: string; cli: string | undefined }[] = [{ label: 'this build', cli: undefined }];
  if (values.compare) builds.push({ label: values.compare, cli: path.resolve(values.compare, 'dist/src/cli/main.js') });
  const settings = [
    { label: 'on', flag: '--resume-timeout=30s' },
    { label: 'off', flag: '--resume-timeout=0s' },
  ];
  const warnings: string[] = [];
  const params = { ...PARAMS.quick, warmupMs: 700, measureMs };
  const env: Env = await setUp({
    transport: 'h2',
    params,
    audit: false,
    upstreamOption: 'none',
    warnings,
    progress: (t) => console.error(`# ${t}`),
  });
  const cells = new Map<string, Cell>();
  const nowUs = (): number => Number(process.hrtime.bigint() / 1000n);
  let n = 0;
  try {
    for (let round = 0; round < rounds; round++)
      for (const c of cases)
        for (const b of round % 2 ? [...builds].reverse() : builds)
          for (const s of round % 2 ? [...settings].reverse() : settings) {
            const profDir = path.join(env.dir, `resume-profile-${n++}`);
            fs.mkdirSync(profDir);
            const window: [number, number] = [0, 0];
            console.error(`# round ${round + 1}: ${c.name}, ${b.label}, resume ${s.label}`);
            const r = await withFreshPair(
              { ...env, kanalCli: b.cli },
              'kanal',
              `resume-${n}`,
              async (fresh) => {
                const run = await openFlows(fresh, 'kanal-cp', c.mode, c.flows);
                try {
                  const sample = await measureReceive(fresh, 'kanal-cp', c.mode === 'up', async () => {
                    window[0] = nowUs();
                    await sleep(measureMs);
                    window[1] = nowUs();
                  });
                  return { sample, pids: { server: fresh.pair.server.pid, agent: fresh.pair.agent.pid } };
                } finally {
                  await run.stop();
                  await waitIdle(fresh);
                }
              },
              { serverArgs: [s.flag], agentArgs: [s.flag], nodeArgs: ['--cpu-prof', '--cpu-prof-dir', profDir] },
            );
            const fileOf = (pid: number): string | undefined => {
              const f = fs.readdirSync(profDir).find((x) => x.includes(`.${pid}.`) && x.endsWith('.cpuprofile'));
              return f === undefined ? undefined : path.join(profDir, f);
            };
            // Download: the agent reads the backend and sends; upload: the server.
            const sender = fileOf(c.mode === 'down' ? r.pids.agent : r.pids.server);
            const receiver = fileOf(c.mode === 'down' ? r.pids.server : r.pids.agent);
            if (!sender || !receiver) {
              warnings.push(`${c.name}, ${b.label}, resume ${s.label}: a profile was not written`);
              continue;
            }
            const gc = (f: string): number => summariseProfile(f, '', c.name, window).areas.find((a) => a.name === 'GC')?.share ?? 0;
            const key = `${c.name}\t${b.label}\t${s.label}`;
            const cell = cells.get(key) ?? { mbps: [], cpuSPerGB: [], senderGc: [], senderCopy: [], receiverGc: [] };
            cell.mbps.push(r.sample.bytesPerSec / 1e6);
            cell.cpuSPerGB.push(r.sample.proxyCpuSPerGB);
            cell.senderGc.push(gc(sender));
            cell.senderCopy.push(copyShare(sender));
            cell.receiverGc.push(gc(receiver));
            cells.set(key, cell);
          }
  } finally {
    await cleanUp();
  }
  const pct = (xs: number[]): string => `${(median(xs) * 100).toFixed(1)}% (${xs.map((x) => (x * 100).toFixed(1)).join(', ')})`;
  console.log('case\tbuild\tresume\tMB/s\tproxy CPU s/GB\tsender GC\tsender copy\treceiver GC');
  for (const [key, c] of cells)
    console.log(
      `${key}\t${median(c.mbps).toFixed(0)}\t${median(c.cpuSPerGB).toFixed(2)}\t${pct(c.senderGc)}\t${pct(c.senderCopy)}\t${pct(c.receiverGc)}`,
    );
  for (const w of warnings) console.log(`warning: ${w}`);
}

await main();
