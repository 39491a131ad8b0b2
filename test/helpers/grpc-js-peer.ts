/**
 * Test peers for the node:http2 transport: a small, independent grpc-js
 * implementation of the Transport interface (so interop is tested against
 * grpc-js itself, not against Kanal's own grpc-js wrapper), listeners that
 * inject accepted connections, throwaway TLS material, and handle checks.
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import * as grpc from '@grpc/grpc-js';
import { encodePacket } from '../../src/wire/codec.js';
import type { Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT, PROXY_SERVICE_PROXY, type MetadataMap } from '../../src/wire/metadata.js';
import { decodeOrExplain, isInvalid, type Decoded } from '../../src/transport/decoded.js';
import type { PacketStream } from '../../src/transport/packet-stream.js';
import {
  GrpcStatus,
  GrpcStatusError,
  type ChannelOptions,
  type GrpcChannel,
  type GrpcServerTransport,
  type IncomingStream,
  type StreamHandlers,
  type Transport,
} from '../../src/transport/transport.js';
import { writeThrowawayPki } from '../../src/pki/throwaway-pki.js';

// ---------- grpc-js Transport ----------

type ServerCall = grpc.ServerDuplexStream<Decoded, Packet>;
type ClientCall = grpc.ClientDuplexStream<Packet, Decoded>;

function method(p: string): grpc.MethodDefinition<Decoded, Packet> {
  return {
    path: p,
    requestStream: true,
    responseStream: true,
    requestSerialize: (d: Decoded) => encodePacket(d as Packet),
    requestDeserialize: (b: Buffer) => decodeOrExplain(b),
    responseSerialize: (d: Packet) => encodePacket(d),
    responseDeserialize: (b: Buffer) => decodeOrExplain(b) as Packet,
    originalName: p.split('/')[2] ?? p,
  };
}

export const agentService: grpc.ServiceDefinition = { Connect: method(AGENT_SERVICE_CONNECT) };
export const proxyService: grpc.ServiceDefinition = { Proxy: method(PROXY_SERVICE_PROXY) };

export function fromGrpcMetadata(md: grpc.Metadata): MetadataMap {
  const out = new Map<string, string[]>();
  for (const [key, values] of Object.entries(md.toJSON())) {
    out.set(
      key,
      values.map((v) => (typeof v === 'string' ? v : v.toString('base64'))),
    );
  }
  return out;
}

export function toGrpcMetadata(entries: Record<string, string>): grpc.Metadata {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(entries)) {
    const key = k.toLowerCase();
    if (key.endsWith('-bin')) md.set(key, Buffer.from(v, 'base64'));
    else md.set(key, v);
  }
  return md;
}

/** PacketStream over a grpc-js call; pause()/resume() stop reading for back-pressure tests. */
export class GrpcJsStream extends EventEmitter implements PacketStream {
  closed = false;
  private ended = false;

  constructor(
    readonly call: ServerCall | ClientCall,
    private readonly side: 'server' | 'client',
    readonly metadata: MetadataMap,
    readonly peer: string,
  ) {
    super();
    call.on('data', (d: Decoded) => {
      if (isInvalid(d)) this.emit('invalid', d.invalid);
      else this.emit('packet', d);
    });
    call.on('drain', () => this.emit('drain'));
    call.on('error', (err: Error & { code?: number; details?: string }) => {
      this.finish(new GrpcStatusError((err.code ?? GrpcStatus.UNKNOWN) as GrpcStatus, err.details ?? err.message));
    });
    if (side === 'server') {
      call.on('end', () => {
        this.end();
        this.finish(undefined);
      });
      (call as ServerCall).on('cancelled', () => this.finish(new GrpcStatusError(GrpcStatus.CANCELLED, 'cancelled')));
    } else {
      (call as ClientCall).on('status', (s: grpc.StatusObject) => {
        this.finish(s.code === grpc.status.OK ? undefined : new GrpcStatusError(s.code as number as GrpcStatus, s.details));
      });
    }
  }

  send(packet: Packet): boolean {
    if (this.closed || this.ended) return true;
    return this.call.write(packet);
  }

  end(): void {
    if (this.ended) return;
    this.ended = true;
    this.call.end();
  }

  destroy(error?: Error): void {
    if (this.closed) return;
    if (this.side === 'client') (this.call as ClientCall).cancel();
    else {
      this.ended = true;
      const code = error instanceof GrpcStatusError ? error.code : GrpcStatus.UNAVAILABLE;
      this.call.emit('error', Object.assign(new Error(error?.message ?? 'destroyed'), { code, details: error?.message ?? 'destroyed' }));
    }
    this.finish(error);
  }

  pause(): void {
    this.call.pause();
  }

  resume(): void {
    this.call.resume();
  }

  private finish(error: Error | undefined): void {
    if (this.closed) return;
    this.closed = true;
    this.emit('close', error);
  }
}

function incoming(call: ServerCall): IncomingStream {
  const metadata = fromGrpcMetadata(call.metadata);
  const peer = call.getPeer();
  return {
    metadata,
    peer,
    accept(headers: Record<string, string>): PacketStream {
      call.sendMetadata(toGrpcMetadata(headers));
      return new GrpcJsStream(call, 'server', metadata, peer);
    },
    reject(code: GrpcStatus, message: string): void {
      call.emit('error', Object.assign(new Error(message), { code, details: message }));
    },
  };
}

export function createGrpcJsServer(handlers: StreamHandlers, opts: { maxReceiveMessageBytes: number }): GrpcServerTransport {
  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxReceiveMessageBytes,
    'grpc.keepalive_permit_without_calls': 1,
  });
  const route =
    (handler: ((s: IncomingStream) => void) | undefined) =>
    (call: ServerCall): void => {
      if (handler) handler(incoming(call));
      else incoming(call).reject(GrpcStatus.UNIMPLEMENTED, 'not served');
    };
  server.addService(agentService, { Connect: route(handlers.agentConnect) });
  server.addService(proxyService, { Proxy: route(handlers.proxy) });
  const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  return {
    injectConnection(connection: Duplex): void {
      injector.injectConnection(connection);
    },
    close(graceMs: number): Promise<void> {
      injector.drain(graceMs);
      return new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          injector.destroy();
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(timer);
          injector.destroy();
          resolve();
        });
      });
    },
  };
}

export interface GrpcJsChannel extends GrpcChannel {
  readonly client: grpc.Client;
}

export function createGrpcJsChannel(opts: ChannelOptions, extra: grpc.ChannelOptions = {}): GrpcJsChannel {
  const credentials = opts.tls
    ? grpc.credentials.createSsl(opts.tls.ca, opts.tls.key ?? null, opts.tls.cert ?? null)
    : grpc.credentials.createInsecure();
  const options: grpc.ChannelOptions = {
    'grpc.max_receive_message_length': opts.maxReceiveMessageBytes ?? 4 * 1024 * 1024,
    'grpc.use_local_subchannel_pool': 1,
    ...extra,
  };
  if (opts.tls?.serverName) options['grpc.ssl_target_name_override'] = opts.tls.serverName;
  const client = new grpc.Client(opts.target, credentials, options);
  return {
    client,
    openStream(p: string, metadata: Record<string, string>, timeoutMs: number): Promise<PacketStream> {
      return openGrpcJsStream(client, p, metadata, timeoutMs, Infinity);
    },
    close(): void {
      client.close();
    },
  };
}

/** Opens a grpc-js bidi call; `deadline` becomes grpc-timeout. */
export function openGrpcJsStream(
  client: grpc.Client,
  p: string,
  metadata: Record<string, string>,
  timeoutMs: number,
  deadline: grpc.Deadline,
): Promise<GrpcJsStream> {
  return new Promise<GrpcJsStream>((resolve, reject) => {
    const call = client.makeBidiStreamRequest<Packet, Decoded>(p, encodePacket, decodeOrExplain, toGrpcMetadata(metadata), {
      deadline,
    });
    let settled = false;
    const settle = (r: Error | GrpcJsStream): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      call.off('error', onError);
      if (r instanceof Error) reject(r);
      else resolve(r);
    };
    const timer = setTimeout(() => {
      call.cancel();
      settle(new GrpcStatusError(GrpcStatus.DEADLINE_EXCEEDED, 'no response headers'));
    }, timeoutMs);
    const onError = (err: Error & { code?: number; details?: string }): void =>
      settle(new GrpcStatusError((err.code ?? GrpcStatus.UNKNOWN) as GrpcStatus, err.details ?? err.message));
    call.on('error', onError);
    call.once('metadata', (md: grpc.Metadata) => {
      setImmediate(() => {
        if (!settled) settle(new GrpcJsStream(call, 'client', fromGrpcMetadata(md), p));
      });
    });
  });
}

export const grpcJsPeerTransport: Transport = {
  createServer: createGrpcJsServer,
  createChannel: (opts) => createGrpcJsChannel(opts),
};

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
  return fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-h2-'));
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
