/** What every suite works with, and the one primitive they share: a timed bulk measurement. */
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { writeThrowawayPki, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import type { Worker } from './rpc.js';
import {
  productOf,
  type BackendPorts,
  type ClientConfig,
  type FlowMode,
  type LoadgenCommands,
  type Path,
  type Product,
} from './loadgen-protocol.js';
import { makeTempDir } from './children.js';
import {
  BACKEND_HOST,
  NODE_HOST,
  readPem,
  startLoadgen,
  startPair,
  type KanalPair,
  type StartOptions,
  type TunnelPair,
} from './cluster.js';
import type { Params } from './params.js';
import { cpuSecondsOf, descendantPids, rssBytes } from './proc.js';
import { findUpstream, startUpstreamPair, type UpstreamBinaries } from './upstream.js';

export interface Env {
  dir: string;
  pki: ThrowawayPki;
  transport: string;
  /** The kanal CLI every Kanal pair runs (--kanal-cli: another build's, for A/B runs); undefined: this checkout's. */
  kanalCli?: string;
  /** --audit: every Kanal pair writes audit logs. */
  audit: boolean;
  /** --kanal-workers: every Kanal server runs `--workers N`. */
  kanalWorkers?: number;
  params: Params;
  pair: KanalPair;
  /** Upstream's server and agent in the same topology; both undefined when its binaries are absent. */
  upstream?: TunnelPair;
  upstreamBinaries?: UpstreamBinaries;
  /** Why upstream does not run, when it does not. */
  upstreamAbsent?: string;
  /** The backend worker's listeners. */
  ports: BackendPorts;
  client: Worker<LoadgenCommands>;
  backend: Worker<LoadgenCommands>;
  warnings: string[];
  progress: (text: string) => void;
}

export interface SetUpOptions {
  transport: string;
  params: Params;
  /** --kanal-cli: another build's dist/src/cli/main.js. */
  kanalCli?: string;
  audit: boolean;
  kanalWorkers?: number;
  /** --upstream: a directory, "none", or undefined (look in the usual places; see upstream.ts). */
  upstreamOption: string | undefined;
  warnings: string[];
  progress: (text: string) => void;
}

/**
 * A temp dir with a throwaway PKI, the backend and client workers, a Kanal
 * pair and (when its binaries are found) an upstream pair, the client aimed
 * at both. Everything is stopped by children.ts's cleanUp().
 */
export async function setUp(o: SetUpOptions): Promise<Env> {
  const dir = makeTempDir('kanal-bench-');
  o.progress(`setting up in ${dir}`);
  const pki = await writeThrowawayPki(path.join(dir, 'pki'), { serverIps: [NODE_HOST] });
  const backend = startLoadgen(dir, 'backend');
  const client = startLoadgen(dir, 'client');
  const ports = await backend.call('serve', {
    host: BACKEND_HOST,
    certPem: readPem(pki.serverCert),
    keyPem: readPem(pki.serverKey),
    chunkBytes: o.params.chunkBytes,
  });
  const pair = await startPair({
    dir,
    tag: 'bench',
    pki,
    transport: o.transport,
    backend: ports,
    cli: o.kanalCli,
    audit: o.audit,
    ...(o.kanalWorkers === undefined ? {} : { workers: o.kanalWorkers }),
  });
  const env: Env = {
    dir,
    pki,
    transport: o.transport,
    kanalCli: o.kanalCli,
    audit: o.audit,
    ...(o.kanalWorkers === undefined ? {} : { kanalWorkers: o.kanalWorkers }),
    params: o.params,
    pair,
    ports,
    client,
    backend,
    warnings: o.warnings,
    progress: o.progress,
  };
  const found = findUpstream(o.upstreamOption, dir);
  if ('binaries' in found) {
    o.progress(`starting upstream's proxy-server and proxy-agent (${found.binaries.origin})`);
    env.upstreamBinaries = found.binaries;
    env.upstream = await startUpstreamPair({ dir, tag: 'upstream', pki, binaries: found.binaries });
  } else {
    env.upstreamAbsent = found.absent;
    o.progress(`upstream: ${found.absent}; comparing with direct connections only`);
  }
  await aimClient(env);
  return env;
}

/** Points the load generator at env's pairs (their Unix sockets, Kanal's node-side listeners, and `extra`: a SOCKS5 door). */
export async function aimClient(env: Env, extra: Pick<ClientConfig, 'socks5'> = {}): Promise<void> {
  await env.client.call('configure', {
    ...extra,
    caPem: readPem(env.pki.caCert),
    uds: { kanal: env.pair.uds, upstream: env.upstream?.uds },
    backendHost: BACKEND_HOST,
    backend: env.ports,
    nodeHost: NODE_HOST,
    node: env.pair.node,
    chunkBytes: env.params.chunkBytes,
  });
}

/** The products whose pairs run in `env`: Kanal always, upstream when its binaries were found. */
export function products(env: Env): Product[] {
  return env.upstream ? ['kanal', 'upstream'] : ['kanal'];
}

/** Keeps the paths whose product runs in `env` (drops upstream's when it is absent). */
export function runnable<T extends { path: Path }>(env: Env, paths: readonly T[]): T[] {
  return paths.filter((p) => productOf(p.path) !== 'upstream' || env.upstream !== undefined);
}

export function pairOf(env: Env, product: Product): TunnelPair {
  if (product === 'kanal') return env.pair;
  if (!env.upstream) throw new Error('upstream is not running');
  return env.upstream;
}

/**
 * Runs `fn` against a server and agent of `product` started just for it
 * (memory figures free of what earlier runs left on the heap, or extra node
 * flags for Kanal's), then stops them and points the client back at the main pairs.
 */
export async function withFreshPair<T>(
  env: Env,
  product: Product,
  tag: string,
  fn: (env: Env) => Promise<T>,
  kanal: Pick<StartOptions, 'nodeArgs' | 'serverArgs' | 'agentArgs'> = {},
): Promise<T> {
  const o = { dir: env.dir, tag, pki: env.pki };
  let fresh: Env;
  if (product === 'kanal') {
    fresh = {
      ...env,
      pair: await startPair({
        ...o,
        transport: env.transport,
        backend: env.ports,
        cli: env.kanalCli,
        audit: env.audit,
        ...(env.kanalWorkers === undefined ? {} : { workers: env.kanalWorkers }),
        ...kanal,
      }),
    };
  } else {
    if (!env.upstreamBinaries) throw new Error('upstream is not running');
    fresh = { ...env, upstream: await startUpstreamPair({ ...o, binaries: env.upstreamBinaries }) };
  }
  try {
    await aimClient(fresh);
    return await fn(fresh);
  } finally {
    await pairOf(fresh, product).stop();
    await aimClient(env);
  }
}

let restarts = 0;

/** Replaces env's upstream pair with a freshly started one. */
export async function restartUpstream(env: Env): Promise<void> {
  if (!env.upstream || !env.upstreamBinaries) return;
  await env.upstream.stop();
  env.upstream = await startUpstreamPair({ dir: env.dir, tag: `upstream-${++restarts}`, pki: env.pki, binaries: env.upstreamBinaries });
  await aimClient(env);
}

/** Server and agent of the product carrying `path`; none for the direct paths. */
export function proxyPids(env: Env, path: Path): number[] {
  const product = productOf(path);
  if (!product) return [];
  const pair = pairOf(env, product);
  // A server with --workers: its primary and every worker.
  return [pair.server.pid, ...descendantPids(pair.server.pid), pair.agent.pid];
}

export function endpointPids(env: Env): number[] {
  return [env.client.pid, env.backend.pid];
}

export function pairRss(pair: TunnelPair): { server: number; agent: number } {
  const server = [pair.server.pid, ...descendantPids(pair.server.pid)];
  return { server: server.reduce((n, pid) => n + rssBytes(pid), 0), agent: rssBytes(pair.agent.pid) };
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

/** Opens `count` flows in a new group (failing after openTimeoutMs, default 15 s); stop() closes them. */
export async function openFlows(env: Env, path: Path, mode: FlowMode, count: number, openTimeoutMs?: number): Promise<FlowRun> {
  const group = `g${++groupSeq}`;
  const p = env.params;
  const seconds = (p.warmupMs + p.measureMs + p.stallFillMs) / 1000 + 2;
  const maxBytesPerFlow = Math.ceil((p.capBytesPerSecond * seconds) / count);
  await env.client.call('openFlows', { group, path, mode, count, maxBytesPerFlow, openTimeoutMs }, 30_000);
  return {
    async stop() {
      await env.client.call('stopFlows', { group });
    },
  };
}

/**
 * Waits until neither worker has a socket open (the previous run has fully
 * torn down); false after `timeoutMs`, with a warning unless `quiet`.
 */
export async function waitIdle(env: Env, timeoutMs = 15_000, quiet = false): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const [c, b] = await Promise.all([env.client.call('counters', null), env.backend.call('counters', null)]);
    if (c.open === 0 && b.open === 0) return true;
    if (Date.now() > deadline) {
      if (!quiet) env.warnings.push(`connections still open ${timeoutMs} ms after a run (client ${c.open}, backend ${b.open})`);
      return false;
    }
    await sleep(20);
  }
}

/**
 * Measures the receiving side's byte rate over `measureMs` after `warmupMs`,
 * with the CPU time of the proxy carrying `path` (server + agent) and of the
 * endpoints over the same window. `during` runs while the window is open (e.g. RSS sampling).
 */
export async function measureReceive(env: Env, path: Path, receiverIsBackend: boolean, during?: () => Promise<void>): Promise<FlowSample> {
  const p = env.params;
  const receiver = receiverIsBackend ? env.backend : env.client;
  const proxies = proxyPids(env, path);
  await sleep(p.warmupMs);
  const c0 = await receiver.call('counters', null);
  const k0 = cpuSecondsOf(proxies);
  const e0 = cpuSecondsOf(endpointPids(env));
  await Promise.all([sleep(p.measureMs), during?.()]);
  const c1 = await receiver.call('counters', null);
  const k1 = cpuSecondsOf(proxies);
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
    return await measureReceive(env, path, mode === 'up');
  } finally {
    await run.stop();
    await waitIdle(env);
  }
}
