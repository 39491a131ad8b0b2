/**
 * 7g. A hostile agent on a shared server: tenants A and B, each with its own
 * `kanal agent` and kube-apiserver (load generator), and in A a second agent
 * whose credential an attacker holds (hostile-agent.ts): it negotiates
 * resume, dials an allowed bulk source node → control plane on many
 * connections, grants the server unbounded credit (2^50 bytes) or a large
 * one (16 MiB), and never acknowledges. Measured in each phase, runs
 * interleaved: the server's RSS (highest while it lasts), A's and B's
 * sequential dial latency and one-flow bulk download through their honest
 * agents, and what the hostile agent got.
 */
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { BACKEND_HOST, startHostile } from './cluster.js';
import type { Env } from './env.js';
import type { HostileCounters } from './hostile-agent.js';
import type { LoadgenCommands } from './loadgen-protocol.js';
import type { Worker } from './rpc.js';
import type { TenantsRow } from './report.js';
import { inRepOrder, median, medianRatio, percentile, spread } from './stats.js';
import {
  failuresWarning,
  oneFlowDownload,
  serverName,
  serverRss,
  startTenantAgent,
  startTenantsServer,
  tenantClient,
  waitWorkersIdle,
  writeTenantsFile,
  type TenantCredentials,
  type TenantsServer,
} from './suite-tenants.js';
import type { Child } from './children.js';

const MiB = 1024 * 1024;

type Phase = 'quiet' | 'unbounded' | 'large';
const PHASES: readonly Phase[] = ['quiet', 'unbounded', 'large'];
/** Credit the hostile agent grants per connection in each attack phase. */
const INCREMENT: Record<Exclude<Phase, 'quiet'>, number> = { unbounded: 2 ** 50, large: 16 * MiB };
/** Connections the hostile agent keeps open at once (each closed one is dialled again). */
const HOSTILE_CONNECTIONS = 32;
/** How long the attack runs before the honest tenants are measured: the server's holdings grow meanwhile. */
const FILL_MS = 3000;

interface TenantRuns {
  dials: number[][];
  bulk: number[];
}

/** Runs the hostile-agent comparison on its own server; rows of table 'hostile'. */
export async function runHostile(env: Env, creds: TenantCredentials): Promise<TenantsRow[]> {
  const p = env.params;
  const dir = path.join(env.dir, 'tenants-hostile');
  fs.mkdirSync(path.join(dir, 'cfg'), { recursive: true });
  const bulkSource = `${BACKEND_HOST}:${env.ports.bulkTcp}`;
  const echo = `${BACKEND_HOST}:${env.ports.echoTcp}`;
  const file = path.join(dir, 'cfg', 'tenants.yaml');
  writeTenantsFile(
    file,
    [
      // A's limit on agents per credential stays at the default of one: the hostile agent has a credential of its own.
      { name: 'a', uds: path.join(dir, 'a.sock'), allowed: [echo, bulkSource] },
      { name: 'b', uds: path.join(dir, 'b.sock'), allowed: [echo] },
    ],
    creds,
  );
  env.progress('hostile agent: a server of tenants a and b, a kanal agent each, a hostile agent in a');
  const children: Child[] = [];
  const workers: Worker<LoadgenCommands>[] = [];
  let server: TenantsServer | undefined;
  const hostile = startHostile(env.dir, 'hostile-agent');
  try {
    server = await startTenantsServer(env, 'tenants-hostile', file);
    const s = server;
    children.push(
      ...(await Promise.all([startTenantAgent(env, 'hostile-a', s.agentPort, 'a'), startTenantAgent(env, 'hostile-b', s.agentPort, 'b')])),
    );
    const clients = await Promise.all([
      tenantClient(env, 'hostile-a-client', path.join(dir, 'a.sock')),
      tenantClient(env, 'hostile-b-client', path.join(dir, 'b.sock')),
    ]);
    workers.push(...clients);
    const seconds = (p.warmupMs + p.measureMs) / 1000 + 5;
    const maxBytes = Math.ceil(p.capBytesPerSecond * seconds);
    let groups = 0;
    const bulkOf = (w: Worker<LoadgenCommands>): Promise<number> => oneFlowDownload(env, w, `h${++groups}`, maxBytes);
    const measure = async (w: Worker<LoadgenCommands>, into: TenantRuns, who: string): Promise<void> => {
      const r = await w.call('dials', { path: 'kanal-cp', n: p.tenantDials, concurrency: 1 }, 600_000);
      failuresWarning(env, `hostile agent: tenant ${who}'s dials`, r);
      into.dials.push(r.latenciesMs);
      into.bulk.push(await bulkOf(w));
    };
    env.progress('hostile agent: warm-up');
    for (const w of clients) await measure(w, { dials: [], bulk: [] }, 'warm-up');
    await waitWorkersIdle(env, [...clients, env.backend]);

    const runs = (): TenantRuns => ({ dials: [], bulk: [] });
    const a: Record<Phase, TenantRuns> = { quiet: runs(), unbounded: runs(), large: runs() };
    const b: Record<Phase, TenantRuns> = { quiet: runs(), unbounded: runs(), large: runs() };
    const rss: Record<Phase, number[]> = { quiet: [], unbounded: [], large: [] };
    const got: Record<Exclude<Phase, 'quiet'>, HostileCounters[]> = { unbounded: [], large: [] };
    for (let rep = 0; rep < p.reps; rep++) {
      for (const phase of inRepOrder(PHASES, rep)) {
        env.progress(`hostile agent: ${phase === 'quiet' ? 'no attack' : `credit ${phase}`}, run ${rep + 1}/${p.reps}`);
        let peak = serverRss(s);
        const sampler = setInterval(() => (peak = Math.max(peak, serverRss(s))), 100);
        try {
          if (phase !== 'quiet') {
            await hostile.call('attack', {
              target: `127.0.0.1:${s.agentPort}`,
              pki: env.pki,
              transport: env.transport,
              serverName: serverName('a'),
              agentID: `a-hostile-${phase}-${rep}`,
              address: bulkSource,
              connections: HOSTILE_CONNECTIONS,
              increment: INCREMENT[phase],
            });
            await sleep(FILL_MS);
          }
          await Promise.all([measure(clients[0], a[phase], 'a'), measure(clients[1], b[phase], 'b')]);
          peak = Math.max(peak, serverRss(s));
        } finally {
          clearInterval(sampler);
          if (phase !== 'quiet') got[phase].push(await hostile.call('stop', null));
        }
        rss[phase].push(peak / MiB);
        await waitWorkersIdle(env, [...clients, env.backend]);
        // What the hostile agent left behind is released (resume keeps a cut tunnel until --resume-timeout): settle.
        await sleep(phase === 'quiet' ? 250 : 1500);
      }
    }
    const latency = (who: string, runsOf: Record<Phase, TenantRuns>, q: 50 | 99): TenantsRow => {
      const at = (phase: Phase): number => percentile(runsOf[phase].dials.flat(), q);
      return {
        id: `tenants.hostile.${who}-dial-p${q}`,
        table: 'hostile',
        label: `${who.toUpperCase()} dial latency p${q}, ms (sequential)`,
        values: {
          quiet: at('quiet'),
          unbounded: at('unbounded'),
          large: at('large'),
          ratioUnbounded: at('unbounded') / at('quiet'),
          ratioLarge: at('large') / at('quiet'),
          quietSpread: spread(runsOf.quiet.dials.map((x) => percentile(x, q))),
          attackSpread: spread(runsOf.unbounded.dials.map((x) => percentile(x, q))),
        },
        signed: ['quietSpread', 'attackSpread'],
      };
    };
    const bulk = (who: string, runsOf: Record<Phase, TenantRuns>): TenantsRow => ({
      id: `tenants.hostile.${who}-bulk`,
      table: 'hostile',
      label: `${who.toUpperCase()} bulk download, 1 flow, MB/s`,
      values: {
        quiet: median(runsOf.quiet.bulk),
        unbounded: median(runsOf.unbounded.bulk),
        large: median(runsOf.large.bulk),
        ratioUnbounded: medianRatio(runsOf.unbounded.bulk, runsOf.quiet.bulk),
        ratioLarge: medianRatio(runsOf.large.bulk, runsOf.quiet.bulk),
        quietSpread: spread(runsOf.quiet.bulk),
        attackSpread: spread(runsOf.unbounded.bulk),
      },
      signed: ['quietSpread', 'attackSpread'],
      runs: PHASES.flatMap((phase) => runsOf[phase].bulk).map((x) => Math.round(x)),
    });
    const hostileRow = (phase: Exclude<Phase, 'quiet'>): TenantsRow => {
      const g = got[phase];
      const reason = g.find((c) => c.firstReason)?.firstReason;
      if (reason) env.progress(`hostile agent (credit ${phase}): first close or refusal: ${reason.slice(0, 200)}`);
      return {
        id: `tenants.hostile.attacker-${phase}`,
        table: 'hostile',
        label: `the hostile agent, credit ${phase === 'unbounded' ? '2^50' : '16 MiB'}: MiB received, connections opened / closed by the server`,
        values: {
          quiet: Number.NaN,
          unbounded: phase === 'unbounded' ? median(g.map((c) => c.received / MiB)) : Number.NaN,
          large: phase === 'large' ? median(g.map((c) => c.received / MiB)) : Number.NaN,
          opened: median(g.map((c) => c.opened)),
          closed: median(g.map((c) => c.closedByServer)),
        },
      };
    };
    return [
      {
        id: 'tenants.hostile.server-rss',
        table: 'hostile',
        label: 'server RSS, MiB (highest while the phase lasts)',
        values: {
          quiet: median(rss.quiet),
          unbounded: median(rss.unbounded),
          large: median(rss.large),
          ratioUnbounded: medianRatio(rss.unbounded, rss.quiet),
          ratioLarge: medianRatio(rss.large, rss.quiet),
          quietSpread: spread(rss.quiet),
          attackSpread: spread(rss.unbounded),
        },
        signed: ['quietSpread', 'attackSpread'],
        runs: PHASES.flatMap((phase) => rss[phase]).map((x) => Math.round(x)),
      },
      latency('a', a, 50),
      latency('a', a, 99),
      bulk('a', a),
      latency('b', b, 50),
      latency('b', b, 99),
      bulk('b', b),
      hostileRow('unbounded'),
      hostileRow('large'),
    ];
  } finally {
    await Promise.all([hostile.child.stop(), ...workers.map((w) => w.child.stop()), ...children.map((c) => c.stop())]);
    await server?.child.stop();
  }
}
