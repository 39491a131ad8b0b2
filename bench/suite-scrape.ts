/**
 * 9a. Scrape-like load: what a control-plane Prometheus costs the proxy (docs/frontends.md).
 *
 * `scrapeTargets` tiny HTTP /metrics servers behind the agent (one process, one port each:
 * scrape-worker.ts), each scraped once per `scrapeIntervalMs` at its own offset, keep-alive,
 * through
 * - Kanal's forward proxy, absolute-form requests on the plain TCP listener (--http-proxy-port)
 *   and on the frontend's Unix socket, over a keep-alive pool of connections to the proxy;
 * - Kanal's CONNECT, one tunnel per target kept alive (what a client does for https:// targets);
 * - upstream's CONNECT the same way, and upstream's answer to an absolute-form request (405: it
 *   has no forward proxy) as a row of its own.
 * A row a build cannot serve (no --http-proxy-port in `kanal server --help`, a forward request
 * answered other than 200) says so instead of failing the section.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, withPortRetry } from '../kit/launch/kanal-cli.js';
import { spawnChild } from './children.js';
import { cliFlags } from './cli-probe.js';
import { BACKEND_HOST } from './cluster.js';
import { withFreshPair, type Env } from './env.js';
import type { Product } from './loadgen-protocol.js';
import { cpuSecondsOf, rssBytes } from './proc.js';
import type { DoorsRow } from './report.js';
import { Worker } from './rpc.js';
import type { ProxyAddress, ScrapeCommands, ScrapeResult, ScrapeVia } from './scrape-protocol.js';
import { inRepOrder, percentile, spread } from './stats.js';
import { truncateForLog } from '../src/common/log-safety.js';

const WORKER_SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), 'scrape-worker.js');
const MiB = 1024 * 1024;
/** The plain listener flag of the forward proxy (docs/frontends.md, "Forward proxy"). */
const HTTP_PROXY_PORT = '--http-proxy-port';

type CaseKey = 'kanal-forward-tcp' | 'kanal-forward-uds' | 'kanal-connect-tcp' | 'kanal-connect' | 'upstream-connect' | 'upstream-forward';

interface CaseSpec {
  key: CaseKey;
  product: Product;
  via: ScrapeVia;
  label: string;
}

const CASES: readonly CaseSpec[] = [
  { key: 'kanal-forward-tcp', product: 'kanal', via: 'forward', label: 'Kanal forward proxy, plain TCP listener' },
  { key: 'kanal-forward-uds', product: 'kanal', via: 'forward', label: 'Kanal forward proxy, Unix socket' },
  { key: 'kanal-connect-tcp', product: 'kanal', via: 'connect', label: 'Kanal CONNECT per target, plain TCP listener' },
  { key: 'kanal-connect', product: 'kanal', via: 'connect', label: 'Kanal CONNECT per target, Unix socket' },
  { key: 'upstream-connect', product: 'upstream', via: 'connect', label: 'upstream CONNECT per target, Unix socket' },
  { key: 'upstream-forward', product: 'upstream', via: 'forward', label: 'upstream forward proxy, Unix socket' },
];

interface Measured {
  latencies: number[][];
  cpuS: number;
  scrapes: number;
  windowS: number;
  rss: { server: number[]; agent: number[] };
  errors: number;
  skipped: number;
  conns: number;
  /** Connections the targets still held a second after the scraper closed its own (the proxy's pool to them). */
  lingering: number;
  firstError?: string;
}

const emptyMeasured = (): Measured => ({
  latencies: [],
  cpuS: 0,
  scrapes: 0,
  windowS: 0,
  rss: { server: [], agent: [] },
  errors: 0,
  skipped: 0,
  conns: 0,
  lingering: 0,
});

function startWorker(env: Env, name: string): Worker<ScrapeCommands> {
  return new Worker<ScrapeCommands>(spawnChild({ name, script: WORKER_SCRIPT, logFile: path.join(env.dir, `${name}.log`), ipc: true }));
}

/**
 * Waits (bounded) until the targets hold at most `allowed` connections: the run has torn down
 * (what a forward proxy's pool keeps open to them before the run is allowed to stay).
 */
async function waitTargetsIdle(env: Env, targets: Worker<ScrapeCommands>, allowed: number, timeoutMs = 15_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { open } = await targets.call('openSockets', null);
    if (open <= allowed) return;
    if (Date.now() > deadline) {
      env.warnings.push(`scrape: the targets still hold ${open} connection(s) ${timeoutMs} ms after a run`);
      return;
    }
    await sleep(50);
  }
}

export async function runScrape(env: Env): Promise<{ rows: DoorsRow[]; notes: string[] }> {
  const p = env.params;
  const notes: string[] = [];
  const flags = await cliFlags(env.kanalCli, 'server', [HTTP_PROXY_PORT]);
  const targets = startWorker(env, 'scrape-targets');
  const scraper = startWorker(env, 'scraper');
  try {
    env.progress(`scrape: starting ${p.scrapeTargets} /metrics targets`);
    const { ports } = await targets.call(
      'serveTargets',
      { host: BACKEND_HOST, count: p.scrapeTargets, bodyBytes: p.scrapeBodyBytes },
      120_000,
    );
    const addresses = ports.map((port) => `${BACKEND_HOST}:${port}`);
    // The port is chosen after the targets listen (their ports are the kernel's too), and again if the server lost it to another process.
    return await withPortRetry(async () => {
      const proxyPort = flags.has(HTTP_PROXY_PORT) ? await freePort() : undefined;
      const serverArgs = proxyPort === undefined ? [] : [HTTP_PROXY_PORT, String(proxyPort), '--http-proxy-bind-address', '127.0.0.1'];
      return withFreshPair(
        env,
        'kanal',
        'scrape-kanal',
        async (kenv) => {
          const run = async (uenv: Env): Promise<{ rows: DoorsRow[]; notes: string[] }> => {
            const proxyOf = (c: CaseSpec): ProxyAddress | undefined => {
              if (c.key === 'kanal-forward-tcp' || c.key === 'kanal-connect-tcp')
                return proxyPort === undefined ? undefined : { host: '127.0.0.1', port: proxyPort };
              if (c.product === 'kanal') return { uds: uenv.pair.uds };
              return uenv.upstream ? { uds: uenv.upstream.uds } : undefined;
            };
            const pidsOf = (c: CaseSpec): [number, number] => {
              const pair = c.product === 'kanal' ? uenv.pair : uenv.upstream!;
              return [pair.server.pid, pair.agent.pid];
            };
            // Which cases this build (and upstream) can serve: a probe request outside any timing.
            const unavailable = new Map<CaseKey, string>();
            const runnableCases: CaseSpec[] = [];
            for (const c of CASES) {
              if (c.product === 'upstream' && !uenv.upstream) continue;
              const proxy = proxyOf(c);
              if (!proxy) {
                unavailable.set(c.key, `not available in this build (\`kanal server --help\` names no ${HTTP_PROXY_PORT})`);
                continue;
              }
              const probe = await scraper.call('probe', { via: c.via, proxy, target: addresses[0] });
              if (probe.status === 200) {
                runnableCases.push(c);
                continue;
              }
              const answer = probe.status === 0 ? `no answer: ${truncateForLog(probe.body, 120)}` : `answers ${probe.status}`;
              unavailable.set(
                c.key,
                c.product === 'kanal'
                  ? `not available in this build (an absolute-form GET ${answer})`
                  : `${probe.status === 0 ? 'fails' : String(probe.status)}: upstream ${answer} to an absolute-form GET (it has no forward proxy)`,
              );
            }
            const measured = new Map<CaseKey, Measured>(runnableCases.map((c) => [c.key, emptyMeasured()]));
            const windowMs = p.scrapeRounds * p.scrapeIntervalMs;
            for (let rep = 0; rep < p.scrapeReps; rep++) {
              for (const c of inRepOrder(runnableCases, rep)) {
                env.progress(`scrape: ${c.label}, ${p.scrapeTargets} targets, run ${rep + 1}/${p.scrapeReps}`);
                const m = measured.get(c.key)!;
                const id = `${c.key}-${rep}`;
                const pids = pidsOf(c);
                const before = (await targets.call('openSockets', null)).open;
                const warm = await scraper.call(
                  'startScrape',
                  {
                    id,
                    via: c.via,
                    proxy: proxyOf(c)!,
                    targets: addresses,
                    intervalMs: p.scrapeIntervalMs,
                    timeoutMs: Math.min(10_000, p.scrapeIntervalMs),
                  },
                  p.scrapeIntervalMs * 3 + 60_000,
                );
                if (warm.warmupErrors > 0)
                  env.warnings.push(`scrape ${c.label}: ${warm.warmupErrors} warm-up scrape(s) failed, first: ${warm.firstError ?? '?'}`);
                const cpu0 = cpuSecondsOf(pids);
                await sleep(windowMs);
                const cpu1 = cpuSecondsOf(pids);
                m.rss.server.push(rssBytes(pids[0]));
                m.rss.agent.push(rssBytes(pids[1]));
                const r: ScrapeResult = await scraper.call('stopScrape', { id }, 60_000);
                if (c.via === 'forward') {
                  // The proxy keeps a pool of connections to the destinations: counted, not waited for.
                  await sleep(1000);
                  m.lingering = Math.max(m.lingering, (await targets.call('openSockets', null)).open - before);
                } else await waitTargetsIdle(env, targets, before);
                m.latencies.push(r.latenciesMs);
                m.cpuS += cpu1 - cpu0;
                m.scrapes += r.latenciesMs.length;
                m.windowS += r.elapsedMs / 1000;
                m.errors += r.errors + Object.values(r.statuses).reduce((a, b) => a + b, 0);
                m.skipped += r.skipped;
                m.conns = Math.max(m.conns, r.connections);
                m.firstError ??= r.firstError ?? (Object.keys(r.statuses).length > 0 ? `answers ${JSON.stringify(r.statuses)}` : undefined);
              }
            }
            return { rows: toRows(measured, unavailable), notes };
          };
          return withUpstreamPair(kenv, run);
        },
        { serverArgs },
      );
    });
  } finally {
    await Promise.allSettled([targets.child.stop(), scraper.child.stop()]);
    notes.push(
      `9a models ${p.scrapeTargets} node-exporters as ${p.scrapeTargets} ports of one process answering a fixed ${(p.scrapeBodyBytes / 1024).toFixed(0)} KiB page (about a gzipped`,
      "node-exporter page; the targets' own CPU is not what is measured). The scraper is Node's http client, not Prometheus: forward rows",
      'share one keep-alive pool of connections to the proxy for every target (as Go does for http:// targets behind one proxy), CONNECT',
      'rows keep one tunnel per target. Every target is scraped once per interval at its own offset; a scrape still running at its next tick',
      `skips that tick (counted). ${p.scrapeTargets === 1000 && p.scrapeIntervalMs === 15_000 ? "The issue's load: 1,000 targets every 15 s." : `Compressed: ${p.scrapeTargets} targets every ${(p.scrapeIntervalMs / 1000).toFixed(1)} s (--full: 1,000 every 15 s, the same scrapes/s as quick's 200 every 3 s).`}`,
      'The plain TCP listener and the Unix socket are different transports to the proxy: "/CONNECT" compares forward with CONNECT on the',
      "same listener. pool conns: connections the targets still held a second after the scraper closed its own (the forward proxy's pool).",
    );
  }
}

/** Upstream's rows on a pair of its own, started for this section, when its binaries are there. */
function withUpstreamPair<T>(kenv: Env, run: (env: Env) => Promise<T>): Promise<T> {
  if (!kenv.upstreamBinaries) return run(kenv);
  return withFreshPair(kenv, 'upstream', 'scrape-upstream', run);
}

function toRows(measured: Map<CaseKey, Measured>, unavailable: Map<CaseKey, string>): DoorsRow[] {
  const pooled = (m: Measured): number[] => m.latencies.flat();
  const cpuUs = (m: Measured): number => (m.cpuS * 1e6) / Math.max(1, m.scrapes);
  const connect = measured.get('kanal-connect');
  const upstream = measured.get('upstream-connect');
  const rows: DoorsRow[] = [];
  for (const c of CASES) {
    const note = unavailable.get(c.key);
    const m = measured.get(c.key);
    if (!m) {
      if (note) rows.push({ id: `doors.scrape.${c.key}`, table: 'scrape', label: c.label, values: {}, note });
      continue;
    }
    const s = pooled(m);
    const values: Record<string, number> = {
      p50Ms: percentile(s, 50),
      p99Ms: percentile(s, 99),
      p50Spread: spread(m.latencies.map((x) => percentile(x, 50))),
      cpuUsPerScrape: cpuUs(m),
      serverRssMiB: Math.max(...m.rss.server) / MiB,
      agentRssMiB: Math.max(...m.rss.agent) / MiB,
      scrapesPerS: m.scrapes / Math.max(1e-9, m.windowS),
      proxyConns: m.conns,
      ...(c.via === 'forward' ? { poolConns: m.lingering } : {}),
      errors: m.errors,
      skipped: m.skipped,
      scrapes: m.scrapes,
    };
    // Forward on a listener next to CONNECT on the same one: the door's cost apart from the transport's.
    const sameListener = c.key === 'kanal-forward-tcp' ? measured.get('kanal-connect-tcp') : connect;
    if (c.product === 'kanal' && c.via === 'forward' && sameListener) {
      values.vsConnectP50 = values.p50Ms / percentile(pooled(sameListener), 50);
      if (sameListener.cpuS > 0 && m.cpuS > 0) values.vsConnectCpu = values.cpuUsPerScrape / cpuUs(sameListener);
    }
    if (c.product === 'kanal' && upstream) {
      values.vsUpstreamP50 = values.p50Ms / percentile(pooled(upstream), 50);
      values.vsUpstreamP99 = values.p99Ms / percentile(pooled(upstream), 99);
      if (upstream.cpuS > 0 && m.cpuS > 0) values.vsUpstreamCpu = values.cpuUsPerScrape / cpuUs(upstream);
    }
    rows.push({
      id: `doors.scrape.${c.key}`,
      table: 'scrape',
      label: c.label,
      values,
      note: m.firstError ? `first error: ${truncateForLog(m.firstError, 120)}` : undefined,
    });
  }
  return rows;
}
