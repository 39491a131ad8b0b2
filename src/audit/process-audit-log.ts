/**
 * The audit log as a process holds it: the sink its tunnels and dialers are
 * given when they are made, writing to the file once start() opened it (the
 * writer counts in the process's registry, which exists only with the
 * process), and closed last, after every tunnel, so their final records get in.
 */
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { AuditRecord, AuditSink } from './audit-record.js';
import { openAuditLog, type AuditLog } from './audit-log.js';
import type { AuditLogFileOptions } from './settings.js';

/** How long close() waits for queued lines (a stalled FIFO gives up then, counting what is left). */
const CLOSE_TIMEOUT_MS = 2000;

export class ProcessAuditLog implements AuditSink {
  /** Set by open(), cleared by close(): records before and after go nowhere (nothing is tunnelled then). */
  private writer: AuditLog | undefined;

  constructor(private readonly file: AuditLogFileOptions) {}

  /** Opens the file (throws AuditLogPathError naming --audit-log-path when it cannot be). */
  async open(registry: Registry, log: Logger): Promise<void> {
    this.writer ??= await openAuditLog({ file: this.file, registry, log });
  }

  write(record: AuditRecord): void {
    this.writer?.write(record);
  }

  async close(): Promise<void> {
    const writer = this.writer;
    this.writer = undefined;
    await writer?.close(CLOSE_TIMEOUT_MS);
  }
}
