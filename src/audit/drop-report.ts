/**
 * Dropped audit lines: each counted (kanal_audit_dropped_lines_total), and
 * one warning per episode, not one per line: an episode starts with the first
 * drop and ends when writing has caught up (the queue emptied with the
 * destination up), which is logged with what the episode cost. A record's own
 * fault (too large, not JSON) is warned at most once a minute.
 */
import type { Logger } from 'pino';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import type { AuditMetrics, DropReason } from './audit-metrics.js';

const RECORD_WARNING_INTERVAL_MS = 60_000;

const WHY: Record<DropReason, string> = {
  queue_full: 'the audit log destination takes lines slower than they come; lines are dropped while its queue is full',
  write_error: 'the audit log cannot be written; lines are dropped until it can (reopened every second)',
  no_reader: 'the audit log FIFO has no reader; lines wait in the queue and are dropped beyond it until a process opens it for reading',
  too_large: 'an audit line is larger than --audit-log-maxsize or than the whole queue; dropped',
  unserializable: 'an audit record cannot be written as JSON; dropped',
  shutdown: 'audit lines still queued at shutdown, or written after it, were dropped',
};

export class DropReport {
  /** Lines dropped by reason in the episode under way; undefined between episodes. */
  private episode: Map<DropReason, number> | undefined;
  private readonly recordWarnings: RateLimitedLog;
  /** Lines dropped at or after close() are warned about once. */
  private shutdownWarned = false;

  constructor(
    private readonly metrics: AuditMetrics,
    private readonly log: Logger,
    private readonly where: string,
  ) {
    this.recordWarnings = new RateLimitedLog(log, RECORD_WARNING_INTERVAL_MS, 8);
  }

  /** Counts `lines` dropped; `cause` (an errno text) goes into the episode's warning. */
  drop(reason: DropReason, lines = 1, cause?: string): void {
    if (lines <= 0) return;
    this.metrics.drop(reason, lines);
    if (reason === 'too_large' || reason === 'unserializable') {
      this.recordWarnings.warn(reason, { auditLog: this.where, reason, ...(cause ? { cause } : {}) }, WHY[reason]);
      return;
    }
    if (reason === 'shutdown') {
      if (!this.shutdownWarned) this.log.warn({ auditLog: this.where, reason, lines }, WHY[reason]);
      this.shutdownWarned = true;
      return;
    }
    if (this.episode === undefined) {
      this.episode = new Map();
      this.log.warn({ auditLog: this.where, reason, ...(cause ? { cause } : {}) }, WHY[reason]);
    }
    this.episode.set(reason, (this.episode.get(reason) ?? 0) + lines);
  }

  /** Writing caught up: ends the episode under way, if any, with one line saying what it dropped. */
  caughtUp(): void {
    if (this.episode === undefined) return;
    const dropped = Object.fromEntries(this.episode);
    this.episode = undefined;
    this.log.info({ auditLog: this.where, dropped }, 'audit log writing again');
  }

  /** Whether an episode is under way (a warning was logged and writing has not caught up since). */
  inEpisode(): boolean {
    return this.episode !== undefined;
  }

  close(): void {
    this.recordWarnings.flush();
  }
}
