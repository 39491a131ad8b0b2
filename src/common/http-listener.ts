/**
 * A small HTTP/1.1 listener for the health and admin ports: GET and HEAD
 * only, malformed requests answered 400 and logged at a bounded rate.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Logger } from 'pino';
import { RateLimitedLog } from './rate-limited-log.js';

export interface HttpListener {
  readonly port: number;
  close(): Promise<void>;
}

/** `name` says which port in logs ("health", "admin"). `handle` gets GET and HEAD requests only. */
export async function startHttpListener(
  opts: { host: string; port: number; name: string; log: Logger },
  handle: (path: string, query: URLSearchParams, res: http.ServerResponse) => void,
): Promise<HttpListener> {
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD' }).end();
      return;
    }
    // Split by hand: the target is the peer's, and URL() throws on some of them.
    const target = req.url ?? '/';
    const q = target.indexOf('?');
    handle(q < 0 ? target : target.slice(0, q), new URLSearchParams(q < 0 ? '' : target.slice(q + 1)), res);
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
    refusals.warn(`${peer} ${err.code}`, { err: err.message, code: err.code, peer }, `refused malformed request on ${opts.name} port`);
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
  opts.log.info({ address: `${opts.host}:${port}` }, `${opts.name} server listening`);
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

export function sendText(res: http.ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'content-type': 'text/plain' }).end(text);
}
