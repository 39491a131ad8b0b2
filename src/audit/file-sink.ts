/**
 * A regular audit file, appended to with async fs calls (libuv's thread
 * pool), rotated as lumberjack rotates the kube-apiserver's audit file: when
 * the next line would take it past maxBytes it is renamed to its backup name
 * (backup-names.ts), a new file takes its name, and backups beyond
 * maxBackups or older than maxAgeDays are deleted. A failed rotation is
 * counted and warned; the file is written on past its size and rotation is
 * tried again later.
 */
import fs from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import type { AuditMetrics } from './audit-metrics.js';
import { backupPath, expiredBackups } from './backup-names.js';
import type { AuditLogFileOptions } from './settings.js';
import { SinkError, errnoText, type Sink } from './sink.js';

/** After a failed rename, the file grows past its size this long before the next try (one warning per streak of failures). */
const ROTATE_RETRY_MS = 10_000;
/** The kube-apiserver creates its audit file so (k8s.io/apiserver, options/audit.go: ensureLogFile). */
const FILE_MODE = 0o600;

type RotationStep = 'rename' | 'open' | 'prune';

/** A write that failed after `lines` whole lines reached the file (a full disk, the file size limit). */
class PartialWrite extends Error {
  constructor(
    readonly lines: number,
    override readonly cause: unknown,
  ) {
    super(errnoText(cause));
  }
}

export class FileSink implements Sink {
  private handle: FileHandle | undefined;
  /** Bytes in the current file (its size when opened, plus what was written). */
  private size = 0;
  /** Rotation time of the last backup: two rotations in one millisecond still get two names. */
  private lastBackupMs = 0;
  private rotateNotBefore = 0;
  private rotationWarned = false;
  /** Deleting old backups, at most one at a time. */
  private pruning: Promise<void> | undefined;

  constructor(
    private readonly file: AuditLogFileOptions,
    private readonly metrics: AuditMetrics,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  async open(): Promise<void> {
    let handle: FileHandle;
    try {
      handle = await fs.promises.open(this.file.path, 'a', FILE_MODE);
    } catch (err) {
      throw new SinkError('write_error', 0, `cannot open ${this.file.path} (${errnoText(err)})`);
    }
    const stat = await handle.stat().catch(() => undefined);
    if (!stat?.isFile()) {
      await handle.close().catch(() => {});
      throw new SinkError('write_error', 0, `${this.file.path} is no longer a regular file`);
    }
    this.handle = handle;
    this.size = stat.size;
    this.prune();
  }

  async write(lines: readonly string[]): Promise<void> {
    let written = 0;
    let segment: Buffer[] = [];
    let segmentBytes = 0;
    try {
      for (const text of lines) {
        const line = Buffer.from(text, 'utf8');
        const filled = this.size + segmentBytes;
        if (filled > 0 && filled + line.length > this.file.maxBytes && this.now() >= this.rotateNotBefore) {
          written += await this.append(segment, segmentBytes);
          segment = [];
          segmentBytes = 0;
          await this.rotate();
        }
        segment.push(line);
        segmentBytes += line.length;
      }
      await this.append(segment, segmentBytes);
    } catch (err) {
      await this.closeHandle();
      const whole = written + (err instanceof PartialWrite ? err.lines : 0);
      const cause = err instanceof PartialWrite ? err.cause : err;
      throw cause instanceof SinkError
        ? new SinkError(cause.reason, whole, cause.message)
        : new SinkError('write_error', whole, errnoText(cause));
    }
  }

  async close(): Promise<void> {
    await this.closeHandle();
    await this.pruning;
  }

  /** Writes `lines` (`bytes` in all) at the end of the file; returns how many, or throws a PartialWrite saying how many whole ones made it. */
  private async append(lines: readonly Buffer[], bytes: number): Promise<number> {
    if (lines.length === 0) return 0;
    const buffer = lines.length === 1 ? lines[0] : Buffer.concat(lines, bytes);
    let offset = 0;
    try {
      const handle = this.handle;
      if (!handle) throw new SinkError('write_error', 0, `${this.file.path} is closed`);
      while (offset < buffer.length) {
        const { bytesWritten } = await handle.write(buffer, offset);
        offset += bytesWritten;
        this.size += bytesWritten;
      }
      return lines.length;
    } catch (err) {
      let whole = 0;
      for (let end = 0; whole < lines.length && end + lines[whole].length <= offset; whole++) end += lines[whole].length;
      throw new PartialWrite(whole, err);
    }
  }

  /** Renames the file to its backup name and opens a new one; throws (a SinkError) only when no file is open afterwards. */
  private async rotate(): Promise<void> {
    const old = this.handle;
    if (!old) throw new SinkError('write_error', 0, `${this.file.path} is closed`);
    const mode = ((await old.stat().catch(() => undefined))?.mode ?? FILE_MODE) & 0o777;
    const at = Math.max(this.now(), this.lastBackupMs + 1);
    try {
      await fs.promises.rename(this.file.path, backupPath(this.file.path, at));
      this.lastBackupMs = at;
    } catch (err) {
      // Removed by someone else: nothing to rename, a new file is all it takes.
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
        this.rotationFailed('rename', err);
        this.rotateNotBefore = this.now() + ROTATE_RETRY_MS;
        return;
      }
    }
    let fresh: FileHandle;
    try {
      fresh = await fs.promises.open(this.file.path, 'a', mode);
    } catch (err) {
      this.rotationFailed('open', err);
      throw new SinkError('write_error', 0, `cannot open a new ${this.file.path} after rotating it (${errnoText(err)})`);
    }
    this.handle = fresh;
    this.size = 0;
    await old.close().catch(() => {});
    this.metrics.rotations.inc();
    if (this.rotationWarned) this.log.info({ auditLog: this.file.path }, 'audit log rotated again');
    this.rotationWarned = false;
    this.prune();
  }

  /** Deletes expired backups in the background; a second call while one runs is skipped (the next rotation catches up). */
  private prune(): void {
    if (this.pruning || (this.file.maxBackups === 0 && this.file.maxAgeDays === 0)) return;
    this.pruning = this.deleteExpired().finally(() => (this.pruning = undefined));
  }

  private async deleteExpired(): Promise<void> {
    const dir = path.dirname(this.file.path);
    try {
      const names = await fs.promises.readdir(dir);
      const expired = expiredBackups(this.file.path, names, this.file, this.now());
      for (const name of expired) await fs.promises.unlink(path.join(dir, name));
    } catch (err) {
      this.rotationFailed('prune', err);
    }
  }

  private rotationFailed(step: RotationStep, err: unknown): void {
    this.metrics.rotationFailures.inc();
    if (this.rotationWarned) return;
    this.rotationWarned = true;
    this.log.warn(
      { auditLog: this.file.path, step, cause: errnoText(err) },
      'audit log rotation failed; the file is written on and rotation tried again (one warning until a rotation succeeds)',
    );
  }

  private async closeHandle(): Promise<void> {
    const handle = this.handle;
    this.handle = undefined;
    await handle?.close().catch(() => {});
  }
}
