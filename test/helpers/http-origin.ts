/**
 * An HTTP origin for the forward proxy's tests (node:http on 127.0.0.1):
 * counts its TCP connections and records each request it was sent, and
 * answers by route. Closed by the test's teardown.
 */
import http from 'node:http';
import net from 'node:net';
import type { ExecutionContext } from 'ava';

export interface SeenRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: string;
  /** Which of the origin's connections (1, 2, ...) it came on. */
  connection: number;
}

export interface Origin {
  port: number;
  address: string;
  /** TCP connections accepted so far. */
  connections: number;
  seen: SeenRequest[];
  server: http.Server;
}

export type Route = (req: http.IncomingMessage, res: http.ServerResponse, body: string) => void;

const connectionNumbers = new WeakMap<net.Socket, number>();

export async function startOrigin(t: ExecutionContext, route: Route): Promise<Origin> {
  const origin: Origin = { port: 0, address: '', connections: 0, seen: [], server: http.createServer() };
  const server = origin.server;
  server.keepAliveTimeout = 60_000;
  server.on('connection', (s: net.Socket) => {
    origin.connections++;
    connectionNumbers.set(s, origin.connections);
  });
  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      origin.seen.push({
        method: req.method ?? '',
        url: req.url ?? '',
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        body,
        connection: connectionNumbers.get(req.socket) ?? 0,
      });
      route(req, res, body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  origin.port = (server.address() as net.AddressInfo).port;
  origin.address = `127.0.0.1:${origin.port}`;
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return origin;
}

/** An http.Agent whose connections go to `connect()` (a proxy's Unix socket or port) and are counted; one socket, kept alive. */
export class ProxyAgent extends http.Agent {
  opened = 0;
  constructor(private readonly connect: () => net.Socket) {
    super({ keepAlive: true, maxSockets: 1 });
  }
  override createConnection(): net.Socket {
    this.opened++;
    return this.connect();
  }
}

export interface Answer {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

/** A request in absolute form (`url`) through `agent`; the answer read whole. */
export function proxyRequest(
  agent: http.Agent,
  method: string,
  url: string,
  opts: { headers?: http.OutgoingHttpHeaders; body?: string | Buffer[]; timeoutMs?: number } = {},
): Promise<Answer> {
  const u = new URL(url);
  return new Promise<Answer>((resolve, reject) => {
    const req = http.request({
      agent,
      method,
      host: u.hostname,
      port: u.port,
      path: url,
      headers: opts.headers,
      timeout: opts.timeoutMs ?? 15_000,
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${url}: no answer in time`)));
    req.on('error', reject);
    req.on('response', (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
    });
    const body = opts.body;
    if (Array.isArray(body)) for (const b of body) req.write(b);
    else if (body !== undefined) req.write(body);
    req.end();
  });
}
