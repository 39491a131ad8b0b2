/** What every suite works with, and the one primitive they share: a timed bulk measurement. */
import { setTimeout as sleep } from 'node:timers/promises';
import type { ThrowawayPki } from '../src/pki/throwaway-pki.js';
import type { Worker } from './rpc.js';
import type { BackendPorts, FlowMode, LoadgenCommands, Path } from './loadgen-protocol.js';
import { BACKEND_HOST, NODE_HOST, readPem, startPair, type KanalPair } from './cluster.js';
import type { Params } from './params.js';
import { cpuSecondsOf, rssBytes } from './proc.js';

export interface Env {
  dir: string;
  pki: ThrowawayPki;
  transport: string;
  params: Params;
  pair: KanalPair;
  /** The backend worker's listeners. */
  ports: BackendPorts;
  client: Worker<LoadgenCommands>;
  backend: Worker<LoadgenCommands>;
  warnings: string[];
  progress(text: string): void;
}

/** Points the load generator at `pair` (its Unix socket and node-side listeners). */
export async function aimClient(env: Env, pair: KanalPair): Promise<void> {
  await env.client.call('configure', {
    caPem: readPem(env.pki.caCert),
    uds: pair.server.uds,
    backendHost: BACKEND_HOST,
    backend: env.ports,
    nodeHost: NODE_HOST,
    node: pair.node,
    chunkBytes: env.params.chunkBytes,
  });
}

/**
 * Runs `fn` against a server and agent started just for it (memory figures
 * free of what earlier runs left on the heap, or extra node flags), then
 * stops them and points the client back at the main pair.
 */
export async function withFreshPair<T>(env: Env, tag: string, fn: (env: Env) => Promise<T>, nodeArgs?: string[]): Promise<T> {
  const pair = await startPair({ dir: env.dir, tag, pki: env.pki, transport: env.transport, backend: env.ports, nodeArgs });
  try {
    await aimClient(env, pair);
    return await fn({ ...env, pair });
  } finally {
    await pair.stop();
    await aimClient(env, env.pair);
  }
}

export function kanalPids(env: Env): number[] {
  return [env.pair.server.child.pid, env.pair.agent.pid];
}

export function endpointPids(env: Env): number[] {
  return [env.client.pid, env.backend.pid];
}

export function kanalRss(env: Env): { server: number; agent: number } {
  return { server: rssBytes(env.pair.server.child.pid), agent: rssBytes(env.pair.agent.pid) };
}

export interface FlowSample {
  bytesPerSec: number;
  bytes: number;
  proxyCpuSPerGB: number;
  endpointCpuSPerGB: number;
}

let groupSeq = 0;

export interface FlowRun {
  stop(): Promise<void>;
}

/** Opens `count` flows in a new group; stop() closes them and waits until both workers are idle. */
export async function openFlows(env: Env, path: Path, mode: FlowMode, count: number): Promise<FlowRun> {
  const group = `g${++groupSeq}`;
  const p = env.params;
  const seconds = (p.warmupMs + p.measureMs + p.stallFillMs) / 1000 + 2;
  const maxBytesPerFlow = Math.ceil((p.capBytesPerSecond * seconds) / count);
  await env.client.call('openFlows', { group, path, mode, count, maxBytesPerFlow }, 30_000);
  return {
    async stop() {
      await env.client.call('stopFlows', { group });
    },
  };
}

/** Waits until neither worker has a socket open (the previous run has fully torn down). */
export async function waitIdle(env: Env, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const [c, b] = await Promise.all([env.client.call('counters', null), env.backend.call('counters', null)]);
    if (c.open === 0 && b.open === 0) return;
    if (Date.now() > deadline) {
      env.warnings.push(`connections still open ${timeoutMs} ms after a run (client ${c.open}, backend ${b.open})`);
      return;
    }
    await sleep(20);
  }
}

/**
 * Measures the receiving side's byte rate over `measureMs` after `warmupMs`,
 * with the CPU time of Kanal (server + agent) and of the endpoints over the
 * same window. `during` runs while the window is open (e.g. RSS sampling).
 */
export async function measureReceive(env: Env, receiverIsBackend: boolean, during?: () => Promise<void>): Promise<FlowSample> {
  const p = env.params;
  const receiver = receiverIsBackend ? env.backend : env.client;
  await sleep(p.warmupMs);
  const c0 = await receiver.call('counters', null);
  const k0 = cpuSecondsOf(kanalPids(env));
  const e0 = cpuSecondsOf(endpointPids(env));
  await Promise.all([sleep(p.measureMs), during?.()]);
  const c1 = await receiver.call('counters', null);
  const k1 = cpuSecondsOf(kanalPids(env));
  const e1 = cpuSecondsOf(endpointPids(env));
  const bytes = c1.rx - c0.rx;
  // If the flows hit their byte bound early, the window ends with the last byte.
  const end = c1.t - c1.lastRxAt > 20 ? c1.lastRxAt : c1.t;
  const seconds = (end - c0.t) / 1000;
  if (bytes <= 0 || seconds <= 0) throw new Error('no bytes arrived during the measurement window');
  const gb = bytes / 1e9;
  return { bytes, bytesPerSec: bytes / seconds, proxyCpuSPerGB: (k1 - k0) / gb, endpointCpuSPerGB: (e1 - e0) / gb };
}

/** One complete bulk run: open, warm up, measure, close, wait for teardown. */
export async function bulkRun(env: Env, path: Path, mode: 'up' | 'down', flows: number): Promise<FlowSample> {
  const run = await openFlows(env, path, mode, flows);
  try {
    return await measureReceive(env, mode === 'up');
  } finally {
    await run.stop();
    await waitIdle(env);
  }
}
