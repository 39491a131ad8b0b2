/** The audit log's metrics, the same names on server and agent (docs/metrics.md). */
import { Counter, Gauge, type Registry } from '../domain/prom-client.js';

/**
 * Why a line was not written: queue_full (the destination is slower than the
 * lines come), write_error (the destination failed, or is being reopened),
 * no_reader (a FIFO nobody has open for reading), too_large (one line above
 * --audit-log-maxsize or the whole queue), unserializable (a record JSON cannot hold), shutdown
 * (still queued when close() gave up, or written after it).
 */
export const DROP_REASONS = ['queue_full', 'write_error', 'no_reader', 'too_large', 'unserializable', 'shutdown'] as const;
export type DropReason = (typeof DROP_REASONS)[number];

export class AuditMetrics {
  readonly lines: Counter;
  private readonly dropped: Counter<'reason'>;
  readonly rotations: Counter;
  readonly rotationFailures: Counter;

  /** `queuedBytes` is read at scrape time. */
  constructor(registry: Registry, queuedBytes: () => number) {
    const registers = [registry];
    this.lines = new Counter({
      name: 'kanal_audit_lines_total',
      help: 'Audit lines written (on stdout: taken into the stdout queue)',
      registers,
    });
    this.dropped = new Counter({
      name: 'kanal_audit_dropped_lines_total',
      help: `Audit lines dropped, by reason: ${DROP_REASONS.join(', ')}`,
      labelNames: ['reason'],
      registers,
    });
    for (const reason of DROP_REASONS) this.dropped.inc({ reason }, 0);
    new Gauge({
      name: 'kanal_audit_queued_bytes',
      help: 'Audit bytes waiting to be written (on stdout: everything queued for stdout, log lines included)',
      registers,
      collect() {
        this.set(queuedBytes());
      },
    });
    this.rotations = new Counter({ name: 'kanal_audit_rotations_total', help: 'Audit log files rotated', registers });
    this.rotationFailures = new Counter({
      name: 'kanal_audit_rotation_failures_total',
      help: 'Audit log rotations (rename, new file, deleting old files) that failed; the writer went on',
      registers,
    });
  }

  drop(reason: DropReason, lines = 1): void {
    this.dropped.inc({ reason }, lines);
  }
}
