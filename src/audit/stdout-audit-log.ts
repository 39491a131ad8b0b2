/**
 * The audit log on stdout (`--audit-log-path -`): lines join the JSON logs'
 * queue for stdout (src/common/log-destination.ts), whole, so an audit line
 * and a log line never interleave, and stdout is written off the event loop
 * under that queue's one bound. A line it refuses is dropped and counted.
 */
import type { LogDestination } from '../common/log-destination.js';
import { auditLine, type AuditLog } from './audit-line.js';
import type { AuditMetrics } from './audit-metrics.js';
import type { DropReport } from './drop-report.js';

export class StdoutAuditLog implements AuditLog {
  private closed = false;

  constructor(
    private readonly stdout: LogDestination,
    private readonly metrics: AuditMetrics,
    private readonly drops: DropReport,
  ) {}

  write(record: object): void {
    if (this.closed) {
      this.drops.drop('shutdown');
      return;
    }
    const line = auditLine(record);
    if (line === undefined) {
      this.drops.drop('unserializable');
      return;
    }
    if (Buffer.byteLength(line, 'utf8') > this.stdout.maxQueuedBytes) {
      this.drops.drop('too_large', 1);
      return;
    }
    const before = this.stdout.stats().queuedBytes;
    const result = this.stdout.offer(line);
    if (result === 'queued') {
      this.metrics.lines.inc();
      // Caught up: room again, and well below the bound (not one line's worth at its edge).
      if (before <= this.stdout.maxQueuedBytes / 2) this.drops.caughtUp();
      return;
    }
    if (result === 'failed') this.drops.drop('write_error', 1, this.stdout.stats().failure);
    else this.drops.drop('queue_full');
  }

  async close(timeoutMs = 2000): Promise<void> {
    this.closed = true;
    await this.stdout.flush(timeoutMs);
    this.drops.close();
  }
}
