/**
 * In-memory test plumbing for the tunnel multiplexer:
 *
 * - createMemoryLink(): two linked PacketStreams. Every packet is encoded
 *   with the real codec and decoded on the other side (so DATA payloads are
 *   views into received buffers, as with a real transport). Each direction
 *   has a bounded send buffer: send() returns false once it is full and
 *   'drain' follows when the peer has taken the bytes, so back-pressure is
 *   real. Delivery is asynchronous and batched per macrotask.
 * - duplexPair(): two linked Duplexes (a socketpair) with back-pressure and
 *   half-close, to stand for the endpoints a dial handler returns.
 * - captureLogger(): a pino logger whose lines land in an array.
 * - tunnelPair(): an agent-side and a server-side Tunnel on one link.
 */
import { EventEmitter } from 'node:events';
import { createHash } from 'node:crypto';
import { Duplex } from 'node:stream';
import { pino, type Logger, type LevelWithSilent } from 'pino';
import { BOUNDED_LOG_FIELDS } from '../../src/common/log-safety.js';
import { encodePacket } from '../../src/wire/codec.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import type { MetadataMap } from '../../src/wire/metadata.js';
import type { PacketStream, PacketStreamEvents } from '../../src/transport/packet-stream.js';
import { decodeOrExplain, isInvalid } from '../../src/transport/decoded.js';
import { Tunnel, type DialHandler, type TunnelOptions } from '../../src/tunnel/tunnel.js';
import type { FeatureSet } from '../../src/wire/features.js';
import type { TunnelLimits } from '../../src/tunnel/limits.js';

// ---------- PacketStream pair ----------

export interface MemoryLinkOptions {
  /** Bytes queued in one direction before send() returns false (default 1 MiB). */
  sendBufferBytes?: number;
  /** Bytes delivered per macrotask turn in one direction (default 256 KiB). */
  batchBytes?: number;
  /** Metadata seen on each end. */
  metadataA?: MetadataMap;
  metadataB?: MetadataMap;
}

export class MemoryPacketStream extends EventEmitter implements PacketStream {
  closed = false;
  /** Every packet this end sent, if recording is on (DATA excluded unless recordData). */
  readonly sent: Packet[] = [];
  recording = true;
  recordData = false;
  /** Counters of what this end sent. */
  packetsSent = 0;
  bytesSent = 0;
  /** Times send() returned false. */
  blockedCount = 0;

  private peerEnd!: MemoryPacketStream;
  private queue: Buffer[] = [];
  private queueBytes = 0;
  private wantDrain = false;
  private scheduled = false;
  private paused = false;
  private ended = false;
  private readonly taps = new Set<(p: Packet) => void>();

  constructor(
    readonly peer: string,
    readonly metadata: MetadataMap,
    private readonly sendBufferBytes: number,
    private readonly batchBytes: number,
  ) {
    super();
  }

  /** @internal */
  link(other: MemoryPacketStream): void {
    this.peerEnd = other;
  }

  get other(): MemoryPacketStream {
    return this.peerEnd;
  }

  /** Bytes sent but not yet delivered to the peer. */
  get queuedBytes(): number {
    return this.queueBytes;
  }

  /** Calls `fn` for every packet this end sends (before encoding). Returns an unsubscribe function. */
  tap(fn: (p: Packet) => void): () => void {
    this.taps.add(fn);
    return () => this.taps.delete(fn);
  }

  send(packet: Packet): boolean {
    if (this.closed || this.ended) return true; // like grpc-js: writes after the end are dropped
    for (const fn of this.taps) fn(packet);
    if (this.recording && (this.recordData || packet.type !== PacketType.DATA)) this.sent.push(packet);
    return this.enqueue(encodePacket(packet));
  }

  /** Sends bytes that need not be a valid Packet (malformed-input tests). */
  sendRaw(bytes: Uint8Array): boolean {
    if (this.closed || this.ended) return true;
    return this.enqueue(Buffer.from(bytes));
  }

  end(): void {
    if (this.ended || this.closed) return;
    this.ended = true;
    this.schedule();
  }

  destroy(error?: Error): void {
    if (this.closed) return;
    this.dropQueue();
    this.finish(error);
    const other = this.peerEnd;
    setImmediate(() => {
      other.dropQueue();
      other.finish(new Error('stream reset by peer'));
    });
  }

  /** PacketStream.pause(): stop taking the peer's packets (flow control holds it back). */
  pause(): void {
    this.other.pauseDelivery();
  }

  resume(): void {
    this.other.resumeDelivery();
  }

  /** Stops delivering this end's packets to the peer (a stuck transport). */
  pauseDelivery(): void {
    this.paused = true;
  }

  resumeDelivery(): void {
    this.paused = false;
    this.schedule();
  }

  override on<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this {
    return super.on(event, listener as (...args: unknown[]) => void);
  }
  override once<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this {
    return super.once(event, listener as (...args: unknown[]) => void);
  }
  override off<K extends keyof PacketStreamEvents>(event: K, listener: (...args: PacketStreamEvents[K]) => void): this {
    return super.off(event, listener as (...args: unknown[]) => void);
  }

  private enqueue(buf: Buffer): boolean {
    this.packetsSent++;
    this.bytesSent += buf.length;
    this.queue.push(buf);
    this.queueBytes += buf.length;
    this.schedule();
    if (this.queueBytes >= this.sendBufferBytes) {
      this.wantDrain = true;
      this.blockedCount++;
      return false;
    }
    return true;
  }

  private schedule(): void {
    if (this.scheduled || this.paused || this.closed) return;
    this.scheduled = true;
    setImmediate(() => this.flush());
  }

  private flush(): void {
    this.scheduled = false;
    if (this.closed || this.paused) return;
    let delivered = 0;
    while (this.queue.length > 0 && delivered < this.batchBytes) {
      const buf = this.queue.shift()!;
      this.queueBytes -= buf.length;
      delivered += buf.length;
      this.peerEnd.receive(buf);
      if (this.closed) return;
    }
    if (this.queue.length > 0) this.schedule();
    if (this.wantDrain && this.queueBytes < this.sendBufferBytes) {
      this.wantDrain = false;
      this.emit('drain');
    }
    this.maybeFinishGracefully();
  }

  private receive(buf: Buffer): void {
    if (this.closed) return;
    const decoded = decodeOrExplain(buf);
    if (isInvalid(decoded)) this.emit('invalid', decoded.invalid);
    else this.emit('packet', decoded);
  }

  /** Both ends ended and everything was delivered: the call is over (OK status). */
  private maybeFinishGracefully(): void {
    const other = this.peerEnd;
    if (this.ended && this.queue.length === 0 && !other.ended && !other.closed) {
      // gRPC: the server answers a half-close by ending the call; mirror it.
      other.end();
      return;
    }
    if (this.ended && other.ended && this.queue.length === 0 && other.queue.length === 0) {
      this.finish(undefined);
      other.finish(undefined);
    }
  }

  private dropQueue(): void {
    this.queue = [];
    this.queueBytes = 0;
  }

  private finish(error: Error | undefined): void {
    if (this.closed) return;
    this.closed = true;
    this.emit('close', error);
  }
}

export interface MemoryLink {
  a: MemoryPacketStream;
  b: MemoryPacketStream;
}

export function createMemoryLink(opts: MemoryLinkOptions = {}): MemoryLink {
  const sendBuffer = opts.sendBufferBytes ?? 1024 * 1024;
  const batch = opts.batchBytes ?? 256 * 1024;
  const a = new MemoryPacketStream('memory:a', opts.metadataA ?? new Map(), sendBuffer, batch);
  const b = new MemoryPacketStream('memory:b', opts.metadataB ?? new Map(), sendBuffer, batch);
  a.link(b);
  b.link(a);
  return { a, b };
}

export type PacketOf<T extends PacketType> = Extract<Packet, { type: T }>;

/**
 * Resolves with the next packet of `type` that `stream` receives (and that
 * satisfies `match`, if given); rejects after timeoutMs.
 */
export function nextPacket<T extends PacketType>(
  stream: PacketStream,
  type: T,
  match: (p: PacketOf<T>) => boolean = () => true,
  timeoutMs = 5000,
): Promise<PacketOf<T>> {
  return new Promise<PacketOf<T>>((resolve, reject) => {
    const onPacket = (p: Packet): void => {
      if (p.type !== type || !match(p as PacketOf<T>)) return;
      clearTimeout(timer);
      stream.off('packet', onPacket);
      resolve(p as PacketOf<T>);
    };
    const timer = setTimeout(() => {
      stream.off('packet', onPacket);
      reject(new Error(`no ${PacketType[type]} packet within ${timeoutMs} ms`));
    }, timeoutMs);
    stream.on('packet', onPacket);
  });
}

// ---------- Duplex pair ----------

class PairSide extends Duplex {
  other!: PairSide;
  private waitingWrite: (() => void) | null = null;

  constructor(highWaterMark: number) {
    super({ allowHalfOpen: true, readableHighWaterMark: highWaterMark, writableHighWaterMark: highWaterMark });
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, callback: (error?: Error | null) => void): void {
    const other = this.other;
    if (other.destroyed) {
      callback();
      return;
    }
    if (other.push(chunk)) callback();
    else other.waitingWrite = () => callback();
  }

  override _read(): void {
    const w = this.waitingWrite;
    if (w) {
      this.waitingWrite = null;
      w();
    }
  }

  override _final(callback: (error?: Error | null) => void): void {
    if (!this.other.destroyed) this.other.push(null);
    callback();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    const w = this.other.waitingWrite;
    this.other.waitingWrite = null;
    w?.();
    // Closing after our FIN is clean: the partner keeps what it buffered and
    // its EOF. Otherwise it is a TCP reset: the partner goes away too.
    const other = this.other;
    if (!this.writableFinished && !other.destroyed) process.nextTick(() => other.destroy());
    callback(error);
  }
}

/** Two connected in-memory sockets: what one writes, the other reads; end() is a FIN. */
export function duplexPair(highWaterMark = 16 * 1024): [Duplex, Duplex] {
  const x = new PairSide(highWaterMark);
  const y = new PairSide(highWaterMark);
  x.other = y;
  y.other = x;
  return [x, y];
}

export interface Sink extends Duplex {
  /** Bytes the application "read" (writes completed). */
  readonly accepted: number;
  /** sha256 of the accepted bytes so far. */
  digest(): string;
  /** Starts accepting bytes (completes the held write). */
  release(): void;
  /** Stops accepting: the next write is held until release(). */
  stall(): void;
}

/**
 * An endpoint that reads and hashes everything written to it and sends
 * nothing back; it ends its readable side when its writable side finishes
 * (a server that closes after EOF). A stalled sink holds its first write
 * forever (a reader that never reads) until release(); stall() makes a
 * reading sink stop.
 */
export function sinkEndpoint(opts: { stalled?: boolean; highWaterMark?: number } = {}): Sink {
  let stalled = opts.stalled ?? false;
  let held: { chunk: Buffer; callback: () => void } | null = null;
  let accepted = 0;
  const hash = createHash('sha256');
  const accept = (chunk: Buffer): void => {
    accepted += chunk.length;
    hash.update(chunk);
  };
  const d = new Duplex({
    allowHalfOpen: true,
    writableHighWaterMark: opts.highWaterMark ?? 16 * 1024,
    read() {},
    write(chunk: Buffer, _enc, callback) {
      if (stalled) {
        held = { chunk, callback: () => callback() };
        return;
      }
      accept(chunk);
      callback();
    },
    final(callback) {
      this.push(null);
      callback();
    },
  });
  // defineProperties, not Object.assign: the getters must stay live.
  Object.defineProperties(d, {
    accepted: { get: () => accepted },
    digest: { value: () => hash.copy().digest('hex') },
    release: {
      value: (): void => {
        stalled = false;
        const h = held;
        held = null;
        if (h) {
          accept(h.chunk);
          h.callback();
        }
      },
    },
    stall: {
      value: (): void => {
        stalled = true;
      },
    },
  });
  return d as Sink;
}

// ---------- logging ----------

export interface LogLine {
  level: number;
  msg: string;
  [key: string]: unknown;
}

export interface CapturedLogger {
  log: Logger;
  lines: LogLine[];
  /** Lines whose msg includes `text`. */
  matching(text: string): LogLine[];
}

/** A pino logger writing JSON lines into an array (synchronously). */
export function captureLogger(level: LevelWithSilent = 'debug'): CapturedLogger {
  const lines: LogLine[] = [];
  const destination = {
    write(s: string): void {
      for (const line of s.split('\n')) {
        if (line) lines.push(JSON.parse(line) as LogLine);
      }
    },
  };
  // Fields bounded as in production (src/common/logger.ts).
  const log = pino({ level, ...BOUNDED_LOG_FIELDS }, destination);
  return { log, lines, matching: (text) => lines.filter((l) => typeof l.msg === 'string' && l.msg.includes(text)) };
}

// ---------- tunnel pair ----------

export interface TunnelPairOptions {
  features: FeatureSet;
  limits?: Partial<TunnelLimits>;
  link?: MemoryLinkOptions;
  agentDialHandler?: DialHandler;
  serverDialHandler?: DialHandler;
  logLevel?: LevelWithSilent;
  /** Further options of each side's tunnel (hooks: onLimit, onInboundDialFailed, refusalReasons...). */
  agentOptions?: Partial<TunnelOptions>;
  serverOptions?: Partial<TunnelOptions>;
}

export interface TunnelPair {
  agent: Tunnel;
  server: Tunnel;
  link: MemoryLink;
  agentLog: CapturedLogger;
  serverLog: CapturedLogger;
  /** Closes both tunnels (idempotent). */
  close(): void;
}

/** Agent tunnel on link.a, server tunnel on link.b. */
export function tunnelPair(opts: TunnelPairOptions): TunnelPair {
  const link = createMemoryLink(opts.link);
  const agentLog = captureLogger(opts.logLevel ?? 'debug');
  const serverLog = captureLogger(opts.logLevel ?? 'debug');
  const agent = new Tunnel(link.a, {
    side: 'agent',
    features: opts.features,
    limits: opts.limits,
    log: agentLog.log,
    dialHandler: opts.agentDialHandler,
    ...opts.agentOptions,
  });
  const server = new Tunnel(link.b, {
    side: 'server',
    features: opts.features,
    limits: opts.limits,
    log: serverLog.log,
    dialHandler: opts.serverDialHandler,
    ...opts.serverOptions,
  });
  return {
    agent,
    server,
    link,
    agentLog,
    serverLog,
    close() {
      agent.close();
      server.close();
    },
  };
}

/** Polls `cond` every few ms until true; rejects after timeoutMs with `what`. */
/** Resolves on the next 'drain' or 'close' of a writer that refused more (stream.Writable or PacketStream). */
export function drainOrClose(writer: {
  on(event: 'drain' | 'close', f: () => void): unknown;
  off(event: 'drain' | 'close', f: () => void): unknown;
}): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      writer.off('drain', done);
      writer.off('close', done);
      resolve();
    };
    writer.on('drain', done);
    writer.on('close', done);
  });
}

export async function waitFor(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

/** Reads everything from `s` until it ends. */
export function readAll(s: Duplex): Promise<Buffer> {
  return new Promise<Buffer>((resolve, reject) => {
    const chunks: Buffer[] = [];
    s.on('data', (c: Buffer) => chunks.push(c));
    s.once('end', () => resolve(Buffer.concat(chunks)));
    s.once('error', reject);
  });
}
