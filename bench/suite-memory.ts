/** 3. Memory: RSS per idle tunnelled connection, and per connected agent. */
import { setTimeout as sleep } from 'node:timers/promises';
import { kanalRss, waitIdle, type Env } from './env.js';
import { readyDetail, startServer, startSwarm } from './cluster.js';
import type { Row } from './report.js';
import { rssBytes } from './proc.js';

const KiB = 1024;
const MiB = 1024 * 1024;

/** RSS settles a little after a burst of allocations; take the later of two reads. */
async function settledRss<T>(read: () => T, ms: number): Promise<T> {
  await sleep(ms);
  read();
  await sleep(ms);
  return read();
}

export async function runIdleConnections(env: Env): Promise<Row[]> {
  const n = env.params.idleConnections;
  const warm = Math.max(2, Math.min(100, Math.floor(n / 20)));
  const settle = n >= 1000 ? 500 : 100;
  env.progress(`memory: ${warm} warm-up idle connections`);
  const w = await env.client.call('hold', { path: 'kanal-cp', n: warm, concurrency: 32 }, 60_000);
  if (w.errors > 0) throw new Error(`idle connections: ${w.errors} failed, first: ${w.firstError ?? '?'}`);
  const before = await settledRss(() => kanalRss(env), settle);
  env.progress(`memory: opening ${n} idle tunnelled connections`);
  const t0 = performance.now();
  const r = await env.client.call('hold', { path: 'kanal-cp', n, concurrency: 64 }, 600_000);
  const openMs = performance.now() - t0;
  if (r.errors > 0) env.warnings.push(`idle connections: ${r.errors} of ${n} failed, first: ${r.firstError ?? '?'}`);
  const opened = r.held - w.held;
  if (opened <= 0) throw new Error(`idle connections: none opened (${r.firstError ?? 'no error'})`);
  const after = await settledRss(() => kanalRss(env), settle * 2);
  await env.client.call('release', null);
  await waitIdle(env, 60_000);
  return [
    {
      id: 'memory.idle-connections',
      section: 'memory',
      label: 'idle CP->node connections',
      values: {
        connections: opened,
        serverKiBPerConn: (after.server - before.server) / opened / KiB,
        agentKiBPerConn: (after.agent - before.agent) / opened / KiB,
        serverRssMiB: after.server / MiB,
        agentRssMiB: after.agent / MiB,
        openPerS: (opened * 1000) / openMs,
      },
      signed: ['serverKiBPerConn', 'agentKiBPerConn'],
    },
  ];
}

export async function runAgents(env: Env): Promise<Row[]> {
  const n = env.params.agents;
  const swarms = Math.max(1, Math.ceil(n / env.params.agentsPerSwarm));
  const perSwarm = Math.ceil(n / swarms);
  const warmPer = Math.max(1, Math.min(10, Math.floor(perSwarm / 10)));
  // Every agent presents the one shared agent.crt, so the server allows that many agents per credential.
  const server = await startServer({ dir: env.dir, tag: 'agents', pki: env.pki, transport: env.transport, maxAgentsPerCredential: n });
  const workers = Array.from({ length: swarms }, (_, i) => startSwarm(env.dir, `agent-swarm-${i}`));
  try {
    const common = {
      target: `127.0.0.1:${server.agentPort}`,
      caFile: env.pki.caCert,
      certFile: env.pki.agentCert,
      keyFile: env.pki.agentKey,
      transport: env.transport,
      idPrefix: 'bench-agent',
      concurrency: 16,
    };
    env.progress(`agents: ${warmPer * swarms} warm-up agents in ${swarms} helper process(es)`);
    let connected = 0;
    for (const [i, w] of workers.entries()) {
      const r = await w.call('connect', { ...common, from: i * perSwarm, count: warmPer }, 120_000);
      if (r.errors > 0) throw new Error(`agents: warm-up failed: ${r.firstError ?? '?'}`);
      connected += r.connected;
    }
    const read = (): { server: number; side: number } => ({ server: rssBytes(server.child.pid), side: workers.reduce((s, w) => s + rssBytes(w.pid), 0) });
    const before = await settledRss(read, 300);
    const warmCount = connected;
    env.progress(`agents: connecting ${n} agents to one server`);
    const t0 = performance.now();
    const results = await Promise.all(
      workers.map((w, i) => w.call('connect', { ...common, from: i * perSwarm + warmPer, count: Math.min(perSwarm, n - i * perSwarm) - warmPer }, 600_000)),
    );
    const ms = performance.now() - t0;
    connected = results.reduce((s, r) => s + r.connected, 0);
    const failed = results.reduce((s, r) => s + r.errors, 0);
    if (failed > 0) env.warnings.push(`agents: ${failed} failed to connect, first: ${results.find((r) => r.firstError)?.firstError ?? '?'}`);
    const after = await settledRss(read, n >= 500 ? 1000 : 300);
    const detail = await readyDetail(`${server.healthUrl}/readyz`);
    const seen = Number(/(\d+) agent\(s\) connected/.exec(detail)?.[1] ?? Number.NaN);
    if (seen !== connected) env.warnings.push(`agents: server reports "${detail}", helpers hold ${connected}`);
    const added = connected - warmCount;
    if (added <= 0) throw new Error('agents: none connected');
    return [
      {
        id: 'agents.per-agent',
        section: 'agents',
        label: 'agents connected to one server',
        values: {
          agents: connected,
          serverKiBPerAgent: (after.server - before.server) / added / KiB,
          agentSideKiBPerAgent: (after.side - before.side) / added / KiB,
          serverRssMiB: after.server / MiB,
          connectPerS: (added * 1000) / ms,
        },
        signed: ['serverKiBPerAgent', 'agentSideKiBPerAgent'],
      },
    ];
  } finally {
    await Promise.all(workers.map((w) => w.call('closeAll', null, 30_000).catch(() => null)));
    await Promise.all(workers.map((w) => w.child.stop()));
    await server.child.stop();
  }
}
