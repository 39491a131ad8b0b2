/**
 * Test peers for the node:http2 transport: the grpc-js Transport, listeners
 * that inject accepted connections, throwaway TLS material, and handle checks.
 */
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import type { Transport } from '../../src/transport/transport.js';
import { grpcJsTransport } from '../../src/transport/grpc-js/index.js';
import { removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';

// ---------- grpc-js Transport ----------

// The grpc-js side of the interop tests is Kanal's thin grpc-js transport:
// grpc-js itself (a library nobody here wrote) does the HTTP/2 and gRPC work.
export {
  createGrpcJsServer,
  createGrpcJsChannel,
  openGrpcJsStream,
  GrpcJsPacketCall as GrpcJsStream,
  agentServiceDefinition as agentService,
  proxyServiceDefinition as proxyService,
  type GrpcJsChannel,
} from '../../src/transport/grpc-js/index.js';
export const grpcJsPeerTransport: Transport = grpcJsTransport;

// ---------- TLS material ----------

export interface TlsFiles {
  ca: Buffer;
  serverCert: Buffer;
  serverKey: Buffer;
  clientCert: Buffer;
  clientKey: Buffer;
}

let pkiPromise: Promise<TlsFiles> | undefined;

export function throwawayTls(): Promise<TlsFiles> {
  pkiPromise ??= (async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-h2-pki-'));
    try {
      const pki = await writeThrowawayPki(dir);
      return {
        ca: fs.readFileSync(pki.caCert),
        serverCert: fs.readFileSync(pki.serverCert),
        serverKey: fs.readFileSync(pki.serverKey),
        clientCert: fs.readFileSync(pki.agentCert),
        clientKey: fs.readFileSync(pki.agentKey),
      };
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  })();
  return pkiPromise;
}

// ---------- listeners ----------

export interface Listener {
  /** gRPC target for clients. */
  readonly target: string;
  readonly sockets: Set<Duplex>;
  close(): Promise<void>;
}

export function tempDir(): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-h2-'));
  removeOnExit.add(dir); // if an assertion cut the test short before it removed dir
  return dir;
}

/** A Unix-socket listener whose connections go to `onConnection`. */
export async function listenUnix(dir: string, onConnection: (socket: net.Socket) => void): Promise<Listener> {
  const file = path.join(dir, `grpc-${Math.random().toString(36).slice(2)}.sock`);
  const sockets = new Set<Duplex>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
    onConnection(socket);
  });
  await new Promise<void>((resolve) => server.listen(file, resolve));
  return {
    target: `unix://${file}`,
    sockets,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A mutual-TLS listener (ALPN h2) on 127.0.0.1. */
export async function listenTls(files: TlsFiles, onConnection: (socket: tls.TLSSocket) => void): Promise<Listener> {
  const sockets = new Set<Duplex>();
  const server = tls.createServer(
    {
      ca: files.ca,
      cert: files.serverCert,
      key: files.serverKey,
      requestCert: true,
      rejectUnauthorized: true,
      ALPNProtocols: ['h2'],
    },
    (socket) => {
      sockets.add(socket);
      socket.once('close', () => sockets.delete(socket));
      onConnection(socket);
    },
  );
  server.on('tlsClientError', () => {});
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as net.AddressInfo).port;
  return {
    target: `127.0.0.1:${port}`,
    sockets,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

// ---------- handles ----------

/** Active handles and requests, sorted (compare against a baseline). */
export function activeResources(): string[] {
  return process.getActiveResourcesInfo().sort();
}

function counts(list: string[]): Map<string, number> {
  const m = new Map<string, number>();
  for (const r of list) m.set(r, (m.get(r) ?? 0) + 1);
  return m;
}

/** Resources present now beyond `baseline` (transient ones in the baseline are ignored). */
export function extraResources(baseline: string[]): string[] {
  const base = counts(baseline);
  const extra: string[] = [];
  for (const [r, n] of counts(activeResources())) {
    const over = n - (base.get(r) ?? 0);
    for (let i = 0; i < over; i++) extra.push(r);
  }
  return extra;
}

/**
 * Waits until no resources exist beyond `baseline`; returns the extra ones
 * left after `ms` (an empty list means everything was released).
 */
export async function resourcesBackTo(baseline: string[], ms = 3000): Promise<string[]> {
  const deadline = Date.now() + ms;
  for (;;) {
    const extra = extraResources(baseline);
    if (extra.length === 0 || Date.now() > deadline) return extra;
    await new Promise((r) => setTimeout(r, 20));
  }
}
