/**
 * /healthz (the process is alive), /readyz (it can carry traffic) and
 * /metrics (Prometheus text) on a small HTTP listener.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Registry } from 'prom-client';
import type { Logger } from 'pino';
import { RateLimitedLog } from './rate-limited-log.js';

export interface Readiness {
  ready: boolean;
  detail: string;
}

export interface HealthServerOptions {
  host: string;
  port: number;
  readiness: () => Readiness;
  registry?: Registry;
  log: Logger;
}

export interface HealthServer {
  readonly port: number;
  close(): Promise<void>;
}

export async function startHealthServer(opts: HealthServerOptions): Promise<HealthServer> {
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    if (path === '/healthz' || path === '/livez') {
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
    } else if (path === '/readyz') {
      const r = opts.readiness();
      res.writeHead(r.ready ? 200 : 503, { 'content-type': 'text/plain' }).end(`${r.ready ? 'ok' : 'not ready'}: ${r.detail}\n`);
    } else if (path === '/metrics' && opts.registry) {
      const registry = opts.registry;
      registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(text),
        (err: Error) => res.writeHead(500).end(err.message),
      );
    } else {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
    }
  });
  // Any host may reach this port: one line per peer and error every 10 s, with a count of the rest.
  const refusals = new RateLimitedLog(opts.log, 10_000);
  server.on('clientError', (err: NodeJS.ErrnoException, socket) => {
    // A peer that just went away is not worth a warning; anything else is bad input.
    if (err.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const peer = (socket as { remoteAddress?: string }).remoteAddress;
    refusals.warn(`${peer} ${err.code}`, { err: err.message, code: err.code, peer }, 'refused malformed request on health port');
    socket.end('HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nbad request\n');
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  opts.log.info({ address: `${opts.host}:${port}` }, 'health server listening');
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
