/**
 * A tunnelled connection as a Node Duplex, for callers that consume it as a
 * stream in their own code: a client of the ProxyService (kit/demo's
 * grpcDial), tests. The product's own paths splice sockets to connections
 * directly (splice.ts) and never build one.
 */
import { Duplex } from 'node:stream';
import type { TunnelConnection } from './connection.js';
import type { LocalClose, LocalEnd } from './local-end.js';

/** After the peer closed, how long the reader may take nothing of what is left before the stream is dropped. */
const LINGER_IDLE_MS = 30_000;

export class ConnectionStream extends Duplex implements LocalEnd {
  /** The callback of the write the connection queued: it runs once the connection is ready again (back-pressure). */
  private heldWrite: ((error?: Error | null) => void) | null = null;
  /** Set while the peer has closed and the reader has not taken everything (see LINGER_IDLE_MS). */
  private lingerTimer: NodeJS.Timeout | undefined;

  constructor(readonly connection: TunnelConnection) {
    super({
      allowHalfOpen: true,
      // Below a quarter window so _read runs (and credit goes back) before the window is spent.
      readableHighWaterMark: Math.min(64 * 1024, connection.limits.windowBytes / 4),
      writableHighWaterMark: 64 * 1024,
    });
    connection.attach(this);
  }

  // ---------- LocalEnd ----------

  deliver(chunk: Buffer): void {
    this.push(chunk);
  }

  get undeliveredBytes(): number {
    return this.readableLength;
  }

  peerEnded(): void {
    this.push(null);
  }

  connectionClosed(how: LocalClose, error?: Error): void {
    if (how === 'abort') {
      this.destroy(error);
      return;
    }
    // What the peer sent before its close is still read; what is written now goes nowhere.
    this.releaseWrite();
    this.push(null);
    if (this.readableEnded) {
      this.destroy();
      return;
    }
    this.once('end', () => this.destroy());
    this.lingerTimer = setTimeout(() => this.destroy(), LINGER_IDLE_MS);
    this.lingerTimer.unref();
  }

  sendProgress(): void {
    if (this.heldWrite && this.connection.ready) this.releaseWrite();
  }

  // ---------- Duplex ----------

  override _read(): void {
    this.lingerTimer?.refresh();
    this.connection.taken();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    if (this.connection.send(chunk)) callback();
    else this.heldWrite = callback;
  }

  override _final(callback: (error?: Error | null) => void): void {
    callback();
    this.connection.end();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    clearTimeout(this.lingerTimer);
    this.releaseWrite(error ?? new Error('connection closed'));
    this.connection.close(error ?? undefined);
    callback(error);
  }

  private releaseWrite(error?: Error): void {
    const w = this.heldWrite;
    this.heldWrite = null;
    w?.(error);
  }
}
