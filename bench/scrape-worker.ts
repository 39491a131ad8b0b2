/**
 * Scrape worker (section 9a, suite-scrape.ts), started by the driver in one of two roles:
 *
 * - targets: `count` tiny HTTP servers, one port each, in this one process, each answering
 *   GET /metrics with a fixed Prometheus text page. It models the listening side of many
 *   node-exporters (one connection per scraper, kept alive, no idle timeout, as Go's http.Server
 *   has none by default), not their CPU: a page is built once and written from memory.
 * - scraper: a Prometheus-like client: every target is scraped once per interval at its own
 *   offset within it, over keep-alive HTTP/1.1 (Node's http client on an http.Agent), through
 *   a proxy by absolute-form requests or by one CONNECT tunnel per target.
 */
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { httpConnect } from '../kit/demo/proxy-client.js';
import { serveCommands } from './rpc.js';
import type { ProxyAddress, ScrapeCommands, ScrapeResult, ScrapeSpec, ScrapeVia } from './scrape-protocol.js';
import { errorMessage } from '../src/common/error-message.js';

// ---------------------------------------------------------------- targets role

let targetSockets = 0;
const targetServers: http.Server[] = [];

/** A Prometheus text page of about `bytes` bytes (node-exporter's, gzipped, is of the order of 10 KiB). */
function metricsPage(bytes: number, port: number): Buffer {
  const lines: string[] = ['# HELP bench_metric A series of a bench target.', '# TYPE bench_metric gauge'];
  let size = lines.join('\n').length + 1;
  for (let i = 0; size < bytes; i++) {
    const line = `bench_metric{target="${port}",series="${i}"} ${i}.5`;
    lines.push(line);
    size += line.length + 1;
  }
  return Buffer.from(`${lines.join('\n')}\n`);
}

function listenTarget(host: string, bodyBytes: number): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    let page: Buffer = Buffer.alloc(0);
    const server = http.createServer((req, res) => {
      req.resume();
      if (req.url !== '/metrics') {
        res.writeHead(404, { 'content-length': '0' }).end();
        return;
      }
      res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4', 'content-length': String(page.length) }).end(page);
    });
    // Go's http.Server (node-exporter's) keeps an idle connection open until the client closes it.
    server.keepAliveTimeout = 0;
    server.on('connection', (s: net.Socket) => {
      targetSockets++;
      s.once('close', () => targetSockets--);
    });
    server.once('error', reject);
    server.listen({ host, port: 0, backlog: 1024 }, () => {
      const port = (server.address() as net.AddressInfo).port;
      page = metricsPage(bodyBytes, port);
      targetServers.push(server);
      resolve(port);
    });
  });
}

// ---------------------------------------------------------------- scraper role

/** Connections opened to the proxy, for the result. */
let opened = 0;

function connectProxy(proxy: ProxyAddress): net.Socket {
  opened++;
  const s = 'uds' in proxy ? net.connect({ path: proxy.uds }) : net.connect({ host: proxy.host, port: proxy.port, noDelay: true });
  s.setNoDelay(true);
  return s;
}

/** A keep-alive agent whose one connection is a CONNECT tunnel to `target` through the proxy. */
class TunnelAgent extends http.Agent {
  constructor(
    private readonly proxy: ProxyAddress,
    private readonly target: string,
    private readonly timeoutMs: number,
  ) {
    super({ keepAlive: true, maxSockets: 1, maxFreeSockets: 1, scheduling: 'lifo' });
  }

  override createConnection(_options: http.ClientRequestArgs, callback?: (err: Error | null, stream: Duplex) => void): Duplex | undefined {
    const s = connectProxy(this.proxy);
    s.once('connect', () => {
      httpConnect(s, this.target, this.timeoutMs).then(
        (tunnel) => {
          tunnel.resume();
          callback?.(null, tunnel);
        },
        (err: Error) => callback?.(err, s),
      );
    });
    s.once('error', (err) => callback?.(err, s));
    return undefined;
  }
}

/** A keep-alive pool of connections to the proxy, for absolute-form requests to any target. */
class ForwardAgent extends http.Agent {
  constructor(private readonly proxy: ProxyAddress) {
    super({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 1024, scheduling: 'lifo' });
  }

  override createConnection(): Duplex {
    return connectProxy(this.proxy);
  }

  /** One pool for every target: the connections go to the proxy, whichever target a request names. */
  override getName(): string {
    return 'proxy';
  }
}

interface Outcome {
  status: number;
  body: string;
  ms: number;
}

/** One GET /metrics of `target` along `via`; resolves with the status and the body's first bytes, rejects on a transport error. */
function scrapeOnce(via: ScrapeVia, agent: http.Agent, target: string, timeoutMs: number): Promise<Outcome> {
  return new Promise<Outcome>((resolve, reject) => {
    const t0 = performance.now();
    const [host, port] = [target.slice(0, target.lastIndexOf(':')), Number(target.slice(target.lastIndexOf(':') + 1))];
    const req = http.request({
      agent,
      // The agent makes the connection (to the proxy); host and port name the target for the Host header.
      host,
      port,
      method: 'GET',
      path: via === 'forward' ? `http://${target}/metrics` : '/metrics',
      headers: { accept: 'text/plain;version=0.0.4', 'user-agent': 'kanal-bench-scraper' },
      signal: AbortSignal.timeout(timeoutMs),
    });
    req.once('response', (res) => {
      let body = '';
      res.on('data', (c: Buffer) => {
        if (body.length < 200) body += c.subarray(0, 200).toString('utf8');
      });
      res.once('end', () => resolve({ status: res.statusCode ?? 0, body, ms: performance.now() - t0 }));
      res.once('error', reject);
    });
    req.once('error', reject);
    req.end();
  });
}

interface Run {
  spec: ScrapeSpec;
  stop: boolean;
  measuring: boolean;
  t0: number;
  result: ScrapeResult;
  inFlight: Set<Promise<void>>;
  timers: NodeJS.Timeout[];
  agents: http.Agent[];
}

const runs = new Map<string, Run>();

function agentsFor(spec: ScrapeSpec): { agentOf: (i: number) => http.Agent; all: http.Agent[] } {
  if (spec.via === 'forward') {
    const shared = new ForwardAgent(spec.proxy);
    return { agentOf: () => shared, all: [shared] };
  }
  const each = spec.targets.map((t) => new TunnelAgent(spec.proxy, t, spec.timeoutMs));
  return { agentOf: (i) => each[i], all: each };
}

async function startScrape(spec: ScrapeSpec): Promise<{ warmupErrors: number; firstError?: string }> {
  if (runs.has(spec.id)) throw new Error(`scrape ${spec.id} is running already`);
  const { agentOf, all } = agentsFor(spec);
  const run: Run = {
    spec,
    stop: false,
    measuring: false,
    t0: 0,
    result: { latenciesMs: [], statuses: {}, skipped: 0, errors: 0, connections: 0, elapsedMs: 0 },
    inFlight: new Set(),
    timers: [],
    agents: all,
  };
  runs.set(spec.id, run);
  opened = 0;
  let warmupErrors = 0;
  let firstWarmupError: string | undefined;
  let warmedUp = 0;
  let resolveWarm: () => void = () => undefined;
  const warm = new Promise<void>((resolve) => (resolveWarm = resolve));
  const n = spec.targets.length;
  spec.targets.forEach((target, i) => {
    let busy = false;
    let first = true;
    const tick = (): void => {
      if (run.stop) return;
      if (busy) {
        if (run.measuring) run.result.skipped++;
        return;
      }
      busy = true;
      const counted = run.measuring;
      const warmup = first;
      first = false;
      const p = scrapeOnce(spec.via, agentOf(i), target, spec.timeoutMs).then(
        (o) => {
          if (!counted) return;
          if (o.status === 200) run.result.latenciesMs.push(o.ms);
          else run.result.statuses[String(o.status)] = (run.result.statuses[String(o.status)] ?? 0) + 1;
        },
        (err: unknown) => {
          if (warmup) {
            warmupErrors++;
            firstWarmupError ??= errorMessage(err);
          } else if (counted) {
            run.result.errors++;
            run.result.firstError ??= errorMessage(err);
          }
        },
      );
      const done = p.finally(() => {
        busy = false;
        run.inFlight.delete(done);
        if (warmup && ++warmedUp === n) resolveWarm();
      });
      run.inFlight.add(done);
    };
    // Spread over the interval, as Prometheus offsets each target's scrapes by a hash of its labels.
    const offset = Math.floor((i * spec.intervalMs) / n);
    run.timers.push(
      setTimeout(() => {
        tick();
        run.timers.push(setInterval(tick, spec.intervalMs));
      }, offset),
    );
  });
  await warm;
  run.measuring = true;
  run.t0 = performance.now();
  return { warmupErrors, firstError: firstWarmupError };
}

async function stopScrape(id: string): Promise<ScrapeResult> {
  const run = runs.get(id);
  if (!run) throw new Error(`no scrape ${id}`);
  run.stop = true;
  const elapsedMs = performance.now() - run.t0;
  for (const t of run.timers) clearTimeout(t);
  await Promise.allSettled([...run.inFlight]);
  for (const a of run.agents) a.destroy();
  runs.delete(id);
  return { ...run.result, connections: opened, elapsedMs };
}

async function probe(via: ScrapeVia, proxy: ProxyAddress, target: string): Promise<{ status: number; body: string }> {
  const agent = via === 'forward' ? new ForwardAgent(proxy) : new TunnelAgent(proxy, target, 5000);
  try {
    const o = await scrapeOnce(via, agent, target, 5000);
    return { status: o.status, body: o.body };
  } catch (err) {
    return { status: 0, body: errorMessage(err) };
  } finally {
    agent.destroy();
  }
}

serveCommands<ScrapeCommands>({
  async serveTargets({ host, count, bodyBytes }) {
    const ports: number[] = [];
    // A few at a time: each listen is cheap, and this keeps the accept queue setup orderly.
    for (let i = 0; i < count; i += 50) {
      ports.push(...(await Promise.all(Array.from({ length: Math.min(50, count - i) }, () => listenTarget(host, bodyBytes)))));
    }
    return { ports };
  },
  openSockets() {
    return { open: targetSockets };
  },
  probe: ({ via, proxy, target }) => probe(via, proxy, target),
  startScrape,
  stopScrape: ({ id }) => stopScrape(id),
});
