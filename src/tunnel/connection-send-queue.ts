/**
 * The send side of one connection: bytes its local end handed over, sent as
 * DATA packets as the peer's window (with the window extension) and the
 * transport allow. The local end stops handing over bytes while the queue is
 * not idle, so the queue holds one socket read, or in a relay at most what
 * the partner connection's receive window lets in.
 */
import { noteBytesMoved } from './gc-pacer.js';

/** What a send queue needs from its tunnel. */
export interface SendHost {
  /** True while the transport accepts more bulk data. */
  readonly writable: boolean;
  sendData(connectID: number, data: Uint8Array): void;
  /** Calls `resume` once when the transport drains; one entry per function. */
  whenWritable(resume: () => void): void;
}

export interface SendQueueOptions {
  host: SendHost;
  connectID: number;
  /** The peer's first window: Infinity without flow control. */
  window: number;
  /** DATA packets carry at most this many bytes. */
  maxDataBytes: number;
  /** Called whenever bytes left the queue or the transport drained. */
  onProgress: () => void;
}

export class ConnectionSendQueue {
  /** Credit left from the peer: >= 0, Infinity without flow control. */
  private window: number;
  /** Chunks not sent yet, oldest first; `offset` bytes of the first are sent. */
  private readonly chunks: Buffer[] = [];
  private offset = 0;
  /** Unsent bytes in `chunks`: the sum of their lengths minus `offset`. */
  private queued = 0;
  /** Bytes sent so far. */
  private sentBytes = 0;
  /** Set by stop(): nothing is sent any more and the queue stays empty. */
  private stopped = false;
  private readonly resume = (): void => {
    this.pump();
  };

  private readonly host: SendHost;
  private readonly connectID: number;
  private readonly maxDataBytes: number;
  private readonly onProgress: () => void;

  // Once per connection, not per packet: an options object costs nothing on the data path.
  constructor(opts: SendQueueOptions) {
    this.host = opts.host;
    this.connectID = opts.connectID;
    this.window = opts.window;
    this.maxDataBytes = opts.maxDataBytes;
    this.onProgress = opts.onProgress;
  }

  /** True when nothing waits and the transport takes more: the local end may hand over its next bytes. */
  get idle(): boolean {
    return this.queued === 0 && this.host.writable;
  }

  get queuedBytes(): number {
    return this.queued;
  }

  get sent(): number {
    return this.sentBytes;
  }

  /** Queues `chunk` and sends what it can; returns `idle`. */
  push(chunk: Buffer): boolean {
    if (this.stopped) return true;
    noteBytesMoved(chunk.length);
    this.chunks.push(chunk);
    this.queued += chunk.length;
    return this.pump();
  }

  /** The peer granted `increment` more bytes. */
  credit(increment: number): void {
    this.window += increment;
    if (this.queued > 0) this.pump();
  }

  /** Drops what is queued and sends nothing more (the connection closed). */
  stop(): void {
    this.stopped = true;
    this.chunks.length = 0;
    this.queued = 0;
  }

  private pump(): boolean {
    if (this.stopped) return true;
    const before = this.queued;
    while (this.queued > 0 && this.window > 0 && this.host.writable) {
      const chunk = this.chunks[0];
      const n = Math.min(chunk.length - this.offset, this.maxDataBytes, this.window);
      const piece = n === chunk.length ? chunk : chunk.subarray(this.offset, this.offset + n);
      this.offset += n;
      if (this.offset === chunk.length) {
        this.chunks.shift();
        this.offset = 0;
      }
      this.queued -= n;
      this.window -= n;
      this.sentBytes += n;
      this.host.sendData(this.connectID, piece);
    }
    // Bulk waits for the transport's drain; a spent window waits for credit().
    if (!this.host.writable) this.host.whenWritable(this.resume);
    const idle = this.idle;
    if (this.queued < before || idle) this.onProgress();
    return idle;
  }
}
