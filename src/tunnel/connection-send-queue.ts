/**
 * The send side of one connection: bytes its local end handed over, sent as
 * DATA packets as the peer's window (with the window extension) and the
 * transport allow. The local end stops handing over bytes while the queue is
 * not idle, so the queue holds one socket read, or in a relay at most what
 * the partner connection's receive window lets in.
 *
 * With resume, what this side retains for a resend is its own decision,
 * never the peer's credit: at most `retainLimit` bytes (the largest window
 * this side would grant) and what the ledger's caps leave; at either the
 * queue stops sending, so the local end stops being read, until the peer
 * acknowledges (docs/limits.md, "Retained bytes"). The bytes retained
 * outlive no paced scavenge as the local end's read buffers: by then they are
 * copies in the process's slab pool (resend-buffer.ts), so those buffers
 * die young whether resume is on or off (docs/memory.md, "While a tunnel
 * waits to resume").
 */
import { noteBytesMoved, pacedScavenges, type PacedScavenges } from './gc-pacer.js';
import { ResendBuffer } from './resend-buffer.js';
import { sentBytesSlabs, type SlabPool } from './slab-pool.js';
import type { HeldBytes } from '../domain/retention-ledger.js';
import { MAX_WINDOW_BYTES } from '../wire/window-maximum.js';

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
  /** With retain: unacknowledged bytes kept at most (this side's largest window, TunnelLimits.maxWindowBytes). */
  retainLimit: number;
  /** Where retained and queued bytes are charged (the server's ledger); absent: only retainLimit bounds them. */
  account?: HeldBytes;
  /** Where retained bytes are kept: the process's pool unless a test gives its own. */
  slabs?: SlabPool;
  /** When retained pieces are copied into slabs: the process's paced scavenges unless a test gives its own. */
  scavenges?: PacedScavenges;
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
   * With retain: bytes sent and not acknowledged, oldest first:
   * retained.length = sentBytes - acknowledged offset <= retainLimit (pump()
   * sends no more), whatever window the peer grants. Created on the first
   * byte retained; holds no slab while empty.
   */
  private retained: ResendBuffer | undefined;
  /** While the stream that carries the connection is being replaced: nothing is sent until resumeAt(). */
  private suspended = false;
  private readonly resume = (): void => {
    this.pump();
  };

  /** What the account was last charged: retainedBytes and queued, as of the last sync(). */
  private chargedRetained = 0;
  private chargedQueued = 0;
  private readonly retainLimit: number;
  private readonly account: HeldBytes | undefined;
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
    this.retainLimit = opts.retainLimit;
    this.account = opts.account;
    this.slabs = opts.slabs ?? sentBytesSlabs;
    this.scavenges = opts.scavenges ?? pacedScavenges;
  }

  private readonly slabs: SlabPool;
  private readonly scavenges: PacedScavenges;

  /** Bytes in `retained`. */
  private get retainedBytes(): number {
    return this.retained === undefined ? 0 : this.retained.length;
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

  /**
   * The peer granted `increment` more bytes. Returns a fault when that would
   * leave more than the protocol's largest window outstanding (nothing is
   * granted then): no honest receiver grants it.
   */
  credit(increment: number): string | undefined {
    if (this.window + increment > MAX_WINDOW_BYTES)
      return `peer granted credit beyond the protocol's largest window (${this.window + increment} > ${MAX_WINDOW_BYTES} bytes)`;
    this.window += increment;
    if (this.queued > 0) this.pump();
    return undefined;
  }

  /** The peer received the first `received` bytes: they need not be kept any more. False when it claims more than was sent. */
  acknowledge(received: number): boolean {
    if (received > this.sentBytes) return false;
    const retained = this.retained;
    if (retained === undefined) return true;
    // An acknowledgement older than one already taken drops nothing.
    const drop = received - (this.sentBytes - retained.length);
    if (drop > 0) {
      retained.drop(drop);
      // Room to retain again: a queue held back by retainLimit goes on (pump syncs the account).
      if (this.queued > 0 && !this.stopped && !this.suspended) this.pump();
      else this.sync();
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
   * numbers cannot be true (before what it acknowledged, or beyond what was
   * sent), or `window` when its limit is beyond the protocol's largest window.
   */
  resumeAt(received: number, limit: number): { resent: number } | { fault: string; window?: true } {
    const from = this.sentBytes - this.retainedBytes;
    if (received < from || received > this.sentBytes)
      return { fault: `peer claims ${received} bytes received; ${from} to ${this.sentBytes} are possible` };
    if (limit - received > MAX_WINDOW_BYTES)
      return {
        fault: `peer's resume limit lies beyond the protocol's largest window (${limit - received} > ${MAX_WINDOW_BYTES} bytes)`,
        window: true,
      };
    this.acknowledge(received);
    const resent = this.retainedBytes;
    if (resent > 0 && this.retained) {
      if (this.offset > 0) {
        this.chunks[0] = this.chunks[0].subarray(this.offset);
        this.offset = 0;
      }
      // Sent again as one copy and retained again as it goes out: the slabs go back now.
      this.chunks.unshift(this.retained.copy());
      this.retained.release();
      this.queued += resent;
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
    if (n === 0 || !this.retained) return 0;
    // A copy: the transport may still hold the pieces when an acknowledgement or release() gives the slabs back.
    const all = this.retained.copy();
    for (let at = 0; at < n; at += this.maxDataBytes)
      this.host.sendData(this.connectID, all.subarray(at, Math.min(n, at + this.maxDataBytes)));
    return n;
  }

  /** Drops what is queued and sends nothing more (the connection closed); what was sent stays retained until acknowledged. */
  stop(): void {
    this.stopped = true;
    this.chunks.length = 0;
    this.queued = 0;
    this.sync();
  }

  /** Forgets what was retained (the connection will never be resumed). */
  release(): void {
    this.retained?.release();
    this.sync();
  }

  /** Bytes it may retain more now: its own limit, and what the account's caps leave. */
  private retainRoom(): number {
    if (!this.retain) return Number.POSITIVE_INFINITY;
    const own = this.retainLimit - this.retainedBytes;
    return this.account ? Math.min(own, this.account.room()) : own;
  }

  /** Charges the account what changed since the last sync. */
  private sync(): void {
    const account = this.account;
    if (!account) return;
    if (this.retainedBytes !== this.chargedRetained) {
      account.retain(this.retainedBytes - this.chargedRetained);
      this.chargedRetained = this.retainedBytes;
    }
    if (this.queued !== this.chargedQueued) {
      account.buffer(this.queued - this.chargedQueued);
      this.chargedQueued = this.queued;
    }
  }

  private pump(): boolean {
    if (this.stopped) return true;
    if (this.suspended) {
      this.sync();
      return false;
    }
    const before = this.queued;
    let room = this.retainRoom();
    while (this.queued > 0 && this.window > 0 && room > 0 && this.host.writable) {
      const chunk = this.chunks[0];
      const n = Math.min(chunk.length - this.offset, this.maxDataBytes, this.window, room);
      room -= n;
      const piece = n === chunk.length ? chunk : chunk.subarray(this.offset, this.offset + n);
      this.offset += n;
      if (this.offset === chunk.length) {
        this.chunks.shift();
        this.offset = 0;
      }
      this.queued -= n;
      this.window -= n;
      this.sentBytes += n;
      if (this.retain) (this.retained ??= new ResendBuffer(this.slabs, this.scavenges)).append(piece);
      this.host.sendData(this.connectID, piece);
    }
    this.sync();
    // Bulk waits for the transport's drain; a spent window waits for credit(); retention waits for acknowledge() or the account.
    if (!this.host.writable) this.host.whenWritable(this.resume);
    else if (this.queued > 0 && room <= 0 && this.window > 0 && this.account && this.retainedBytes < this.retainLimit)
      this.account.whenRoom(this.resume);
    const idle = this.idle;
    if (this.queued < before || idle) this.onProgress();
    return idle;
  }
}
