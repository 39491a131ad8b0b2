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
import { StateMachine, type Lifecycle } from '../common/state-machine.js';

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
 * every REOPEN_MS while lines queue (`timer` until the reopen starts, then
 * undefined while it runs; a failed reopen goes down again); closed: close()
 * was called, nothing is taken any more. Only while open is a write in flight.
 */
type State =
  | { readonly kind: 'open' }
  | { readonly kind: 'down'; readonly reason: SinkDown; readonly timer: NodeJS.Timeout | undefined }
  | { readonly kind: 'closed' };

const WRITER: Lifecycle<State> = {
  name: 'audit writer',
  moves: { open: ['down', 'closed'], down: ['down', 'open', 'closed'], closed: [] },
};
const OPEN: State = { kind: 'open' };
const CLOSED: State = { kind: 'closed' };

export class QueuedWriter {
  private readonly life = new StateMachine<State>(OPEN, WRITER);
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
    if (this.life.kind === 'closed') {
      this.drops.drop('shutdown');
      return;
    }
    const bytes = Buffer.byteLength(line, 'utf8');
    if (bytes > this.bounds.maxLineBytes || bytes > this.bounds.maxBytes) {
      this.drops.drop('too_large', 1, `${bytes} bytes`);
      return;
    }
    if (this.queuedBytes + bytes > this.bounds.maxBytes || this.queue.length + this.inFlight >= this.bounds.maxLines) {
      const s = this.life.state;
      this.drops.drop(s.kind === 'down' ? s.reason : 'queue_full');
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
    if (this.life.kind === 'closed') return;
    if (this.life.kind === 'open' && (this.writing || this.queue.length > 0)) {
      await this.idleWaiters.wait(timeoutMs);
    }
    const s = this.life.state;
    // Another close() waited too and closed it.
    if (s.kind === 'closed') return this.sink.close();
    if (s.kind === 'down' && s.timer) clearTimeout(s.timer);
    this.life.to(CLOSED);
    this.drops.drop('shutdown', this.queue.length);
    this.queuedBytes -= this.queue.reduce((n, line) => n + Buffer.byteLength(line, 'utf8'), 0);
    this.queue = [];
    // A write in flight rejects when the sink closes; its lines are counted then.
    await this.sink.close();
  }

  private pump(): void {
    if (this.writing || this.life.kind !== 'open') return;
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
    if (this.life.kind === 'closed') {
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
    this.life.to({ kind: 'down', reason, timer });
    // close() does not wait for a destination that failed.
    this.idleWaiters.wake();
  }

  private reopen(): void {
    const s = this.life.state;
    if (s.kind !== 'down') return;
    this.life.to({ kind: 'down', reason: s.reason, timer: undefined });
    this.sink.open().then(
      () => {
        if (this.life.kind === 'closed') {
          void this.sink.close();
          return;
        }
        if (this.life.kind !== 'down') return;
        this.life.to(OPEN);
        this.pump();
      },
      (err: unknown) => {
        if (this.life.kind !== 'down') return;
        this.goDown(err instanceof SinkError ? err.reason : 'write_error');
      },
    );
  }
}
