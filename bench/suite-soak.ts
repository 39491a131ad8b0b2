/**
 * 5. Connection churn soak: does memory come back after many short
 * connections? For each product, on a pair started for the phase alone:
 * (1) connections to the server's agent port that never become agents
 * (HANDSHAKE_MIX: mostly mTLS with half an HTTP/2 preface, the case that
 * leaked about 6.6 KiB per handshake), and (2) short tunnelled connections
 * through server and agent (CHURN_MIX: answered, closed right after the 200,
 * refused by the destination). RSS and heap of server and agent are read
 * every `soakEvery` connections; the goal is at most SOAK_GOAL_MIB of RSS
 * growth from the first reading to the end, per process.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort } from '../kit/launch/kanal-cli.js';
import { issueAgentCertificate } from '../kit/pki/throwaway-pki.js';
import { BACKEND_HOST, readPem, type TunnelPair } from './cluster.js';
import { pairOf, products, withFreshPair, type Env } from './env.js';
import type { Failures, HandshakeTarget, Outcomes, Product } from './loadgen-protocol.js';
import { SOAK_GOAL_MIB } from './params.js';
import { rssBytes } from './proc.js';
import type { SoakReport, SoakRow } from './report.js';

const MiB = 1024 * 1024;
/** Closed connections are torn down a moment after the client's batch ends: read once that is done. */
const SETTLE_MS = 300;
/** One more reading this long after the last batch: does memory come back once the churn stops (Kanal's reclaimer checks every 10 s)? */
const IDLE_MS = 15_000;

type Phase = 'handshakes' | 'tunnelled';
type Process = 'server' | 'agent';
const PHASES: Phase[] = ['handshakes', 'tunnelled'];
const PROCESSES: Process[] = ['server', 'agent'];
const PHASE_LABEL: Record<Phase, string> = { handshakes: 'agent-port handshakes', tunnelled: 'tunnelled connections' };
const PRODUCT_LABEL: Record<Product, string> = { kanal: 'Kanal   ', upstream: 'upstream' };

/** prom-client's default metric for Kanal; Go's runtime metric for upstream (heap spans in use, not the JS heap's meaning). */
const HEAP_METRIC: Record<Product, string> = { kanal: 'nodejs_heap_size_used_bytes', upstream: 'go_memstats_heap_inuse_bytes' };

interface ProcReading {
  rss: number;
  heap: number;
}

interface Reading {
  connections: number;
  /** Connections per second of the batch before this reading (NaN for the reading at start). */
  perS: number;
  server: ProcReading;
  agent: ProcReading;
}

interface PhaseRun {
  product: Product;
  phase: Phase;
  readings: Reading[];
  /** IDLE_MS after the last batch. */
  idle: Reading;
  outcomes: Outcomes;
  errors: number;
  firstError?: string;
}

type BatchResult = { outcomes: Outcomes; elapsedMs: number } & Failures;

/** One batch of a phase: connections `from` .. `from + n - 1` of its mix against `pair`. */
type Batch = (env: Env, pair: TunnelPair, from: number, n: number) => Promise<BatchResult>;

/** A gauge from a Prometheus text page (NaN when the page or the metric is not there). */
async function metricValue(url: string, metric: string): Promise<number> {
  try {
    const text = await (await fetch(url, { signal: AbortSignal.timeout(2000) })).text();
    const m = new RegExp(`^${metric}(?:\\{[^}]*\\})? (\\S+)`, 'm').exec(text);
    return m ? Number(m[1]) : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

async function readPair(pair: TunnelPair, connections: number, perS: number): Promise<Reading> {
  await sleep(SETTLE_MS);
  // RSS first: the metrics scrape allocates a little in the process it asks.
  const rss = { server: rssBytes(pair.server.pid), agent: rssBytes(pair.agent.pid) };
  const [serverHeap, agentHeap] = await Promise.all([
    metricValue(pair.metricsUrls.server, HEAP_METRIC[pair.product]),
    metricValue(pair.metricsUrls.agent, HEAP_METRIC[pair.product]),
  ]);
  return { connections, perS, server: { rss: rss.server, heap: serverHeap }, agent: { rss: rss.agent, heap: agentHeap } };
}

function addOutcomes(into: Outcomes, more: Outcomes): void {
  for (const [k, v] of Object.entries(more)) into[k] = (into[k] ?? 0) + v;
}

/** `soakConnections` connections of `batch` through a pair started for this phase alone, read every `soakEvery`. */
async function soakPhase(env: Env, product: Product, phase: Phase, every: number, batch: Batch): Promise<PhaseRun> {
  const total = env.params.soakConnections;
  return withFreshPair(env, product, `soak-${product}-${phase}`, async (fresh) => {
    const pair = pairOf(fresh, product);
    const readings = [await readPair(pair, 0, Number.NaN)];
    const run: Omit<PhaseRun, 'idle'> = { product, phase, readings, outcomes: {}, errors: 0 };
    for (let from = 0; from < total; from += every) {
      const n = Math.min(every, total - from);
      env.progress(`soak (${product}): ${PHASE_LABEL[phase]} ${from + 1}-${from + n} of ${total}`);
      const r = await batch(fresh, pair, from, n);
      addOutcomes(run.outcomes, r.outcomes);
      run.errors += r.errors;
      run.firstError ??= r.firstError;
      if (r.errors === n)
        throw new Error(`soak (${product}): every connection of a ${PHASE_LABEL[phase]} batch failed: ${r.firstError ?? '?'}`);
      readings.push(await readPair(pair, from + n, (n * 1000) / r.elapsedMs));
    }
    env.progress(`soak (${product}): ${PHASE_LABEL[phase]} done, reading again after ${IDLE_MS / 1000} s idle`);
    await sleep(IDLE_MS);
    return { ...run, idle: await readPair(pair, total, Number.NaN) };
  });
}

async function handshakeTarget(env: Env): Promise<Omit<HandshakeTarget, 'port'>> {
  // Its own agent certificate: the handshakes never register, and the pair's agent keeps its own.
  const cred = await issueAgentCertificate(env.pki, 'soak-handshaker');
  return {
    host: '127.0.0.1',
    caPem: readPem(env.pki.caCert),
    agentCertPem: readPem(cred.cert),
    agentKeyPem: readPem(cred.key),
    rogueCertPem: readPem(env.pki.rogueAgentCert),
    rogueKeyPem: readPem(env.pki.rogueAgentKey),
  };
}

const MB = (bytes: number): number => bytes / MiB;

/** A reading's row; growth is counted from the first reading after connections. */
function readingRow(run: PhaseRun, r: Reading): SoakRow {
  const first = run.readings[1];
  const values: Record<string, number> = { connections: r.connections, perS: r.perS };
  for (const p of PROCESSES) {
    values[`${p}RssMiB`] = MB(r[p].rss);
    values[`${p}HeapMiB`] = MB(r[p].heap);
    if (first && r !== run.readings[0]) values[`${p}GrowthMiB`] = MB(r[p].rss - first[p].rss);
  }
  const idle = r === run.idle;
  return {
    id: `soak.${run.product}.${run.phase}.${idle ? 'idle' : r.connections}`,
    label: `${PRODUCT_LABEL[run.product]} ${PHASE_LABEL[run.phase]}${idle ? `, ${IDLE_MS / 1000} s idle` : ''}`,
    values,
  };
}

/** Growth from the first reading after connections to the last, and the peak growth in between. */
function growth(run: PhaseRun, p: Process): { first: Reading; end: Reading; growth: number; peak: number } {
  const after = run.readings.slice(1);
  const first = after[0];
  const end = after[after.length - 1];
  return { first, end, growth: end[p].rss - first[p].rss, peak: Math.max(...after.map((r) => r[p].rss - first[p].rss)) };
}

function summaryRow(run: PhaseRun, p: Process, upstream: PhaseRun | undefined): SoakRow {
  const g = growth(run, p);
  const verdict = MB(g.growth) <= SOAK_GOAL_MIB ? `within ${SOAK_GOAL_MIB} MiB` : `OVER ${SOAK_GOAL_MIB} MiB`;
  const values: Record<string, number> = {
    connections: g.end.connections,
    firstRssMiB: MB(g.first[p].rss),
    endRssMiB: MB(g.end[p].rss),
    growthMiB: MB(g.growth),
    peakGrowthMiB: MB(g.peak),
    firstHeapMiB: MB(g.first[p].heap),
    endHeapMiB: MB(g.end[p].heap),
    heapGrowthMiB: MB(g.end[p].heap - g.first[p].heap),
    idleGrowthMiB: MB(run.idle[p].rss - g.first[p].rss),
  };
  if (upstream) {
    const theirs = growth(upstream, p);
    values.endRssVsUpstream = g.end[p].rss / theirs.end[p].rss;
    // A ratio of growths means something only when upstream's is more than RSS's noise and Kanal's is a growth at all.
    if (MB(theirs.growth) >= 1 && g.growth >= 0) values.growthVsUpstream = g.growth / theirs.growth;
  }
  return {
    id: `soak.${run.product}.${run.phase}.${p}`,
    label: `${PRODUCT_LABEL[run.product]} ${PHASE_LABEL[run.phase]}, ${p.padEnd(6)} ${verdict}`,
    values,
  };
}

function outcomeLine(run: PhaseRun): string {
  const counts = Object.entries(run.outcomes)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([k, v]) => `${k} ${v}`);
  const errors = run.errors > 0 ? `; ${run.errors} failed, first: ${run.firstError ?? '?'}` : '';
  return `${PRODUCT_LABEL[run.product].trim()} ${PHASE_LABEL[run.phase]}: ${counts.join(', ')}${errors}`;
}

/** Warnings for what the soak was not meant to see: growth over the goal, a refused case let in, failures. */
function warn(env: Env, run: PhaseRun): void {
  const what = `soak (${run.product}, ${PHASE_LABEL[run.phase]})`;
  for (const p of PROCESSES) {
    const g = MB(growth(run, p).growth);
    if (g > SOAK_GOAL_MIB)
      env.warnings.push(`${what}: the ${p}'s RSS grew ${g.toFixed(1)} MiB after the first reading (goal <= ${SOAK_GOAL_MIB} MiB)`);
  }
  for (const kind of ['no-cert', 'rogue']) {
    const held = run.outcomes[`${kind} held`];
    if (held)
      env.warnings.push(`${what}: ${held} ${kind} connection(s) not refused within ${env.params.soakHoldMs} ms (closed by the client)`);
  }
  if (run.errors > 0) env.warnings.push(`${what}: ${run.errors} connection(s) failed, first: ${run.firstError ?? '?'}`);
}

/** Readings every soakEvery (fewer than four readings in a run would show no trend: then a quarter of it). */
function readingInterval(env: Env): number {
  const { soakConnections: n, soakEvery: every } = env.params;
  return n >= 4 * every ? every : Math.max(1, Math.floor(n / 4));
}

export async function runSoak(env: Env): Promise<SoakReport> {
  const every = readingInterval(env);
  const p = env.params;
  const target = await handshakeTarget(env);
  // A port that was free a moment ago and that nothing here listens on: the agent's dial is refused (502).
  const refusedPort = await freePort(BACKEND_HOST);
  const batches: Record<Phase, Batch> = {
    handshakes: (e, pair, from, n) =>
      e.client.call(
        'handshakes',
        { target: { ...target, port: pair.agentPort }, from, n, concurrency: p.soakHandshakeConcurrency, holdMs: p.soakHoldMs },
        600_000,
      ),
    tunnelled: (e, pair, from, n) =>
      e.client.call(
        'churn',
        { path: pair.product === 'kanal' ? 'kanal-cp' : 'upstream-cp', from, n, concurrency: p.soakTunnelConcurrency, refusedPort },
        600_000,
      ),
  };
  const runs: PhaseRun[] = [];
  for (const phase of PHASES) {
    for (const product of products(env)) runs.push(await soakPhase(env, product, phase, every, batches[phase]));
  }
  const upstreamOf = (run: PhaseRun): PhaseRun | undefined =>
    run.product === 'kanal' ? runs.find((r) => r.product === 'upstream' && r.phase === run.phase) : undefined;
  for (const run of runs) warn(env, run);
  return {
    connections: p.soakConnections,
    every,
    goalMiB: SOAK_GOAL_MIB,
    idleS: IDLE_MS / 1000,
    readings: runs.flatMap((run) => [...run.readings, run.idle].map((r) => readingRow(run, r))),
    summary: runs.flatMap((run) => PROCESSES.map((proc) => summaryRow(run, proc, upstreamOf(run)))),
    outcomes: runs.map(outcomeLine),
  };
}
