/**
 * The audit log's writer: openAuditLog() gives an AuditLog whose write()
 * takes one record, queues it as one JSON line and returns, whatever the
 * destination does; close() writes what is queued, waiting a bounded time.
 * Where the lines go is chosen by what the path is: a regular file (rotated,
 * file-sink.ts), a FIFO (pipe-sink.ts), a character device (device-sink.ts),
 * or `-` for stdout (stdout-audit-log.ts). docs/operations.md, "The audit
 * log: where it goes".
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import { stdoutDestination } from '../common/log-destination.js';
import { auditLine, type AuditLog } from './audit-line.js';
import { AuditMetrics } from './audit-metrics.js';
import { DeviceSink } from './device-sink.js';
import { DropReport } from './drop-report.js';
import { FileSink } from './file-sink.js';
import { PipeSink } from './pipe-sink.js';
import { QueuedWriter, type QueueBounds } from './queued-writer.js';
import type { AuditLogFileOptions } from './settings.js';
import { SinkError, errnoText, type Sink } from './sink.js';
import { StdoutAuditLog } from './stdout-audit-log.js';
import { effectiveUid, notOwnFileProblem, unsafeDirectoryProblem } from '../common/owned-files.js';

// The setting these messages name, spelt once here: both commands' tables use this module, which sits below them in the layers.
const AUDIT_LOG_PATH = 'audit-log-path';

export type { AuditLog };

/**
 * The queue in front of a file, FIFO or device. 4 MiB holds some 10,000
 * records of ~400 bytes: several seconds of a busy server's connection ends
 * (upstream manages ~1,600 dials/s here, DESIGN.md section 4), enough to ride
 * out a rotation or a slow disk, while a destination that stops taking lines
 * costs no more than that. The line bound caps the per-line overhead of
 * many short lines at a few MiB more.
 */
export const DEFAULT_QUEUE = { maxBytes: 4 * 1024 * 1024, maxLines: 32 * 1024 } as const;

export interface OpenAuditLogOptions {
  /** Path and rotation (settings.ts, auditLogFileOptions). */
  file: AuditLogFileOptions;
  /** The process's registry (KanalMetrics.registry; with tenants, the server's own, unlabelled one). */
  registry: Registry;
  log: Logger;
  /** The queue's bounds (default DEFAULT_QUEUE; tests make them small). */
  queue?: { maxBytes: number; maxLines: number };
}

/** The path cannot serve as the audit log; the message names --audit-log-path, the path and what to fix. */
export class AuditLogPathError extends Error {
  override name = 'AuditLogPathError';
  readonly flag = AUDIT_LOG_PATH;
}

type Kind = 'file' | 'fifo' | 'device';

/** What the path is, for the writer: its kind, and whether it is reached through a symbolic link this user or root made. */
export interface AuditTarget {
  kind: Kind;
  follow: boolean;
}

function statOrUndefined(file: string): fs.Stats | undefined {
  try {
    return fs.statSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

function lstatOrUndefined(file: string): fs.Stats | undefined {
  try {
    return fs.lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

/** What may not be done here, as "cannot ... (EACCES: ...)", or undefined when it may. */
function accessProblem(file: string, mode: number, what: string): string | undefined {
  try {
    fs.accessSync(file, mode);
    return undefined;
  } catch (err) {
    return `${what} (${errnoText(err)})`;
  }
}

/** What `stat` is, for the writer; `refused` says why it cannot be an audit log. */
function kindOf(stat: fs.Stats | undefined): { kind: Kind } | { refused: string } {
  if (stat === undefined || stat.isFile()) return { kind: 'file' };
  if (stat.isFIFO()) return { kind: 'fifo' };
  if (stat.isCharacterDevice()) return { kind: 'device' };
  const what = stat.isDirectory() ? 'a directory' : stat.isSocket() ? 'a socket' : stat.isBlockDevice() ? 'a block device' : 'not a file';
  return { refused: `is ${what}; name a file, a FIFO or a character device, or - for stdout` };
}

/**
 * What the path names and whether it may be written (owned-files.ts): a
 * regular file or FIFO that exists must be this user's and writable by no
 * one else; a symbolic link is followed only to a FIFO or a character
 * device (/dev/stdout, /proc/self/fd/N) and only when this user or root
 * made it, never to a regular file (rotation would rename the link).
 * Character devices are made only by root and are written as they are.
 */
function inspect(file: string): AuditTarget | { refused: string } {
  const link = lstatOrUndefined(file);
  const follow = link?.isSymbolicLink() ?? false;
  if (link && follow) {
    const self = effectiveUid();
    if (link.uid !== self && link.uid !== 0)
      return { refused: `is a symbolic link owned by uid ${link.uid}: another user chose where Kanal would write; remove it` };
  }
  const stat = follow ? statOrUndefined(file) : link;
  if (follow && (stat === undefined || stat.isFile()))
    return {
      refused: 'is a symbolic link; name the file itself (Kanal opens its audit file with O_NOFOLLOW, and rotation renames the file)',
    };
  const what = kindOf(stat);
  if ('refused' in what) return what;
  if (stat && what.kind !== 'device') {
    const problem = notOwnFileProblem(stat);
    if (problem) return { refused: problem };
  }
  return { kind: what.kind, follow };
}

/**
 * Why `--audit-log-path` cannot be written, or undefined when it can (also
 * for "-" and no path): the directory must exist, be safe from other users
 * (owned-files.ts: unsafeDirectoryProblem) and allow creating and renaming
 * files in it when the path is a regular file (rotation), and the path
 * itself must be ours (inspect) and writable. For `--dry-run` and the start.
 */
export function auditLogPathProblem(file: string | undefined): string | undefined {
  if (file === undefined || file === '-') return undefined;
  const named = `--${AUDIT_LOG_PATH} ${file}`;
  const dir = path.dirname(file);
  try {
    const dirStat = statOrUndefined(dir);
    if (dirStat === undefined) return `${named}: the directory ${dir} does not exist (create it, or name a file in another)`;
    if (!dirStat.isDirectory()) return `${named}: ${dir} is not a directory`;
    const what = inspect(file);
    if ('refused' in what) return `${named}: ${what.refused}`;
    if (what.kind === 'file') {
      const unsafe = unsafeDirectoryProblem(dir);
      if (unsafe) return `${named}: ${unsafe}`;
    }
    const problem =
      what.kind === 'file'
        ? accessProblem(dir, fs.constants.W_OK | fs.constants.X_OK, `cannot create files in ${dir}, as rotation does`)
        : undefined;
    if (problem) return `${named}: ${problem}`;
    const fileProblem = statOrUndefined(file) ? accessProblem(file, fs.constants.W_OK, 'cannot write it') : undefined;
    return fileProblem ? `${named}: ${fileProblem}` : undefined;
  } catch (err) {
    return `${named}: ${errnoText(err)}`;
  }
}

/** Throws an AuditLogPathError when `--audit-log-path` cannot be written (auditLogPathProblem): `--dry-run` and the start run it alike. */
export function checkAuditLogPath(file: string | undefined): void {
  const problem = auditLogPathProblem(file);
  if (problem) throw new AuditLogPathError(problem);
}

/**
 * Opens the audit log `options.file` names, its metrics on
 * `options.registry`. Throws an AuditLogPathError when the path cannot be
 * written; a FIFO nobody reads yet is no error: lines wait (and are dropped
 * beyond the queue) until a reader opens it, a warning says so.
 */
export async function openAuditLog(options: OpenAuditLogOptions): Promise<AuditLog> {
  const { file, registry } = options;
  const log = options.log.child({ part: 'audit' });
  if (file.path === '-') {
    const stdout = stdoutDestination();
    const metrics = new AuditMetrics(registry, () => stdout.stats().queuedBytes);
    return new StdoutAuditLog(stdout, metrics, new DropReport(metrics, log, '-'));
  }
  const problem = auditLogPathProblem(file.path);
  if (problem) throw new AuditLogPathError(problem);
  const what = inspect(file.path);
  // Checked just above; a path replaced in between is taken as a file, whose open then refuses what it finds (file-sink.ts).
  const { kind, follow } = 'kind' in what ? what : { kind: 'file' as const, follow: false };
  let pending = (): number => 0;
  const metrics = new AuditMetrics(registry, () => pending());
  const sink: Sink =
    kind === 'fifo'
      ? new PipeSink(file.path, follow)
      : kind === 'device'
        ? new DeviceSink(file.path, follow)
        : new FileSink(file, metrics, log);
  const bounds: QueueBounds = { ...(options.queue ?? DEFAULT_QUEUE), maxLineBytes: kind === 'file' ? file.maxBytes : Infinity };
  const drops = new DropReport(metrics, log, file.path);
  const writer = new QueuedWriter(sink, bounds, metrics, drops);
  pending = () => writer.pendingBytes();
  try {
    await sink.open();
  } catch (err) {
    if (!(err instanceof SinkError && err.reason === 'no_reader'))
      throw new AuditLogPathError(`--${AUDIT_LOG_PATH} ${file.path}: ${errnoText(err)}`);
    log.warn(
      { auditLog: file.path },
      'the audit log FIFO has no reader yet (ENXIO); lines wait in the queue, dropped beyond it, until a process opens it for reading (tried every second)',
    );
    writer.startDown('no_reader');
  }
  return {
    write(record: object): void {
      const line = auditLine(record);
      if (line === undefined) drops.drop('unserializable');
      else writer.push(line);
    },
    async close(timeoutMs = 2000): Promise<void> {
      await writer.close(timeoutMs);
      drops.close();
    },
  };
}
