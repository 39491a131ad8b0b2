/**
 * HTTP CONNECT frontend: "CONNECT host:port HTTP/1.1" from the KAS becomes a
 * dial through an agent; answers use upstream's status codes.
 */
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { parseHostPort, formatHostPort } from '../common/host-port.js';
import { DialError, HTTP_STATUS_FOR_FAILURE } from '../tunnel/errors.js';
import { splice } from '../tunnel/splice.js';
import type { BackendDialer } from './backend-dialer.js';

function reply(socket: Duplex, status: number, message: string): void {
  const reason = http.STATUS_CODES[status] ?? 'Error';
  const body = `${message}\n`;
  socket.end(
    `HTTP/1.1 ${status} ${reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}

export function createHttpConnectFrontend(dialer: BackendDialer, log: Logger): http.Server {
  const server = http.createServer({ headersTimeout: 30_000, requestTimeout: 60_000 });
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    log.warn({ method: req.method, url: req.url, peer: req.socket.remoteAddress }, 'refused non-CONNECT request');
    res.writeHead(405, { allow: 'CONNECT', 'content-type': 'text/plain', connection: 'close' });
    res.end(`method ${req.method} not allowed: this is an HTTP CONNECT proxy\n`);
  });
  server.on('connect', (req: http.IncomingMessage, socket: Duplex, head: Buffer) => {
    const authority = req.url ?? '';
    let address: string;
    try {
      address = formatHostPort(parseHostPort(authority));
    } catch (err) {
      log.warn({ authority, err: (err as Error).message }, 'refused CONNECT: malformed authority');
      reply(socket, 400, `bad CONNECT authority: ${(err as Error).message}`);
      return;
    }
    const abort = new AbortController();
    const onGone = (): void => abort.abort();
    socket.once('close', onGone);
    socket.on('error', () => abort.abort());
    dialer.dial(address, abort.signal).then(
      (conn) => {
        socket.off('close', onGone);
        if (socket.destroyed) {
          conn.destroy();
          return;
        }
        socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        // Bytes the client sent right after its request belong to the tunnel.
        if (head.length > 0) conn.write(head);
        splice(socket, conn);
      },
      (err: Error) => {
        socket.off('close', onGone);
        if (socket.destroyed) return;
        const status = err instanceof DialError ? HTTP_STATUS_FOR_FAILURE[err.failure] : 502;
        reply(socket, status, err.message);
      },
    );
  });
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    log.warn({ err: err.message, code: err.code, peer: (socket as Socket).remoteAddress }, 'refused malformed HTTP request on frontend');
    if (socket.writable) reply(socket, 400, `bad request: ${err.code ?? err.message}`);
    else socket.destroy();
  });
  return server;
}
