/**
 * A hostile gRPC peer on raw node:http2: opens one stream (an agent's
 * AgentService/Connect with its client certificate, or a frontend's
 * ProxyService/Proxy on a Unix socket), then writes packets as fast as the
 * server's flow control lets it and never reads a byte of what comes back.
 * Independent of Kanal's transports on purpose: it must behave like a
 * foreign client, not like our own code.
 */
import fs from 'node:fs';
import http2, { type ClientHttp2Session, type ClientHttp2Stream } from 'node:http2';
import net from 'node:net';
import { encodePacket } from '../../src/wire/codec.js';
import type { Packet } from '../../src/wire/packet.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_KANAL_FEATURES, PROXY_SERVICE_PROXY } from '../../src/wire/metadata.js';

/** Writes `makePacket(i)` for i = 0, 1, ... in batches as fast as flow control allows; returns a count of messages written. */
function floodStream(
  stream: http2.Http2Stream,
  makePacket: (i: number) => Packet,
  opts: { batch?: number; limit?: number } = {},
): () => number {
  const batch = opts.batch ?? 2048;
  const limit = opts.limit ?? Number.POSITIVE_INFINITY;
  let sent = 0;
  let i = 0;
  const pump = (): void => {
    while (!stream.destroyed && !stream.closed && i < limit) {
      const parts: Buffer[] = [];
      for (let n = 0; n < batch && i < limit; n++) parts.push(grpcMessage(makePacket(i++)));
      const count = parts.length;
      if (!stream.write(Buffer.concat(parts), () => (sent += count))) {
        stream.once('drain', pump);
        return;
      }
    }
  };
  pump();
  return () => sent;
}

export interface FloodTarget {
  /** Agent port on 127.0.0.1 (mTLS) or a frontend Unix socket. */
  agentPort?: number;
  uds?: string;
  /** Client certificate files for the agent port. */
  cert?: { cert: string; key: string; ca: string };
  agentID?: string;
  features?: string;
}

export interface FloodingPeer {
  /** Resolves with the response headers' :status once the server accepted the stream. */
  readonly accepted: Promise<number>;
  /** gRPC messages written so far (whole batches handed to HTTP/2). */
  sent(): number;
  /** Resolves when the stream or the connection is closed (by either side). */
  readonly closed: Promise<string>;
  /** Starts writing `makePacket(i)` for i = 0, 1, ... in batches; never reads. */
  flood(makePacket: (i: number) => Packet, opts?: { batch?: number; limit?: number }): void;
  destroy(): void;
}

function grpcMessage(p: Packet): Buffer {
  const body = encodePacket(p);
  const out = Buffer.allocUnsafe(5 + body.length);
  out[0] = 0;
  out.writeUInt32BE(body.length, 1);
  out.set(body, 5);
  return out;
}

export function openFloodingPeer(target: FloodTarget): FloodingPeer {
  return openStreamOn(connectFloodingSession(target), target);
}

/** Opens `n` streams on one connection; resolves with how many the server answered within `ms`. */
export async function streamsAnswered(target: FloodTarget, n: number, ms: number): Promise<number> {
  const session = connectFloodingSession(target);
  session.setMaxListeners(n + 10); // each stream watches the session's close
  try {
    const peers = Array.from({ length: n }, (_, i) => openStreamOn(session, { ...target, agentID: `${target.agentID ?? 'flooder'}-${i}` }));
    const answered = await Promise.all(
      peers.map((p) =>
        Promise.race([
          p.accepted.then(
            () => 1,
            () => 0,
          ),
          new Promise<number>((r) => setTimeout(() => r(0), ms)),
        ]),
      ),
    );
    return answered.reduce((a, b) => a + b, 0);
  } finally {
    session.destroy();
  }
}

function connectFloodingSession(target: FloodTarget): ClientHttp2Session {
  let session: ClientHttp2Session;
  const settings = { initialWindowSize: 65_535, enablePush: false };
  if (target.uds !== undefined) {
    const uds = target.uds;
    session = http2.connect('http://localhost', { settings, createConnection: () => net.connect(uds) });
  } else {
    const c = target.cert;
    if (!c || target.agentPort === undefined) throw new Error('flooding peer needs agentPort and cert, or uds');
    session = http2.connect(`https://127.0.0.1:${target.agentPort}`, {
      settings,
      ca: fs.readFileSync(c.ca),
      cert: fs.readFileSync(c.cert),
      key: fs.readFileSync(c.key),
      servername: 'localhost',
      checkServerIdentity: () => undefined,
    });
  }
  session.on('error', () => undefined);
  return session;
}

function openStreamOn(session: ClientHttp2Session, target: FloodTarget): FloodingPeer {
  const headers: http2.OutgoingHttpHeaders = {
    ':method': 'POST',
    ':path': target.uds !== undefined ? PROXY_SERVICE_PROXY : AGENT_SERVICE_CONNECT,
    'content-type': 'application/grpc',
    te: 'trailers',
  };
  if (target.uds === undefined) headers[MD_AGENT_ID] = target.agentID ?? 'flooder';
  if (target.features) headers[MD_KANAL_FEATURES] = target.features;
  const stream: ClientHttp2Stream = session.request(headers, { endStream: false });
  stream.on('error', () => undefined);
  // Never read: no 'data' listener, and paused, so HTTP/2 stops granting the server window.
  stream.pause();
  const accepted = new Promise<number>((resolve, reject) => {
    stream.once('response', (h) => resolve(Number(h[':status'])));
    stream.once('close', () => reject(new Error('stream closed before the response headers')));
  });
  accepted.catch(() => undefined);
  const closed = new Promise<string>((resolve) => {
    stream.once('close', () => resolve(`stream closed (rst ${stream.rstCode ?? 'none'})`));
    session.once('close', () => resolve('connection closed'));
  });
  let sent = (): number => 0;
  const flood = (makePacket: (i: number) => Packet, opts: { batch?: number; limit?: number } = {}): void => {
    sent = floodStream(stream, makePacket, opts);
  };
  return {
    accepted,
    sent: () => sent(),
    closed,
    flood,
    destroy: () => session.destroy(),
  };
}

export interface FloodingServer {
  readonly port: number;
  /** Resolves once an agent's stream was accepted. */
  readonly accepted: Promise<void>;
  /** Starts flooding the accepted stream. */
  flood(): void;
  /** Messages written so far on the agent's stream. */
  sent(): number;
  /** Resolves when the agent's stream is closed (by either side). */
  readonly streamClosed: Promise<void>;
  close(): Promise<void>;
}

/**
 * A hostile proxy server on 127.0.0.1 (TLS with the given server
 * certificate): accepts the first AgentService/Connect stream, answers like
 * a server, and never reads; flood() then writes `makePacket(i)` to it.
 */
export async function startFloodingServer(tls: { cert: string; key: string }, makePacket: (i: number) => Packet): Promise<FloodingServer> {
  const server = http2.createSecureServer({ cert: fs.readFileSync(tls.cert), key: fs.readFileSync(tls.key), allowHTTP1: false });
  server.on('sessionError', () => undefined);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on('session', (session) => {
    sessions.add(session);
    session.once('close', () => sessions.delete(session));
  });
  let sent = (): number => 0;
  let streamClosed!: () => void;
  const closedP = new Promise<void>((resolve) => (streamClosed = resolve));
  let taken: http2.ServerHttp2Stream | undefined;
  let accepted!: () => void;
  const acceptedP = new Promise<void>((resolve) => (accepted = resolve));
  server.on('stream', (stream) => {
    stream.on('error', () => undefined);
    if (taken) {
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      return;
    }
    taken = stream;
    stream.pause(); // never read
    stream.respond({ ':status': 200, 'content-type': 'application/grpc', serverid: 'hostile-server', servercount: '1' });
    stream.once('close', () => streamClosed());
    accepted();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  const port = (server.address() as net.AddressInfo).port;
  return {
    port,
    accepted: acceptedP,
    flood: () => {
      if (!taken) throw new Error('no agent stream to flood yet');
      sent = floodStream(taken, makePacket);
    },
    sent: () => sent(),
    streamClosed: closedP,
    close: () =>
      new Promise<void>((resolve) => {
        for (const session of sessions) session.destroy();
        server.close(() => resolve());
      }),
  };
}
