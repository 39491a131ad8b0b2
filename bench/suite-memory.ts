/**
 * 3. Memory: RSS per idle tunnelled connection, and per connected agent, for
 * Kanal and (when its binaries are there) upstream, one run each.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../kit/pki/throwaway-pki.js';
import { pairOf, pairRss, products, waitIdle, withFreshPair, type Env } from './env.js';
import { readyDetail, startServer, startSwarm } from './cluster.js';
import type { Product } from './loadgen-protocol.js';
import type { Row } from './report.js';
import { rssBytes } from './proc.js';
import { startUpstreamServer, upstreamAgentCount } from './upstream.js';
import type { Child } from './children.js';

const KiB = 1024;
const MiB = 1024 * 1024;
const AGENT_ID_PREFIX = 'bench-agent';

/** RSS settles a little after a burst of allocations; take the later of two reads. */
async function settledRss<T>(read: () => T, ms: number): Promise<T> {
  await sleep(ms);
  read();
  await sleep(ms);
  return read();
}

/** Kanal's row gets the ratios of its per-unit figures to upstream's (`keys`: the figures compared). */
function compareWithUpstream(rows: Row[], keys: string[]): Row[] {
  const [kanal, upstream] = rows;
  if (!kanal || !upstream) return rows;
  for (const k of keys) {
    const theirs = upstream.values[k];
    if (theirs === 0) continue; // nothing to divide by (a small run's RSS noise)
    kanal.values[`${k}VsUpstream`] = kanal.values[k] / theirs;
    // A ratio of figures that may be negative (RSS noise in a small run) may be negative too.
    if (kanal.signed?.includes(k)) kanal.signed.push(`${k}VsUpstream`);
  }
  return rows;
}

const PRODUCT_LABEL: Record<Product, string> = { kanal: 'Kanal', upstream: 'upstream' };

async function idleConnections(env: Env, product: Product): Promise<Row> {
  const n = env.params.idleConnections;
  const path = product === 'kanal' ? 'kanal-cp' : 'upstream-cp';
  const pair = pairOf(env, product);
  const warm = Math.max(2, Math.min(100, Math.floor(n / 20)));
  const settle = n >= 1000 ? 500 : 100;
  const start = await settledRss(() => pairRss(pair), settle);
  env.progress(`memory (${product}): ${warm} warm-up idle connections`);
  const w = await env.client.call('hold', { path, n: warm, concurrency: 32 }, 60_000);
  if (w.errors > 0) throw new Error(`idle connections (${product}): ${w.errors} failed, first: ${w.firstError ?? '?'}`);
  const before = await settledRss(() => pairRss(pair), settle);
  env.progress(`memory (${product}): opening ${n} idle tunnelled connections`);
  const t0 = performance.now();
  const r = await env.client.call('hold', { path, n, concurrency: 64 }, 600_000);
  const openMs = performance.now() - t0;
  if (r.errors > 0) env.warnings.push(`idle connections (${product}): ${r.errors} of ${n} failed, first: ${r.firstError ?? '?'}`);
  const opened = r.held - w.held;
  if (opened <= 0) throw new Error(`idle connections (${product}): none opened (${r.firstError ?? 'no error'})`);
  const after = await settledRss(() => pairRss(pair), settle * 2);
  await env.client.call('release', null);
  await waitIdle(env, 60_000);
  return {
    id: product === 'kanal' ? 'memory.idle-connections' : 'memory.idle-connections.upstream',
    section: 'memory',
    label: `${PRODUCT_LABEL[product]}: idle CP->node connections`,
    values: {
      connections: opened,
      serverKiBPerConn: (after.server - before.server) / opened / KiB,
      agentKiBPerConn: (after.agent - before.agent) / opened / KiB,
      serverStartRssMiB: start.server / MiB,
      agentStartRssMiB: start.agent / MiB,
      serverRssMiB: after.server / MiB,
      agentRssMiB: after.agent / MiB,
      openPerS: (opened * 1000) / openMs,
    },
    signed: ['serverKiBPerConn', 'agentKiBPerConn'],
  };
}

/** Idle tunnelled connections through a freshly started pair of each product. */
export async function runIdleConnections(env: Env): Promise<Row[]> {
  const rows: Row[] = [];
  // Kanal caps connections per agent tunnel, at both ends (8,192 by default); the full run holds 10,000 through one.
  const cap = String(2 * env.params.idleConnections);
  const kanal = { serverArgs: ['--max-cp-to-node-connections-per-agent', cap], agentArgs: ['--max-cp-to-node-connections', cap] };
  for (const product of products(env))
    rows.push(await withFreshPair(env, product, `memory-${product}`, (e) => idleConnections(e, product), kanal));
  return compareWithUpstream(rows, ['serverKiBPerConn', 'agentKiBPerConn']);
}

/** A server the agent swarm connects to, and how it counts its agents. */
interface SwarmTarget {
  child: Child;
  agentPort: number;
  /** The server's own count of connected agents (NaN when it cannot tell). */
  agents(): Promise<number>;
}

async function startTarget(env: Env, product: Product, agents: number): Promise<SwarmTarget> {
  const o = { dir: env.dir, tag: `agents-${product}`, pki: env.pki };
  if (product === 'kanal') {
    const server = await startServer({ ...o, transport: env.transport, cli: env.kanalCli, maxAgentsPerCredential: agents });
    return {
      child: server.child,
      agentPort: server.agentPort,
      agents: async () => Number(/(\d+) agent\(s\) connected/.exec(await readyDetail(`${server.healthUrl}/readyz`))?.[1] ?? Number.NaN),
    };
  }
  const server = await startUpstreamServer({ ...o, binaries: env.upstreamBinaries! });
  return { child: server.child, agentPort: server.agentPort, agents: () => upstreamAgentCount(server) };
}

/**
 * RSS growth of one server per connected agent. The agents are Kanal's agent
 * tunnels (src/agent/server-connection.ts), many per helper process, for both
 * servers: one upstream proxy-agent process per agent would not fit 1,000 on
 * the machine, so upstream's row measures its server side only.
 */
async function agentsOn(env: Env, product: Product): Promise<Row> {
  const n = env.params.agents;
  const swarms = Math.max(1, Math.ceil(n / env.params.agentsPerSwarm));
  const perSwarm = Math.ceil(n / swarms);
  const warmPer = Math.max(1, Math.min(10, Math.floor(perSwarm / 10)));
  // Every agent presents the one shared agent.crt, so Kanal's server allows that many agents per credential.
  const server = await startTarget(env, product, n);
  const workers = Array.from({ length: swarms }, (_, i) => startSwarm(env.dir, `agent-swarm-${product}-${i}`));
  try {
    const common = {
      target: `127.0.0.1:${server.agentPort}`,
      pki: env.pki,
      transport: env.transport,
      idPrefix: AGENT_ID_PREFIX,
      concurrency: 16,
    };
    env.progress(`agents (${product}): ${warmPer * swarms} warm-up agents in ${swarms} helper process(es)`);
    let connected = 0;
    for (const [i, w] of workers.entries()) {
      const r = await w.call('connect', { ...common, from: i * perSwarm, count: warmPer }, 120_000);
      if (r.errors > 0) throw new Error(`agents (${product}): warm-up failed: ${r.firstError ?? '?'}`);
      connected += r.connected;
    }
    const read = (): { server: number; side: number } => ({
      server: rssBytes(server.child.pid),
      side: workers.reduce((s, w) => s + rssBytes(w.pid), 0),
    });
    const before = await settledRss(read, 300);
    const warmCount = connected;
    env.progress(`agents (${product}): connecting ${n} agents to one server`);
    const t0 = performance.now();
    const results = await Promise.all(
      workers.map((w, i) =>
        w.call('connect', { ...common, from: i * perSwarm + warmPer, count: Math.min(perSwarm, n - i * perSwarm) - warmPer }, 600_000),
      ),
    );
    const ms = performance.now() - t0;
    connected = results.reduce((s, r) => s + r.connected, 0);
    const failed = results.reduce((s, r) => s + r.errors, 0);
    if (failed > 0)
      env.warnings.push(`agents (${product}): ${failed} failed to connect, first: ${results.find((r) => r.firstError)?.firstError ?? '?'}`);
    const after = await settledRss(read, n >= 500 ? 1000 : 300);
    const seen = await server.agents();
    if (seen !== connected) env.warnings.push(`agents (${product}): the server counts ${seen} agents, the helpers hold ${connected}`);
    const added = connected - warmCount;
    if (added <= 0) throw new Error(`agents (${product}): none connected`);
    const values: Record<string, number> = {
      agents: connected,
      serverKiBPerAgent: (after.server - before.server) / added / KiB,
      serverRssMiB: after.server / MiB,
      connectPerS: (added * 1000) / ms,
    };
    // The helpers run Kanal's agent code against either server: their growth is Kanal's agent side.
    if (product === 'kanal') values.agentSideKiBPerAgent = (after.side - before.side) / added / KiB;
    return {
      id: product === 'kanal' ? 'agents.per-agent' : 'agents.per-agent.upstream',
      section: 'agents',
      label: `${PRODUCT_LABEL[product]} server: connected agents`,
      values,
      signed: ['serverKiBPerAgent', 'agentSideKiBPerAgent'],
    };
  } finally {
    await Promise.all(workers.map((w) => w.call('closeAll', null, 30_000).catch(() => null)));
    await Promise.all(workers.map((w) => w.child.stop()));
    await server.child.stop();
  }
}

export async function runAgents(env: Env): Promise<Row[]> {
  // Each agent holds its own certificate (CN = agentID), issued before any RSS is read.
  env.progress(`agents: issuing ${env.params.agents} agent certificates`);
  for (let i = 0; i < env.params.agents; i += 50) {
    const batch = Array.from({ length: Math.min(50, env.params.agents - i) }, (_, j) =>
      issueAgentCertificate(env.pki, `${AGENT_ID_PREFIX}-${i + j}`),
    );
    await Promise.all(batch);
  }
  const rows: Row[] = [];
  for (const product of products(env)) rows.push(await agentsOn(env, product));
  return compareWithUpstream(rows, ['serverKiBPerAgent']);
}
