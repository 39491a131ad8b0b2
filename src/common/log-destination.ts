/**
 * Where log lines go: a file descriptor (stdout), written so that logging
 * never blocks the event loop or shutdown (docs/operations.md). pino's default
 * destination (sonic-boom) flushes synchronously at exit and retries a failed
 * write there forever: with stdout a pipe whose reader is gone
 * (`kanal server | head -5`) every write fails with EPIPE, and SIGTERM, SIGINT
 * and even a second signal hang in that loop.
 *
 * - one fs.write in flight at a time, on libuv's thread pool: a reader that
 *   stalls holds a pool thread, never the event loop; a line that finds the
 *   destination idle waits LINGER_MS for others to join its write, and so do
 *   the lines queued behind a write when it ends (unless they fill a write or
 *   a flush waits), so a line per connection costs a pool round trip per
 *   LINGER_MS at most, not per line;
 * - lines wait in a queue of at most maxQueuedBytes; beyond that they are
 *   dropped and counted (a stalled reader must not grow memory), and a line
 *   saying how many is written once the reader catches up;
 * - EAGAIN (a full non-blocking pipe) is retried after a short pause;
 * - any other error (EPIPE: the reader is gone) ends the destination for good;
 * - flush(timeoutMs) waits for the queue to empty, but never longer;
 * - `render` rewrites each line as it arrives, its own report line included
 *   (--logging-format=text: log-text.ts), before its size is counted.
 */
import { IdleWaiters } from './idle-waiters.js';
import fs from 'node:fs';

export const DEFAULT_MAX_QUEUED_BYTES = 8 * 1024 * 1024;
const MAX_WRITE_BYTES = 256 * 1024;
const EAGAIN_RETRY_MS = 50;
/** How late a line may reach stdout so that lines of one burst share a write (flush() does not wait for it). */
const LINGER_MS = 10;

export class LogDestination {
  /** Lines not yet handed to the kernel, oldest first; queuedBytes is their total length. */
  private queue: Buffer[] = [];
  private queuedBytes = 0;
  /** Bytes of the head of `queue` already written (a partial write). */
  private headOffset = 0;
  private writing = false;
  /** Why writing stopped for good ('' while it goes on). */
  private failure = '';
  /** Lines dropped since the last report; the report itself is queued when the queue empties. */
  private droppedSinceReport = 0;
  private droppedTotal = 0;
  private readonly idleWaiters = new IdleWaiters();
  /** Set while lines wait for LINGER_MS before the next write starts. */
  private linger: NodeJS.Timeout | undefined;

  constructor(
    private readonly fd: number,
    readonly maxQueuedBytes = DEFAULT_MAX_QUEUED_BYTES,
    /** How lines are written; stdout's is set by the process's logger (stdoutDestination). */
    public render: (line: string) => string = (line) => line,
  ) {}

  /** pino's destination interface. Never blocks, never throws. */
  write(line: string): void {
    if (this.failure) {
      this.droppedTotal++;
      return;
    }
    const bytes = Buffer.from(this.render(line), 'utf8');
    if (this.queuedBytes + bytes.length > this.maxQueuedBytes) {
      this.droppedSinceReport++;
      this.droppedTotal++;
      return;
    }
    this.enqueue(bytes);
  }

  /**
   * Queues a whole line from another writer of the same descriptor (the
   * audit log on stdout), so the two never interleave inside a line. A
   * refusal is the caller's to count: it is not in this destination's report.
   */
  offer(line: string): 'queued' | 'queue_full' | 'failed' {
    if (this.failure) return 'failed';
    const bytes = Buffer.from(line, 'utf8');
    if (this.queuedBytes + bytes.length > this.maxQueuedBytes) return 'queue_full';
    this.enqueue(bytes);
    return 'queued';
  }

  /** Resolves once every queued line is written, the destination failed, or timeoutMs passed. */
  flush(timeoutMs: number): Promise<void> {
    if (this.idle()) return Promise.resolve();
    if (this.linger) this.endLinger();
    return this.idleWaiters.wait(timeoutMs);
  }

  stats(): { queuedBytes: number; dropped: number; failure: string } {
    return { queuedBytes: this.queuedBytes, dropped: this.droppedTotal, failure: this.failure };
  }

  private idle(): boolean {
    return this.failure !== '' || (this.queuedBytes === 0 && !this.writing);
  }

  private enqueue(bytes: Buffer): void {
    this.queue.push(bytes);
    this.queuedBytes += bytes.length;
    if (!this.writing && !this.linger) this.linger = setTimeout(this.endLinger, LINGER_MS).unref();
  }

  private readonly endLinger = (): void => {
    clearTimeout(this.linger);
    this.linger = undefined;
    if (!this.writing) this.writeNext();
  };

  private writeNext(): void {
    if (this.queue.length === 0) {
      if (this.droppedSinceReport > 0) {
        const n = this.droppedSinceReport;
        this.droppedSinceReport = 0;
        // Same shape as the logger's lines (logger.ts), so log readers see it.
        const report = {
          level: 'warn',
          time: new Date().toISOString(),
          msg: 'log lines dropped: stdout was not read fast enough',
          dropped: n,
        };
        this.enqueue(Buffer.from(this.render(`${JSON.stringify(report)}\n`), 'utf8'));
        return;
      }
      this.idleWaiters.wake();
      return;
    }
    this.writing = true;
    const chunk = this.nextChunk();
    fs.write(this.fd, chunk, 0, chunk.length, null, (err, written) => {
      this.writing = false;
      if (err) {
        if (err.code === 'EAGAIN') {
          this.writing = true;
          setTimeout(() => {
            this.writing = false;
            this.writeNext();
          }, EAGAIN_RETRY_MS).unref();
          return;
        }
        this.fail(err.code ?? err.message);
        return;
      }
      this.consume(written);
      this.afterWrite();
    });
  }

  /** What a finished write leaves is written at once when it fills a write, when nothing is left, or when a flush waits; else it lingers. */
  private afterWrite(): void {
    if (this.queue.length === 0 || this.queuedBytes >= MAX_WRITE_BYTES || this.idleWaiters.waiting) this.writeNext();
    else this.linger = setTimeout(this.endLinger, LINGER_MS).unref();
  }

  /** Up to MAX_WRITE_BYTES from the head of the queue, as one buffer. */
  private nextChunk(): Buffer {
    const parts: Buffer[] = [];
    let size = 0;
    for (let i = 0; i < this.queue.length && size < MAX_WRITE_BYTES; i++) {
      const part = i === 0 ? this.queue[0].subarray(this.headOffset) : this.queue[i];
      parts.push(part);
      size += part.length;
    }
    return parts.length === 1 ? parts[0] : Buffer.concat(parts, size);
  }

  private consume(written: number): void {
    this.queuedBytes -= written;
    let left = written;
    while (left > 0 && this.queue.length > 0) {
      const head = this.queue[0];
      const rest = head.length - this.headOffset;
      if (left < rest) {
        this.headOffset += left;
        return;
      }
      left -= rest;
      this.queue.shift();
      this.headOffset = 0;
    }
  }

  private fail(reason: string): void {
    this.failure = reason;
    this.droppedTotal += this.queue.length;
    this.queue = [];
    this.queuedBytes = 0;
    this.headOffset = 0;
    this.idleWaiters.wake();
  }
}

let stdout: LogDestination | undefined;

/**
 * The process's one stdout destination, created on first use. A process has one
 * --logging-format: `render` replaces the one given before (logger.ts).
 */
export function stdoutDestination(render?: (line: string) => string): LogDestination {
  stdout ??= new LogDestination(1);
  if (render) stdout.render = render;
  return stdout;
}

/** Writes what is queued for stdout, waiting at most timeoutMs (shutdown never waits for a reader). */
export function flushLogs(timeoutMs: number): Promise<void> {
  return stdout?.flush(timeoutMs) ?? Promise.resolve();
}
