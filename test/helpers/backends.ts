/**
 * Loopback backends a tunnel dials (echo, banner, sink, source, firehose,
 * HTTP), each counting its connections and closed by the scope.
 */
import { createHash } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { throttle, writeAll } from './byte-streams.js';

export interface Backend {
  port: number;
  address: string;
  /** Sockets accepted so far. */
  accepted(): number;
  /** Sockets currently open. */
  open(): number;
}

/** A TCP server on 127.0.0.1 (half-open sockets allowed) that hands each socket to `onSocket`; the scope closes it and its sockets. */
export async function listenBackend(scope: Scope, onSocket: (s: net.Socket) => void, opts: net.ServerOpts = {}): Promise<Backend> {
  const sockets = new Set<net.Socket>();
  let accepted = 0;
  const server = net.createServer({ allowHalfOpen: true, ...opts }, (s) => {
    accepted++;
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
    s.on('error', () => s.destroy());
    onSocket(s);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  scope.teardown(
    () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  );
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => accepted, open: () => sockets.size };
}

/** Echoes every byte; ends its side when the client ends. */
export function startEchoBackend(scope: Scope): Promise<Backend> {
  return listenBackend(scope, (s) => s.pipe(s));
}

/** Speaks first: writes `banner` as soon as it accepts, then echoes (a server-speaks-first protocol, like SSH or SMTP). */
export function startBannerBackend(scope: Scope, banner: Buffer): Promise<Backend> {
  return listenBackend(scope, (s) => {
    s.write(banner);
    s.pipe(s);
  });
}

/**
 * Reads exactly `size` bytes, then answers with their sha256 (hex) and ends.
 * With `stallUntil`, reads nothing before that promise settles (a node-side
 * reader that is slower than the sender); with `bytesPerSecond`, reads at
 * that pace.
 */
export function startSinkBackend(
  scope: Scope,
  size: number,
  opts: { stallUntil?: Promise<unknown>; bytesPerSecond?: number } = {},
): Promise<Backend> {
  return listenBackend(scope, (s) => {
    const hash = createHash('sha256');
    let got = 0;
    if (opts.bytesPerSecond) throttle(s, opts.bytesPerSecond);
    if (opts.stallUntil) {
      s.pause();
      const go = (): void => void (s.destroyed || s.resume());
      opts.stallUntil.then(go, go);
    }
    s.on('data', (c: Buffer) => {
      if (got >= size) return;
      const take = c.subarray(0, size - got);
      hash.update(take);
      got += take.length;
      if (got === size) s.end(hash.digest('hex'));
    });
  });
}

/**
 * Writes `payload` (with back-pressure), then ends. With `afterFirstByte` it
 * waits for the client to send a byte first (upstream's CONNECT frontend may
 * write a backend's first bytes before its 200 line when the backend speaks first).
 */
export function startSourceBackend(scope: Scope, payload: Buffer, opts: { afterFirstByte?: boolean } = {}): Promise<Backend> {
  return listenBackend(scope, (s) => {
    const send = (): void => {
      s.resume();
      writeAll(s, payload).then(
        () => s.end(),
        () => s.destroy(),
      );
    };
    if (opts.afterFirstByte) s.once('data', send);
    else send();
  });
}

/** Writes 64 KiB chunks (with back-pressure) until the connection goes away. */
export function startFirehoseBackend(scope: Scope): Promise<Backend> {
  return listenBackend(scope, (s) => {
    s.resume();
    firehose(s);
  });
}

const FIREHOSE_CHUNK = Buffer.alloc(64 * 1024, 'f');

/** Writes 64 KiB chunks to `s` with back-pressure until it fails or closes. */
export function firehose(s: net.Socket): void {
  const pump = (): void => {
    while (!s.destroyed && s.writable) {
      if (!s.write(FIREHOSE_CHUNK)) {
        s.once('drain', pump);
        return;
      }
    }
  };
  pump();
}

/** Answers one HTTP request with `body`, like any web server on a node. */
export async function startHttpBackend(scope: Scope, body: string | Buffer): Promise<Backend> {
  const server = http.createServer((req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body), 'x-path': req.url ?? '' }).end(body);
  });
  let accepted = 0;
  let open = 0;
  server.on('connection', (s: net.Socket) => {
    accepted++;
    open++;
    s.once('close', () => open--);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => accepted, open: () => open };
}
