/**
 * /healthz (the process is alive), /readyz (it can carry traffic) and
 * /metrics (Prometheus text) on a small HTTP listener.
 */
import type http from 'node:http';
import type { Registry } from 'prom-client';
import type { Logger } from 'pino';
import { sendText, startHttpListener, type HttpListener } from './http-listener.js';

export interface Readiness {
  ready: boolean;
  detail: string;
}

/** What /metrics serves: a prom-client Registry, or the server's aggregate of its tenants' (docs/multi-tenant.md). */
export type MetricsSource = Pick<Registry, 'metrics' | 'contentType'>;

export interface HealthServerOptions {
  host: string;
  port: number;
  /** `query`: /readyz's parameters (a server of many tenants answers ?tenant=NAME for one). */
  readiness: (query: URLSearchParams) => Readiness;
  registry?: MetricsSource;
  log: Logger;
}

export type HealthServer = HttpListener;

export function sendMetrics(registry: MetricsSource, res: http.ServerResponse): void {
  registry.metrics().then(
    (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
    (err: Error) => sendText(res, 500, err.message),
  );
}

export function startHealthServer(opts: HealthServerOptions): Promise<HealthServer> {
  return startHttpListener({ host: opts.host, port: opts.port, name: 'health', log: opts.log }, (path, query, res) => {
    if (path === '/healthz' || path === '/livez') {
      sendText(res, 200, 'ok\n');
    } else if (path === '/readyz') {
      const r = opts.readiness(query);
      sendText(res, r.ready ? 200 : 503, `${r.ready ? 'ok' : 'not ready'}: ${r.detail}\n`);
    } else if (path === '/metrics' && opts.registry) {
      sendMetrics(opts.registry, res);
    } else {
      sendText(res, 404, 'not found\n');
    }
  });
}
