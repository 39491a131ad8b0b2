/**
 * The admin port of upstream (server 8095, agent 8094, on 127.0.0.1):
 * /metrics, and with --enable-profiling Node's CPU profiles and heap
 * snapshots. Upstream's Go pprof paths get a message naming Kanal's own.
 * Kanal's own /status (what is connected now, domain/status-document.ts) and
 * the profiles (a heap snapshot holds the process's secrets) are served only
 * when the port listens on a loopback address (docs/operations.md). Answers
 * are bounded: /status is a page rendered at most once a second per query
 * and shared by its callers (answer-cache.ts), and the port's connections
 * are capped and cut when idle (http-listener.ts).
 */
import type { MetricsSource, Readiness } from './health-server.js';
import type { Logger } from 'pino';
import type { ServerResponse } from 'node:http';
import { sendMetrics } from './health-server.js';
import { sendText, startHttpListener, type HttpListener, type HttpPortLimits, type HttpPortRefusal } from './http-listener.js';
import { AnswerCache } from './answer-cache.js';
import { listenError } from './listen-error.js';
import { DEFAULT_CPU_PROFILE_SECONDS, MAX_CPU_PROFILE_SECONDS, Profiler } from './profiling.js';
import { isLoopbackHost } from './loopback.js';
import { errorMessage } from './error-message.js';

// The setting these messages name, spelt once here: both commands' tables use this module, which sits below them in the layers.
const ENABLE_PROFILING = '--enable-profiling';

/** Where the status document (src/domain/status-document.ts) is served. */
export const STATUS_PATH = '/status';

export interface AdminServerOptions {
  host: string;
  port: number;
  registry: MetricsSource;
  /** --enable-profiling: serve /debug/kanal/cpu-profile and /debug/kanal/heap-snapshot. */
  profiling: boolean;
  /**
   * The status document for a request's query (served on a loopback address
   * only), or what is wrong with the query (answered 400). Asked at most once
   * a second per distinct query.
   */
  status?: (query: URLSearchParams) => object | { error: string };
  /** Without `status`: why this process serves no status document, answered 501 (else 404). */
  statusUnavailable?: string;
  /** /readyz with its detail (the health port gives a caller off this host only ready or not). */
  readiness?: (query: URLSearchParams) => Readiness;
  limits?: HttpPortLimits;
  onRefusal?: (reason: HttpPortRefusal) => void;
  /** The flag that sets `host`, named when /status is refused. */
  hostFlag?: string;
  log: Logger;
}

export const CPU_PROFILE_PATH = '/debug/kanal/cpu-profile';
export const HEAP_SNAPSHOT_PATH = '/debug/kanal/heap-snapshot';

const PPROF_MESSAGE =
  `Kanal runs on Node.js and has no Go pprof. With ${ENABLE_PROFILING} this port serves ${CPU_PROFILE_PATH}?seconds=N ` +
  `(a .cpuprofile, default ${DEFAULT_CPU_PROFILE_SECONDS}, at most ${MAX_CPU_PROFILE_SECONDS}) and ${HEAP_SNAPSHOT_PATH} ` +
  '(a .heapsnapshot); open them in Chrome DevTools. See docs/upstream-flags.md.\n';

/**
 * The admin port is diagnostics only: one it cannot bind is logged and the
 * proxy runs on without it, as upstream's (its default port is fixed, so two
 * processes on a host would otherwise stop each other from starting).
 */
export async function startAdminPort(opts: AdminServerOptions, flags: string): Promise<HttpListener | undefined> {
  try {
    return await startAdminServer(opts);
  } catch (err) {
    opts.log.warn({ err: listenError(err, `${opts.host}:${opts.port}`, flags).message }, 'admin port not served; running without it');
    return undefined;
  }
}

export function startAdminServer(opts: AdminServerOptions): Promise<HttpListener> {
  const profiler = new Profiler();
  const statusAnswers = new AnswerCache();
  const log = opts.log.child({ part: 'admin' });
  const listener = { host: opts.host, port: opts.port, name: 'admin', log, limits: opts.limits, onRefusal: opts.onRefusal };
  return startHttpListener(listener, ({ path, query }, res) => {
    if (path === '/metrics') {
      sendMetrics(opts.registry, res);
    } else if (path === STATUS_PATH) {
      sendStatus(opts, statusAnswers, query, res);
    } else if (path === '/readyz' && opts.readiness) {
      const r = opts.readiness(query);
      sendText(res, r.ready ? 200 : 503, `${r.ready ? 'ok' : 'not ready'}: ${r.detail}\n`);
    } else if (path === '/debug/pprof' || path.startsWith('/debug/pprof/')) {
      sendText(res, 404, PPROF_MESSAGE);
    } else if (path === CPU_PROFILE_PATH || path === HEAP_SNAPSHOT_PATH) {
      if (!opts.profiling) {
        sendText(res, 404, `profiling is off: start with ${ENABLE_PROFILING} to serve it\n`);
      } else if (!isLoopbackHost(opts.host)) {
        sendText(res, 403, notLoopback(opts, path, 'A heap snapshot holds every secret the process does (tokens, keys)'));
      } else if (profiler.running) {
        sendText(res, 409, `a ${profiler.running} is being taken; try again when it is done\n`);
      } else if (path === CPU_PROFILE_PATH) {
        const raw = query.get('seconds') ?? String(DEFAULT_CPU_PROFILE_SECONDS);
        const seconds = Number(raw);
        if (!/^\d+$/.test(raw) || seconds < 1 || seconds > MAX_CPU_PROFILE_SECONDS) {
          sendText(
            res,
            400,
            `seconds must be a whole number from 1 to ${MAX_CPU_PROFILE_SECONDS}, got ${JSON.stringify(raw.slice(0, 20))}\n`,
          );
          return;
        }
        log.info({ seconds }, 'taking a CPU profile');
        profiler.cpuProfile(seconds).then(
          (profile) =>
            res
              .writeHead(200, { 'content-type': 'application/json', 'content-disposition': 'attachment; filename="kanal.cpuprofile"' })
              .end(profile),
          (err: Error) => sendText(res, 500, `${err.message}\n`),
        );
      } else {
        log.info('taking a heap snapshot (the process pauses while it is written)');
        res.writeHead(200, { 'content-type': 'application/json', 'content-disposition': 'attachment; filename="kanal.heapsnapshot"' });
        profiler
          .heapSnapshot((chunk) => res.write(chunk))
          .then(
            () => res.end(),
            (err: Error) => res.destroy(err),
          );
      }
    } else {
      sendText(res, 404, 'not found\n');
    }
  });
}

/** The 403 of what this host alone may read, with how to read it. */
function notLoopback(opts: AdminServerOptions, path: string, why: string): string {
  return (
    `${path} is served only when the admin port listens on a loopback address (127.0.0.1 or ::1); ` +
    `this one listens on ${opts.host}${opts.hostFlag ? ` (${opts.hostFlag})` : ''}. ${why}: ` +
    'set the admin bind address to 127.0.0.1 and ask it on this host.\n'
  );
}

/**
 * The status names every agent and the identity it authenticated with:
 * served to this host only. A port on any other address answers 403 with how
 * to read it instead.
 */
function sendStatus(opts: AdminServerOptions, answers: AnswerCache, query: URLSearchParams, res: ServerResponse): void {
  const status = opts.status;
  if (!status) {
    if (opts.statusUnavailable) sendText(res, 501, `${opts.statusUnavailable}\n`);
    else sendText(res, 404, 'this process serves no status document\n');
    return;
  }
  if (!isLoopbackHost(opts.host)) {
    sendText(res, 403, notLoopback(opts, STATUS_PATH, 'It names agents and their credentials; run `kanal status` on this host instead'));
    return;
  }
  query.sort();
  const answer = answers.get(query.toString(), () => {
    let doc: object;
    try {
      doc = status(query);
    } catch (err) {
      return text(500, `cannot make the status document: ${errorMessage(err)}\n`);
    }
    if ('error' in doc && typeof doc.error === 'string') return text(400, `${STATUS_PATH}: ${doc.error}\n`);
    return { status: 200, contentType: 'application/json', body: Buffer.from(`${JSON.stringify(doc, null, 2)}\n`) };
  });
  // One Buffer shared by every caller of this query: a caller that does not read holds a reference, not a copy.
  res
    .writeHead(answer.status, { 'content-type': answer.contentType, 'content-length': answer.body.length, 'cache-control': 'no-store' })
    .end(answer.body);
}

function text(status: number, body: string): { status: number; contentType: string; body: Buffer } {
  return { status, contentType: 'text/plain', body: Buffer.from(body) };
}
