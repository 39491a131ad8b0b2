/**
 * /healthz (the process is alive), /readyz (it can carry traffic) and
 * /metrics (Prometheus text) on a small HTTP listener. The port listens on
 * every address by default so the kubelet can probe it, which means anyone
 * who reaches it may ask: a caller off this host learns only whether the
 * process is ready (docs/multi-tenant.md, "What a caller of the health port
 * learns"), and /metrics may be kept to this host (--health-metrics).
 */
import type http from 'node:http';
import type { Registry } from 'prom-client';
import type { Logger } from 'pino';
import { sendText, startHttpListener, type HttpListener, type HttpPortLimits, type HttpPortRefusal } from './http-listener.js';

export interface Readiness {
  ready: boolean;
  detail: string;
}

/** What /metrics serves: a prom-client Registry, or the server's aggregate of its tenants' (docs/multi-tenant.md). */
export type MetricsSource = Pick<Registry, 'metrics' | 'contentType'>;

/** Who /metrics on the health port answers: every caller (upstream's way), or callers on this host only. */
export type HealthMetricsAudience = 'any' | 'loopback';

export interface HealthServerOptions {
  host: string;
  port: number;
  /**
   * `query`: /readyz's parameters (a server of many tenants answers
   * ?tenant=NAME for one). Asked with the query only for a caller on this
   * host; a caller elsewhere gets the answer to no query, without its detail.
   */
  readiness: (query: URLSearchParams) => Readiness;
  registry?: MetricsSource;
  /** Default 'any'. */
  metrics?: HealthMetricsAudience;
  /** Named in the 403 of /metrics to a caller off this host. */
  metricsFlag?: string;
  limits?: HttpPortLimits;
  onRefusal?: (reason: HttpPortRefusal) => void;
  log: Logger;
}

export type HealthServer = HttpListener;

/** Where the health port listens and what it answers whom (the configuration's part of HealthServerOptions). */
export interface HealthPortOptions {
  host: string;
  port: number;
  limits?: HttpPortLimits;
  metrics?: HealthMetricsAudience;
}

export function sendMetrics(registry: MetricsSource, res: http.ServerResponse): void {
  registry.metrics().then(
    (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
    (err: Error) => sendText(res, 500, err.message),
  );
}

const NO_QUERY = new URLSearchParams();

export function startHealthServer(opts: HealthServerOptions): Promise<HealthServer> {
  const listener = { host: opts.host, port: opts.port, name: 'health', log: opts.log, limits: opts.limits, onRefusal: opts.onRefusal };
  return startHttpListener(listener, ({ path, query, fromLoopback }, res) => {
    if (path === '/healthz' || path === '/livez') {
      sendText(res, 200, 'ok\n');
    } else if (path === '/readyz') {
      if (fromLoopback) {
        const r = opts.readiness(query);
        sendText(res, r.ready ? 200 : 503, `${r.ready ? 'ok' : 'not ready'}: ${r.detail}\n`);
      } else {
        // The detail names tenants and counts agents, and ?tenant= would tell a tenant that exists from one that does not.
        const r = opts.readiness(NO_QUERY);
        sendText(res, r.ready ? 200 : 503, r.ready ? 'ok\n' : 'not ready\n');
      }
    } else if (path === '/metrics' && opts.registry) {
      if (fromLoopback || opts.metrics !== 'loopback') sendMetrics(opts.registry, res);
      else
        sendText(
          res,
          403,
          `/metrics on this port answers callers on this host only${opts.metricsFlag ? ` (${opts.metricsFlag})` : ''}: ` +
            'its series name every tenant. Scrape the admin port, or see docs/metrics.md.\n',
        );
    } else {
      sendText(res, 404, 'not found\n');
    }
  });
}
