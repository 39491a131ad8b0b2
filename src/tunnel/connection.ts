/**
 * One tunnelled TCP connection as a Node Duplex: writes become DATA packets,
 * DATA packets from the peer become readable bytes. Each connection has its
 * own bounded buffer. With the window extension the peer stops sending when
 * our window is spent, so a slow local reader never stalls its neighbours.
 * Without it (upstream peers) nothing but the stream's HTTP/2 flow control
 * can stop the peer: a full buffer pauses the whole stream, as upstream does,
 * and a slow reader never loses data (#12).
 */
import { Duplex, type Writable } from 'node:stream';
import type { Logger } from 'pino';
import type { TunnelLimits } from './limits.js';
import { noteBytesMoved } from './gc-pacer.js';
import { ReceiveWindow, type WindowGrowthBudget } from './receive-window.js';

/** After the peer closed, how long the local reader may take nothing of what is left before the connection is dropped. */
const LINGER_IDLE_MS = 30_000;

/** What a connection needs from its tunnel. */
export interface ConnectionHost {
  /** True while the transport accepts more bulk data. */
  readonly writable: boolean;
  sendData(connectID: number, data: Uint8Array): void;
  sendWindow(connectID: number, increment: number): void;
  /** The tunnel's budget for window growth, shared by its connections. */
  readonly windowGrowth: WindowGrowthBudget;
  sendHalfClose(connectID: number): void;
  /** Tells the peer the connection is gone (CLOSE_REQ or CLOSE_RSP by role). */
  sendClose(connectID: number, role: ConnectionRole, reason: string): void;
  /**
   * Asks the tunnel to stop (true) or resume (false) reading its stream on
   * behalf of this connection, for peers without per-connection windows.
   */
  holdInbound(connectID: number, hold: boolean): void;
  /** Bytes buffered for this connection's local reader changed by `delta` (peers without windows). */
  noteUnflowedBytes(delta: number): void;
  /** Calls `resume` once when the transport drains. */
  whenWritable(resume: () => void): void;
  forget(connectID: number): void;
}

/** Whether we asked for this connection (dialer) or performed the dial (performer). */
export type ConnectionRole = 'dialer' | 'performer';

export interface ConnectionOptions {
  connectID: number;
  dialID: bigint;
  address: string;
  role: ConnectionRole;
  flowControl: boolean;
  halfClose: boolean;
  limits: TunnelLimits;
  log: Logger;
}

interface PendingWrite {
  chunk: Buffer;
  offset: number;
  callback: (error?: Error | null) => void;
}

export class TunnelConnection extends Duplex {
  readonly connectID: number;
  readonly dialID: bigint;
  readonly address: string;
  readonly role: ConnectionRole;
  readonly log: Logger;
  bytesIn = 0;
  bytesOut = 0;

  private sendWindow: number;
  /** Credit granted to the peer (with flow control); grows from windowBytes to maxWindowBytes. */
  private readonly recvWindow: ReceiveWindow;
  /** The one write being sent; the Writable holds further ones for writers that obey back-pressure (pipe does). */
  private pendingWrite: PendingWrite | null = null;
  private halfCloseSent = false;
  private halfCloseReceived = false;
  /** Set when the peer already forgot the connection: send nothing more. */
  private peerGone = false;
  private lingerTimer: NodeJS.Timeout | null = null;
  /** True while this connection holds its tunnel's stream paused. */
  private holding = false;
  /** Without flow control: the buffered bytes last reported to the host (noteUnflowedBytes). */
  private reportedUnflowed = 0;
  private readonly resumeSend = (): void => this.pump();
  /**
   * Where inbound bytes go when delivered directly (deliverTo), else null.
   * What it (or our readable side) holds is bounded by the receive window,
   * or without flow control by unflowedBufferBytes (then the stream pauses).
   */
  private sink: Writable | null = null;
  private sinkCorked = false;

  constructor(
    private readonly host: ConnectionHost,
    private readonly opts: ConnectionOptions,
  ) {
    super({
      allowHalfOpen: true,
      // Below windowBytes/2 so _read runs (and grants credit) before the
      // window is exhausted.
      readableHighWaterMark: Math.min(64 * 1024, opts.limits.windowBytes / 4),
      writableHighWaterMark: 64 * 1024,
    });
    this.connectID = opts.connectID;
    this.dialID = opts.dialID;
    this.address = opts.address;
    this.role = opts.role;
    this.log = opts.log;
    this.sendWindow = opts.flowControl ? opts.limits.windowBytes : Number.POSITIVE_INFINITY;
    this.recvWindow = new ReceiveWindow(opts.limits, host.windowGrowth);
  }

  // ---------- packets from the peer (called by the tunnel) ----------

  receiveData(data: Uint8Array): void {
    if (this.destroyed) return;
    if (this.halfCloseReceived || this.peerGone) {
      this.destroy(new Error('peer sent DATA after closing its side'));
      return;
    }
    this.bytesIn += data.length;
    noteBytesMoved(data.length);
    const overrun = this.recvWindow.receive(data.length);
    if (this.opts.flowControl) {
      if (overrun > 0) {
        const reason = `peer overran the flow-control window (${overrun} > ${this.recvWindow.size} bytes)`;
        this.log.warn({ connectID: this.connectID, dialID: String(this.dialID), address: this.address }, `closing connection: ${reason}`);
        this.destroy(new Error(reason));
        return;
      }
    }
    const chunk = Buffer.from(data.buffer, data.byteOffset, data.length);
    if (this.sink) this.writeToSink(this.sink, chunk);
    else this.push(chunk);
    if (!this.opts.flowControl) this.boundUnflowed();
  }

  /** Received bytes the local reader has not taken yet: our readable buffer, or the sink's write buffer. */
  private queuedBytes(): number {
    return this.sink ? this.sink.writableLength : this.readableLength;
  }

  /**
   * Without flow control only pausing the stream stops the peer (#12): at
   * unflowedBufferBytes buffered for this reader the tunnel stops reading,
   * and resumes once the reader took half of them. Every byte is delivered,
   * however slow the reader; the other connections on the stream wait
   * meanwhile, as they do with upstream.
   */
  private boundUnflowed(): void {
    const queued = this.destroyed ? 0 : this.queuedBytes();
    if (queued !== this.reportedUnflowed) {
      this.host.noteUnflowedBytes(queued - this.reportedUnflowed);
      this.reportedUnflowed = queued;
    }
    const limit = this.opts.limits.unflowedBufferBytes;
    if (!this.holding && queued >= limit) {
      this.holding = true;
      this.host.holdInbound(this.connectID, true);
    } else if (this.holding && queued < limit / 2) {
      this.holding = false;
      this.host.holdInbound(this.connectID, false);
    }
  }

  /** The local reader took bytes: release a hold, return credit to the peer. */
  private consumed(): void {
    this.lingerTimer?.refresh();
    if (!this.opts.flowControl) this.boundUnflowed();
    else if (!this.peerGone) {
      const credit = this.recvWindow.consumed(this.queuedBytes());
      if (credit > 0) this.host.sendWindow(this.connectID, credit);
    }
  }

  /**
   * Delivers inbound bytes straight into `sink` (the socket or tunnelled
   * connection this one is spliced to) instead of through the readable side and
   * pipe(): the readable side then only carries the end of the stream.
   * Writes made in one turn of the event loop (a TLS read holds several
   * HTTP/2 frames) reach the socket as one writev, and credit is granted as
   * the socket's own buffer empties, so the window bounds what the socket
   * holds just as it bounded our readable buffer.
   */
  deliverTo(sink: Writable): void {
    // Bytes that arrived before the splice go first.
    for (let c = this.read() as Buffer | null; c !== null; c = this.read() as Buffer | null) sink.write(c);
    this.sink = sink;
    // A pipe in all but name: tell the sink who feeds it, as pipe() does.
    sink.emit('pipe', this);
    this.on('end', () => sink.end()); // 'end' comes once; on() is lighter than once()
    this.resume(); // flowing, so 'end' is emitted once the peer's end is pushed
  }

  private writeToSink(sink: Writable, chunk: Buffer): void {
    if (sink.destroyed) return; // the splice is closing this connection
    if (!this.sinkCorked) {
      this.sinkCorked = true;
      sink.cork();
      setImmediate(this.uncorkSink);
    }
    sink.write(chunk, this.onSinkWritten);
  }

  private readonly uncorkSink = (): void => {
    this.sinkCorked = false;
    this.sink?.uncork();
  };

  /** A write to the sink completed: what left its buffer is consumed. */
  private readonly onSinkWritten = (): void => {
    if (this.sink && !this.destroyed) this.consumed();
  };

  receiveWindow(increment: number): void {
    if (!this.opts.flowControl || this.destroyed) return;
    this.sendWindow += increment;
    this.pump();
  }

  receiveHalfClose(): void {
    if (this.halfCloseReceived || this.destroyed) return;
    this.halfCloseReceived = true;
    this.push(null);
  }

  /**
   * The peer closed the connection (CLOSE_REQ/CLOSE_RSP/DIAL_CLS). What it
   * sent before is still delivered; nothing more goes out.
   */
  receiveClose(error: string): void {
    if (this.destroyed) return;
    this.peerGone = true;
    if (error) {
      this.destroy(new Error(`closed by peer: ${error}`));
      return;
    }
    if (this.pendingWrite) {
      const w = this.pendingWrite;
      this.pendingWrite = null;
      w.callback();
    }
    if (!this.halfCloseReceived) {
      this.halfCloseReceived = true;
      this.push(null);
    }
    if (this.readableEnded) {
      this.destroy();
      return;
    }
    this.once('end', () => this.destroy());
    // A reader that stops taking what is left must not pin the connection
    // forever; one that takes it slowly keeps it (consumed() refreshes).
    this.lingerTimer = setTimeout(() => this.destroy(), LINGER_IDLE_MS);
    this.lingerTimer.unref();
  }

  /** The tunnel died: nothing can be sent or received any more. */
  abandon(error: Error): void {
    this.peerGone = true;
    this.destroy(error);
  }

  // ---------- Duplex implementation ----------

  override _read(): void {
    // With a sink, consumption is tracked by onSinkWritten.
    if (!this.sink) this.consumed();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, callback: (error?: Error | null) => void): void {
    if (this.peerGone) {
      // The peer forgot this connection; drop quietly, the close is under way.
      callback();
      return;
    }
    noteBytesMoved(chunk.length);
    this.pendingWrite = { chunk, offset: 0, callback };
    this.pump();
  }

  override _final(callback: (error?: Error | null) => void): void {
    if (this.peerGone) {
      callback();
      return;
    }
    if (this.opts.halfClose) {
      this.halfCloseSent = true;
      this.host.sendHalfClose(this.connectID);
      callback();
      return;
    }
    // Plain Konnectivity has no half-close: a FIN closes the whole connection.
    callback();
    this.destroy();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    if (this.lingerTimer) clearTimeout(this.lingerTimer);
    this.recvWindow.release();
    if (!this.opts.flowControl) this.boundUnflowed(); // releases the hold and the buffered bytes
    const completed = this.halfCloseSent && this.halfCloseReceived;
    if (!this.peerGone && !completed) {
      this.host.sendClose(this.connectID, this.role, error?.message ?? '');
    }
    this.host.forget(this.connectID);
    const w = this.pendingWrite;
    this.pendingWrite = null;
    if (w) w.callback(error ?? new Error('connection closed'));
    if (error) this.log.debug({ connectID: this.connectID, dialID: String(this.dialID), err: error.message }, 'connection closed with error');
    callback(error);
  }

  /** Sends as much of the pending write as window and transport allow. */
  private pump(): void {
    const w = this.pendingWrite;
    if (!w || this.destroyed) return;
    const max = this.opts.limits.maxDataBytes;
    while (w.offset < w.chunk.length) {
      if (!this.host.writable) {
        this.host.whenWritable(this.resumeSend);
        return;
      }
      const n = Math.min(w.chunk.length - w.offset, max, this.sendWindow);
      if (n <= 0) return; // wait for KANAL_WINDOW
      const slice = w.chunk.subarray(w.offset, w.offset + n);
      w.offset += n;
      this.sendWindow -= n;
      this.bytesOut += n;
      this.host.sendData(this.connectID, slice);
    }
    if (!this.host.writable) {
      // Hold the write callback until the transport drains: back-pressure.
      this.host.whenWritable(this.resumeSend);
      return;
    }
    this.pendingWrite = null;
    w.callback();
  }
}
