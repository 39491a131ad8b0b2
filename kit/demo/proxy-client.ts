/**
 * Minimal clients of the server's frontend, as the kube-apiserver uses it:
 * HTTP CONNECT over a Unix socket, and the gRPC ProxyService (one stream
 * per dial, like konnectivity-client).
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { pino } from 'pino';
import type { Transport } from '../../src/transport/transport.js';
import { PROXY_SERVICE_PROXY, MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import { ALL_FEATURES, formatFeatures, parseFeatures, intersectFeatures, NO_FEATURES } from '../../src/wire/features.js';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { ConnectionStream } from '../../src/tunnel/connection-stream.js';

export class ConnectRefused extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/** Sends CONNECT over `socket` and resolves with it once the tunnel is established. */
export function httpConnect(socket: net.Socket, address: string, timeoutMs = 15_000): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    let head = Buffer.alloc(0);
    const timer = setTimeout(() => fail(new Error(`CONNECT ${address}: no response head within ${timeoutMs} ms`)), timeoutMs);
    const fail = (err: Error): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      socket.destroy();
      reject(err);
    };
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.pause();
      const statusLine = head.subarray(0, head.indexOf('\r\n')).toString('latin1');
      const status = Number(statusLine.split(' ')[1]);
      const rest = head.subarray(end + 4);
      if (status !== 200) {
        socket.destroy();
        reject(new ConnectRefused(status, `${statusLine}: ${rest.toString('utf8').trim()}`));
        return;
      }
      if (rest.length > 0) socket.unshift(rest);
      resolve(socket);
    };
    socket.on('data', onData);
    socket.once('error', fail);
    socket.write(`CONNECT ${address} HTTP/1.1\r\nHost: ${address}\r\n\r\n`);
  });
}

export function connectUnix(path: string): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    const s = net.connect({ path, allowHalfOpen: true });
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}

/**
 * Opens a ProxyService stream and dials `address` through it. `kanal: false`
 * behaves like the upstream konnectivity-client (no extensions).
 */
export async function grpcDial(
  transport: Transport,
  target: string,
  address: string,
  opts: { kanal: boolean; timeoutMs?: number },
): Promise<{ conn: Duplex; close(): void }> {
  const channel = transport.createChannel({ target });
  try {
    const metadata: Record<string, string> = opts.kanal ? { [MD_KANAL_FEATURES]: formatFeatures(ALL_FEATURES) } : {};
    const stream = await channel.openStream(PROXY_SERVICE_PROXY, metadata, opts.timeoutMs ?? 15_000);
    const features = opts.kanal ? intersectFeatures(parseFeatures(stream.metadata.get(MD_KANAL_FEATURES)?.[0]), ALL_FEATURES) : NO_FEATURES;
    const tunnel = new Tunnel(stream, { side: 'agent', features, log: pino({ level: 'silent' }) });
    const conn = new ConnectionStream(await tunnel.dial(address, { timeoutMs: opts.timeoutMs ?? 15_000 }));
    conn.once('close', () => tunnel.close());
    tunnel.once('close', () => channel.close());
    return { conn, close: () => tunnel.close() };
  } catch (err) {
    channel.close();
    throw err;
  }
}
