/**
 * A regular audit file, appended to with async fs calls (libuv's thread
 * pool), rotated as lumberjack rotates the kube-apiserver's audit file: when
 * the next line would take it past maxBytes it is renamed to its backup name
 * (backup-names.ts), a new file takes its name, and backups beyond
 * maxBackups or older than maxAgeDays are deleted. A failed rotation is
 * counted and warned; the file is written on past its size and rotation is
 * tried again later.
 *
 * The file is this process's own (owned-files.ts): a new one is created with
 * O_CREAT|O_EXCL|O_NOFOLLOW, so a name another user planted (a symbolic
 * link, a file, a FIFO) is never followed or appended to; an existing one is
 * opened with O_NOFOLLOW and kept only if its descriptor shows a regular
 * file of this user that no one else may write. Rotation leaves no moment
 * in which the path is opened by name: the new file is created under a
 * private temporary name, the current file renamed to its backup name only
 * if it is still the one we write, then the new file renamed into place
 * (rename(2) replaces whatever appeared there, without following it).
 * Pruning deletes only backups this process could have written: regular
 * files (not links) named as backups, owned by this user, writable by no
 * one else.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import type { FileHandle } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from 'pino';
import { notOwnFileProblem } from '../common/owned-files.js';
import type { AuditMetrics } from './audit-metrics.js';
import { backupPath, backupTime, expiredBackups } from './backup-names.js';
import type { AuditLogFileOptions } from './settings.js';
import { SinkError, errnoText, type Sink } from './sink.js';

/** After a failed rename, the file grows past its size this long before the next try (one warning per streak of failures). */
const ROTATE_RETRY_MS = 10_000;
/** The kube-apiserver creates its audit file so (k8s.io/apiserver, options/audit.go: ensureLogFile). */
const FILE_MODE = 0o600;

const { O_WRONLY, O_APPEND, O_CREAT, O_EXCL, O_NOFOLLOW, O_NONBLOCK } = fs.constants;
/** A file of our own, new: fails on any name already there, a symbolic link included (open(2)). */
const CREATE_NEW = O_WRONLY | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW;
/** An existing file: never through a link, and never blocking on a FIFO put in its place. */
const OPEN_EXISTING = O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK;

type RotationStep = 'rename' | 'open' | 'prune';

function errnoCode(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException | undefined)?.code;
}

/** lstat, or undefined when nothing is there. */
async function lstatOrUndefined(file: string): Promise<fs.Stats | undefined> {
  try {
    return await fs.promises.lstat(file);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return undefined;
    throw err;
  }
}

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
  /** Files named like backups that are not ours were warned about (once per sink). */
  private foreignWarned = false;
  /** Deleting old backups, at most one at a time. */
  private pruning: Promise<void> | undefined;
  /** A prune was asked for while one ran (prune()). */
  private pruneAgain = false;

  constructor(
    private readonly file: AuditLogFileOptions,
    private readonly metrics: AuditMetrics,
    private readonly log: Logger,
    private readonly now: () => number = Date.now,
  ) {}

  async open(): Promise<void> {
    const file = this.file.path;
    let handle: FileHandle;
    let created = true;
    try {
      handle = await fs.promises.open(file, CREATE_NEW, FILE_MODE);
    } catch (err) {
      if (errnoCode(err) !== 'EEXIST') throw new SinkError('write_error', 0, `cannot create ${file} (${errnoText(err)})`);
      created = false;
      try {
        handle = await fs.promises.open(file, OPEN_EXISTING);
      } catch (err2) {
        const why = errnoCode(err2) === 'ELOOP' ? 'it is a symbolic link, which Kanal does not follow' : errnoText(err2);
        throw new SinkError('write_error', 0, `cannot open ${file} (${why})`);
      }
    }
    const stat = await handle.stat().catch(() => undefined);
    const problem = !stat?.isFile() ? 'is not a regular file' : created ? undefined : notOwnFileProblem(stat);
    if (problem || !stat) {
      await handle.close().catch(() => {});
      throw new SinkError('write_error', 0, `refusing ${file}: it ${problem ?? 'cannot be read back'}`);
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

  /**
   * Creates the next file under a private name, renames the current one to
   * its backup name and the new one into place; throws (a SinkError) only
   * when no file is open afterwards. A failure before the current file moved
   * leaves it being written, and rotation is tried again later.
   */
  private async rotate(): Promise<void> {
    const old = this.handle;
    const file = this.file.path;
    if (!old) throw new SinkError('write_error', 0, `${file} is closed`);
    const oldStat = await old.stat().catch(() => undefined);
    // Ours, so at most the owner writes; the umask may narrow it further.
    const mode = (oldStat?.mode ?? FILE_MODE) & 0o755;
    const at = Math.max(this.now(), this.lastBackupMs + 1);
    const fresh = await this.createAside(mode);
    if (!fresh) return;
    const { handle, tmp } = fresh;
    try {
      const current = await lstatOrUndefined(file);
      // Only the file we write is moved to a backup name: anything else at the path is replaced below, never kept as a backup.
      if (current && oldStat && current.ino === oldStat.ino && current.dev === oldStat.dev) {
        await fs.promises.rename(file, backupPath(file, at));
        this.lastBackupMs = at;
      }
    } catch (err) {
      await this.discard(handle, tmp);
      // Removed by someone else meanwhile: nothing to rename, the new file is all it takes (below, next time).
      this.rotationFailed('rename', err);
      this.rotateNotBefore = this.now() + ROTATE_RETRY_MS;
      return;
    }
    try {
      await fs.promises.rename(tmp, file);
    } catch (err) {
      await this.discard(handle, tmp);
      this.rotationFailed('open', err);
      throw new SinkError('write_error', 0, `cannot put a new ${file} in place after rotating it (${errnoText(err)})`);
    }
    this.handle = handle;
    this.size = 0;
    await old.close().catch(() => {});
    this.metrics.rotations.inc();
    if (this.rotationWarned) this.log.info({ auditLog: file }, 'audit log rotated again');
    this.rotationWarned = false;
    this.prune();
  }

  /** The next file, created exclusively under a name no one else can guess; undefined (warned, retried later) when it cannot be. */
  private async createAside(mode: number): Promise<{ handle: FileHandle; tmp: string } | undefined> {
    const file = this.file.path;
    const tmp = path.join(path.dirname(file), `.${path.basename(file)}.${randomBytes(8).toString('hex')}.new`);
    try {
      return { handle: await fs.promises.open(tmp, CREATE_NEW, mode), tmp };
    } catch (err) {
      this.rotationFailed('open', err);
      this.rotateNotBefore = this.now() + ROTATE_RETRY_MS;
      return undefined;
    }
  }

  private async discard(handle: FileHandle, tmp: string): Promise<void> {
    await handle.close().catch(() => {});
    await fs.promises.unlink(tmp).catch(() => {});
  }

  /**
   * Deletes expired backups in the background. A call while one runs makes
   * it look once more when done: the rotation behind that call may have
   * added the backup that is one too many, and no later rotation may come.
   */
  private prune(): void {
    if (this.file.maxBackups === 0 && this.file.maxAgeDays === 0) return;
    if (this.pruning) {
      this.pruneAgain = true;
      return;
    }
    const run = async (): Promise<void> => {
      do {
        this.pruneAgain = false;
        await this.deleteExpired();
      } while (this.pruneAgain);
    };
    this.pruning = run().finally(() => (this.pruning = undefined));
  }

  private async deleteExpired(): Promise<void> {
    const dir = path.dirname(this.file.path);
    try {
      const names = (await fs.promises.readdir(dir)).filter((name) => backupTime(this.file.path, name) !== undefined);
      const ours: string[] = [];
      const foreign: string[] = [];
      for (const name of names) {
        const stat = await lstatOrUndefined(path.join(dir, name));
        if (!stat) continue;
        (stat.isFile() && notOwnFileProblem(stat) === undefined ? ours : foreign).push(name);
      }
      if (foreign.length > 0 && !this.foreignWarned) {
        this.foreignWarned = true;
        this.log.warn(
          { auditLog: this.file.path, ignored: foreign.slice(0, 5), count: foreign.length },
          'files named like audit log backups that this process did not write (another owner, writable by others, or not a regular file) are neither counted nor deleted',
        );
      }
      const expired = expiredBackups(this.file.path, ours, this.file, this.now());
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
