/**
 * 9b. SOCKS5 next to CONNECT (the goal: within 5%): dial latency (open, handshake,
 * one byte written and echoed by the backend; sequential and `dialConcurrency` at a time) and one
 * bulk flow each way, through Kanal's SOCKS5 door and its CONNECT door on the same server and
 * agent, runs interleaved, with upstream's CONNECT as a reference row. The SOCKS5 door is on a
 * Unix socket (--socks5-uds-name) like the CONNECT door, so the two differ only in the handshake;
 * a build with only --socks5-port gets the TCP listener (said in the row), and a build with
 * neither (or whose door does not answer) gets a row saying so.
 */
import path from 'node:path';
import { freePort } from '../kit/launch/kanal-cli.js';
import { cliFlags } from './cli-probe.js';
import { aimClient, bulkRun, proxyPids, waitIdle, withFreshPair, type Env } from './env.js';
import type { ClientConfig, Path } from './loadgen-protocol.js';
import { cpuSecondsOf } from './proc.js';
import type { DoorsRow } from './report.js';
import { inRepOrder, median, medianRatio, percentile, spread } from './stats.js';
import { truncateForLog } from '../src/common/log-safety.js';

const UDS_FLAG = '--socks5-uds-name';
const PORT_FLAG = '--socks5-port';

type Door = NonNullable<ClientConfig['socks5']>;

interface PathSpec {
  path: Path;
  key: string;
  label: string;
}

interface Dials {
  latencies: number[][];
  rates: number[];
  cpuS: number;
}

/** Where the SOCKS5 door of the pair to start listens, and the server flags that put it there; undefined when the build has none. */
async function socksDoor(env: Env): Promise<{ door: Door; serverArgs: string[]; where: string } | undefined> {
  const flags = await cliFlags(env.kanalCli, 'server', [UDS_FLAG, PORT_FLAG]);
  // RFC 1929 credentials offered if the door asks: without a `clients:` section every client is the KAS, the token is not looked at.
  const creds = { username: 'bench', password: 'bench-token' };
  if (flags.has(UDS_FLAG)) {
    const uds = path.join(env.dir, 'socks-kanal-socks5.sock');
    return { door: { address: { uds }, ...creds }, serverArgs: [UDS_FLAG, uds], where: 'Unix socket' };
  }
  if (flags.has(PORT_FLAG)) {
    const port = await freePort();
    return {
      door: { address: { host: '127.0.0.1', port }, ...creds },
      serverArgs: [PORT_FLAG, String(port), '--socks5-bind-address', '127.0.0.1'],
      where: 'TCP 127.0.0.1',
    };
  }
  return undefined;
}

export async function runSocks(env: Env): Promise<{ rows: DoorsRow[]; notes: string[] }> {
  const p = env.params;
  const found = await socksDoor(env);
  const notes: string[] = [
    '9b: SOCKS5 dials name the backend by its IPv4 address (ATYP 1), as the CONNECT dials do; a name (socks5h) adds the',
    "agent's resolution, which neither row has. Dial CPU: server + agent over each batch, read after its teardown.",
  ];
  return withFreshPair(
    env,
    'kanal',
    'socks-kanal',
    async (kenv) => {
      const rows: DoorsRow[] = [];
      const paths: PathSpec[] = [{ path: 'kanal-cp', key: 'kanal-connect', label: 'Kanal CONNECT, Unix socket' }];
      const socksLabel = `Kanal SOCKS5, ${found?.where ?? 'no listener'}`;
      if (!found) {
        rows.push({
          id: 'doors.socks.kanal-socks5',
          table: 'socks',
          label: 'Kanal SOCKS5',
          values: {},
          note: `not available in this build (\`kanal server --help\` names neither ${UDS_FLAG} nor ${PORT_FLAG})`,
        });
      } else {
        await aimClient(kenv, { socks5: found.door });
        const probe = await kenv.client.call('dials', { path: 'kanal-socks5', n: 1, concurrency: 1 }, 60_000);
        await waitIdle(kenv);
        if (probe.errors > 0) {
          rows.push({
            id: 'doors.socks.kanal-socks5',
            table: 'socks',
            label: socksLabel,
            values: {},
            note: `not available in this build (a SOCKS5 dial failed: ${truncateForLog(probe.firstError ?? '?', 140)})`,
          });
        } else paths.unshift({ path: 'kanal-socks5', key: 'kanal-socks5', label: socksLabel });
      }
      if (kenv.upstream) paths.push({ path: 'upstream-cp', key: 'upstream-connect', label: 'upstream CONNECT, Unix socket' });

      // As section 2a: V8 keeps optimising Kanal's dial path for about dialWarmup dials; upstream's Go needs a fifth for its pools.
      for (const s of paths) {
        const n = s.path === 'upstream-cp' ? Math.ceil(p.dialWarmup / 5) : p.dialWarmup;
        env.progress(`socks: dial warm-up, ${n} dials ${s.label}`);
        await kenv.client.call('dials', { path: s.path, n, concurrency: 1 }, 600_000);
      }
      await waitIdle(kenv);

      const concurrencies = [1, p.dialConcurrency];
      const perRep = Math.max(1, Math.ceil(p.dials / p.reps));
      const dials = new Map<string, Dials>();
      const bulk = new Map<string, { mbps: number[]; cpuSPerGB: number[] }>();
      const key = (path: Path, what: string): string => `${path}/${what}`;
      for (let rep = 0; rep < p.reps; rep++) {
        for (const c of concurrencies) {
          for (const s of inRepOrder(paths, rep)) {
            env.progress(`socks: dials ${s.label}, ${c === 1 ? 'sequential' : `${c} at a time`}, run ${rep + 1}/${p.reps}`);
            const pids = proxyPids(kenv, s.path);
            const cpu0 = cpuSecondsOf(pids);
            const r = await kenv.client.call('dials', { path: s.path, n: perRep, concurrency: c }, 600_000);
            await waitIdle(kenv);
            if (r.errors > 0) env.warnings.push(`socks: dials ${s.label} c=${c}: ${r.errors} failure(s), first: ${r.firstError ?? '?'}`);
            const d = dials.get(key(s.path, `c${c}`)) ?? { latencies: [], rates: [], cpuS: 0 };
            dials.set(key(s.path, `c${c}`), d);
            d.latencies.push(r.latenciesMs);
            d.rates.push((r.latenciesMs.length * 1000) / r.elapsedMs);
            d.cpuS += cpuSecondsOf(pids) - cpu0;
          }
        }
        for (const mode of ['down', 'up'] as const) {
          for (const s of inRepOrder(paths, rep)) {
            env.progress(`socks: one bulk flow ${mode === 'down' ? 'download' : 'upload'} ${s.label}, run ${rep + 1}/${p.reps}`);
            const sample = await bulkRun(kenv, s.path, mode, 1);
            const b = bulk.get(key(s.path, mode)) ?? { mbps: [], cpuSPerGB: [] };
            bulk.set(key(s.path, mode), b);
            b.mbps.push(sample.bytesPerSec / 1e6);
            b.cpuSPerGB.push(sample.proxyCpuSPerGB);
          }
        }
      }

      const connectKey = 'kanal-cp';
      for (const c of concurrencies) {
        const ref = dials.get(key(connectKey, `c${c}`));
        for (const s of paths) {
          const d = dials.get(key(s.path, `c${c}`))!;
          const pooled = d.latencies.flat();
          const values: Record<string, number> = {
            p50Ms: percentile(pooled, 50),
            p99Ms: percentile(pooled, 99),
            p50Spread: spread(d.latencies.map((x) => percentile(x, 50))),
            dialsPerS: median(d.rates),
            cpuUsPerDial: (d.cpuS * 1e6) / Math.max(1, pooled.length),
            samples: pooled.length,
          };
          if (ref && s.path !== connectKey) {
            const refPooled = ref.latencies.flat();
            values.vsConnectP50 = values.p50Ms / percentile(refPooled, 50);
            values.vsConnectP99 = values.p99Ms / percentile(refPooled, 99);
            values.vsConnectRate = medianRatio(d.rates, ref.rates);
          }
          rows.push({
            id: `doors.socks.${s.key}.dial.c${c}`,
            table: 'socks',
            label: `${s.label.padEnd(30)} dial, ${c === 1 ? 'sequential' : `${c} at a time`}`,
            values,
          });
        }
      }
      for (const mode of ['down', 'up'] as const) {
        const ref = bulk.get(key(connectKey, mode));
        for (const s of paths) {
          const b = bulk.get(key(s.path, mode))!;
          const values: Record<string, number> = {
            mbps: median(b.mbps),
            mbpsSpread: spread(b.mbps),
            proxyCpuSPerGB: median(b.cpuSPerGB),
          };
          if (ref && s.path !== connectKey) values.vsConnectMbps = medianRatio(b.mbps, ref.mbps);
          rows.push({
            id: `doors.socks.${s.key}.${mode}`,
            table: 'socks',
            label: `${s.label.padEnd(30)} ${mode === 'down' ? 'download' : 'upload'}, 1 flow`,
            values,
          });
        }
      }
      return { rows, notes };
    },
    { serverArgs: found?.serverArgs ?? [] },
  );
}
