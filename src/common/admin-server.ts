/**
 * The admin port of upstream (server 8095, agent 8094, on 127.0.0.1):
 * /metrics, and with --enable-profiling Node's CPU profiles and heap
 * snapshots. Upstream's Go pprof paths get a message naming Kanal's own.
 * Kanal's own /status (what is connected now, domain/status-document.ts) is
 * served only when the port listens on a loopback address (docs/operations.md).
 */
import type { MetricsSource } from './health-server.js';
import type { Logger } from 'pino';
import type { ServerResponse } from 'node:http';
import { sendMetrics } from './health-server.js';
import { sendText, startHttpListener, type HttpListener } from './http-listener.js';
import { listenError } from './listen-error.js';
import { DEFAULT_CPU_PROFILE_SECONDS, MAX_CPU_PROFILE_SECONDS, Profiler } from './profiling.js';
import { isLoopbackHost } from './loopback.js';
import { errorMessage } from './error-message.js';

/** Where the status document (src/domain/status-document.ts) is served. */
export const STATUS_PATH = '/status';

export interface AdminServerOptions {
  host: string;
  port: number;
  registry: MetricsSource;
  /** --enable-profiling: serve /debug/kanal/cpu-profile and /debug/kanal/heap-snapshot. */
  profiling: boolean;
  /** The status document, made on each request to STATUS_PATH (served on a loopback address only). */
  status?: () => object;
  /** The flag that sets `host`, named when /status is refused. */
  hostFlag?: string;
  log: Logger;
}

export const CPU_PROFILE_PATH = '/debug/kanal/cpu-profile';
export const HEAP_SNAPSHOT_PATH = '/debug/kanal/heap-snapshot';

const PPROF_MESSAGE =
  `Kanal runs on Node.js and has no Go pprof. With --enable-profiling this port serves ${CPU_PROFILE_PATH}?seconds=N ` +
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
  const log = opts.log.child({ part: 'admin' });
  return startHttpListener({ host: opts.host, port: opts.port, name: 'admin', log }, (path, query, res) => {
    if (path === '/metrics') {
      sendMetrics(opts.registry, res);
    } else if (path === STATUS_PATH) {
      sendStatus(opts, res);
    } else if (path === '/debug/pprof' || path.startsWith('/debug/pprof/')) {
      sendText(res, 404, PPROF_MESSAGE);
    } else if (path === CPU_PROFILE_PATH || path === HEAP_SNAPSHOT_PATH) {
      if (!opts.profiling) {
        sendText(res, 404, 'profiling is off: start with --enable-profiling to serve it\n');
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

/**
 * The status names every agent and the identity it authenticated with:
 * served to this host only. A port on any other address answers 403 with how
 * to read it instead.
 */
function sendStatus(opts: AdminServerOptions, res: ServerResponse): void {
  if (!opts.status) {
    sendText(res, 404, 'this process serves no status document\n');
  } else if (!isLoopbackHost(opts.host)) {
    sendText(
      res,
      403,
      `${STATUS_PATH} is served only when the admin port listens on a loopback address (127.0.0.1 or ::1); ` +
        `this one listens on ${opts.host}${opts.hostFlag ? ` (${opts.hostFlag})` : ''}. It names agents and their credentials: ` +
        'set the admin bind address to 127.0.0.1 and run `kanal status` on this host.\n',
    );
  } else {
    let body: string;
    try {
      body = `${JSON.stringify(opts.status(), null, 2)}\n`;
    } catch (err) {
      sendText(res, 500, `cannot make the status document: ${errorMessage(err)}\n`);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'cache-control': 'no-store' }).end(body);
  }
}
