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
  /** With resume: keep what was sent until the peer acknowledges it, to send it again after a lost stream. */
  retain: boolean;
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
  /**
   * With retain: bytes sent and not acknowledged, oldest first; their sum is
   * retainedBytes = sentBytes - acknowledged offset. At most the peer's window
   * (it acknowledges what it received with its credit), so it needs no bound of its own.
   */
  private readonly retained: Buffer[] = [];
  private retainedBytes = 0;
  /** While the stream that carries the connection is being replaced: nothing is sent until resumeAt(). */
  private suspended = false;
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
    this.retain = opts.retain;
  }

  private readonly retain: boolean;

  /** True when nothing waits and the transport takes more: the local end may hand over its next bytes. */
  get idle(): boolean {
    return this.queued === 0 && this.host.writable && !this.suspended;
  }

  /** Bytes sent and kept until the peer acknowledges them (resume). */
  get unacknowledged(): number {
    return this.retainedBytes;
  }

  /** True from suspend() until resumeAt(). */
  get isSuspended(): boolean {
    return this.suspended;
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

  /** The peer received the first `received` bytes: they need not be kept any more. False when it claims more than was sent. */
  acknowledge(received: number): boolean {
    if (received > this.sentBytes) return false;
    let drop = received - (this.sentBytes - this.retainedBytes);
    while (drop > 0 && this.retained.length > 0) {
      const first = this.retained[0];
      if (first.length <= drop) {
        this.retained.shift();
        this.retainedBytes -= first.length;
        drop -= first.length;
      } else {
        this.retained[0] = first.subarray(drop);
        this.retainedBytes -= drop;
        drop = 0;
      }
    }
    return true;
  }

  /** The stream is lost or being replaced: send nothing until resumeAt(). */
  suspend(): void {
    this.suspended = true;
  }

  /**
   * Resumes on a new stream: the peer received `received` bytes and may take
   * bytes up to the absolute offset `limit`; what it lacks is sent again
   * first. Returns the bytes to send again, or a fault when the peer's
   * numbers cannot be true (before what it acknowledged, or beyond what was sent).
   */
  resumeAt(received: number, limit: number): { resent: number } | { fault: string } {
    const from = this.sentBytes - this.retainedBytes;
    if (received < from || received > this.sentBytes)
      return { fault: `peer claims ${received} bytes received; ${from} to ${this.sentBytes} are possible` };
    this.acknowledge(received);
    const resent = this.retainedBytes;
    if (resent > 0) {
      if (this.offset > 0) {
        this.chunks[0] = this.chunks[0].subarray(this.offset);
        this.offset = 0;
      }
      this.chunks.unshift(...this.retained);
      this.queued += resent;
      this.retained.length = 0;
      this.retainedBytes = 0;
      this.sentBytes = received;
    }
    this.window = Math.max(0, limit - received);
    this.suspended = false;
    this.pump();
    return { resent };
  }

  /**
   * After the connection closed cleanly (it lingers until acknowledged):
   * sends what the peer lacks beyond `received` at once, whatever the
   * transport's buffer (it is at most a window). Returns the bytes sent, or -1 when `received` is impossible.
   */
  replayClosed(received: number): number {
    if (received < this.sentBytes - this.retainedBytes || !this.acknowledge(received)) return -1;
    const n = this.retainedBytes;
    for (const piece of this.retained) this.host.sendData(this.connectID, piece);
    return n;
  }

  /** Drops what is queued and sends nothing more (the connection closed); what was sent stays retained until acknowledged. */
  stop(): void {
    this.stopped = true;
    this.chunks.length = 0;
    this.queued = 0;
  }

  /** Forgets what was retained (the connection will never be resumed). */
  release(): void {
    this.retained.length = 0;
    this.retainedBytes = 0;
  }

  private pump(): boolean {
    if (this.stopped) return true;
    if (this.suspended) return false;
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
      if (this.retain) {
        this.retained.push(piece);
        this.retainedBytes += n;
      }
      this.host.sendData(this.connectID, piece);
    }
    // Bulk waits for the transport's drain; a spent window waits for credit().
    if (!this.host.writable) this.host.whenWritable(this.resume);
    const idle = this.idle;
    if (this.queued < before || idle) this.onProgress();
    return idle;
  }
}
