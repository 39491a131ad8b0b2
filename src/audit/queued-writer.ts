/**
 * The audit log in front of a file, FIFO or character device: write() puts
 * one line in a bounded queue and returns; one write at a time takes lines
 * from it to the sink (sink.ts), off the event loop. A full queue drops the
 * new line; a failed destination drops what was in flight and is reopened
 * every second while lines wait (drop-report.ts counts and warns).
 */
import { IdleWaiters } from '../common/idle-waiters.js';
import type { AuditMetrics } from './audit-metrics.js';
import type { DropReport } from './drop-report.js';
import { SinkError, errnoText, type Sink, type SinkDown } from './sink.js';

/** How much one write takes from the queue: large enough to amortise a system call, small enough not to hold a pool thread long. */
const MAX_BATCH_BYTES = 256 * 1024;
const REOPEN_MS = 1000;

export interface QueueBounds {
  /** Bytes queued or being written. */
  maxBytes: number;
  /** Lines queued or being written: each costs a string header besides its bytes. */
  maxLines: number;
  /** A longer line is dropped as too_large (the file's rotation size). */
  maxLineBytes: number;
}

/**
 * open: lines go to the sink; down: the sink failed or has no reader, reopened
 * every REOPEN_MS while lines queue; closed: close() was called, nothing is
 * taken any more.
 */
type State = { kind: 'open' } | { kind: 'down'; reason: SinkDown; timer: NodeJS.Timeout | undefined } | { kind: 'closed' };

export class QueuedWriter {
  private state: State = { kind: 'open' };
  /**
   * Lines waiting, oldest first, as strings: a Buffer from Node's shared
   * pool would keep its whole 8 KiB slab alive while it waits. `inFlight`
   * lines left it and are being written. Invariant: queuedBytes = the UTF-8
   * bytes of both.
   */
  private queue: string[] = [];
  private inFlight = 0;
  private queuedBytes = 0;
  private writing = false;
  private readonly idleWaiters = new IdleWaiters();

  constructor(
    private readonly sink: Sink,
    private readonly bounds: QueueBounds,
    private readonly metrics: AuditMetrics,
    private readonly drops: DropReport,
  ) {}

  /** Bytes queued or being written (the kanal_audit_queued_bytes gauge). */
  pendingBytes(): number {
    return this.queuedBytes;
  }

  /** Starts with the sink down (a FIFO without a reader at start): lines queue, it is reopened every second. */
  startDown(reason: SinkDown): void {
    this.goDown(reason);
  }

  /** Queues one line (ending in a newline). Never blocks, never throws. */
  push(line: string): void {
    if (this.state.kind === 'closed') {
      this.drops.drop('shutdown');
      return;
    }
    const bytes = Buffer.byteLength(line, 'utf8');
    if (bytes > this.bounds.maxLineBytes || bytes > this.bounds.maxBytes) {
      this.drops.drop('too_large', 1, `${bytes} bytes`);
      return;
    }
    if (this.queuedBytes + bytes > this.bounds.maxBytes || this.queue.length + this.inFlight >= this.bounds.maxLines) {
      this.drops.drop(this.state.kind === 'down' ? this.state.reason : 'queue_full');
      return;
    }
    this.queue.push(line);
    this.queuedBytes += bytes;
    this.pump();
  }

  /**
   * Stops taking lines; waits for the queue to be written, at most
   * timeoutMs; what is left is dropped (shutdown) and the sink closed.
   */
  async close(timeoutMs: number): Promise<void> {
    if (this.state.kind === 'closed') return;
    if (this.state.kind === 'open' && (this.writing || this.queue.length > 0)) {
      await this.idleWaiters.wait(timeoutMs);
    }
    if (this.state.kind === 'down' && this.state.timer) clearTimeout(this.state.timer);
    this.state = { kind: 'closed' };
    this.drops.drop('shutdown', this.queue.length);
    this.queuedBytes -= this.queue.reduce((n, line) => n + Buffer.byteLength(line, 'utf8'), 0);
    this.queue = [];
    // A write in flight rejects when the sink closes; its lines are counted then.
    await this.sink.close();
  }

  private pump(): void {
    if (this.writing || this.state.kind !== 'open') return;
    if (this.queue.length === 0) {
      this.drops.caughtUp();
      this.idleWaiters.wake();
      return;
    }
    let n = 0;
    let bytes = 0;
    for (; n < this.queue.length; n++) {
      const size = Buffer.byteLength(this.queue[n], 'utf8');
      if (n > 0 && bytes + size > MAX_BATCH_BYTES) break;
      bytes += size;
    }
    const batch = this.queue.splice(0, n);
    this.inFlight = n;
    this.writing = true;
    this.sink.write(batch).then(
      () => this.written(batch.length, bytes),
      (err: unknown) => this.failed(batch, bytes, err),
    );
  }

  private written(lines: number, bytes: number): void {
    this.writing = false;
    this.inFlight = 0;
    this.queuedBytes -= bytes;
    this.metrics.lines.inc(lines);
    this.pump();
  }

  private failed(batch: readonly string[], bytes: number, err: unknown): void {
    this.writing = false;
    this.inFlight = 0;
    this.queuedBytes -= bytes;
    const written = err instanceof SinkError ? err.linesWritten : 0;
    if (written > 0) this.metrics.lines.inc(written);
    if (this.state.kind === 'closed') {
      this.drops.drop('shutdown', batch.length - written);
      return;
    }
    const reason = err instanceof SinkError ? err.reason : 'write_error';
    this.drops.drop(reason, batch.length - written, errnoText(err));
    this.goDown(reason);
  }

  private goDown(reason: SinkDown): void {
    const timer = setTimeout(() => this.reopen(), REOPEN_MS);
    timer.unref();
    this.state = { kind: 'down', reason, timer };
    // close() does not wait for a destination that failed.
    this.idleWaiters.wake();
  }

  private reopen(): void {
    if (this.state.kind !== 'down') return;
    this.state.timer = undefined;
    this.sink.open().then(
      () => {
        if (this.state.kind === 'closed') {
          void this.sink.close();
          return;
        }
        if (this.state.kind !== 'down') return;
        this.state = { kind: 'open' };
        this.pump();
      },
      (err: unknown) => {
        if (this.state.kind !== 'down') return;
        this.goDown(err instanceof SinkError ? err.reason : 'write_error');
      },
    );
  }
}
