/**
 * The audit log's settings, the same on server and agent, with the
 * kube-apiserver's names, meanings and defaults (its audit log is written
 * by lumberjack: github.com/natefinch/lumberjack, lumberjack.go). The audit
 * log is the process's, never a tenant's.
 */
import { UsageError } from '../common/usage-error.js';
import { countFlag } from '../settings/checks.js';
import { count, setting } from '../settings/kinds.js';
import type { ValuesOf } from '../settings/setting.js';
import type { HelpGroup } from '../settings/groups.js';

export const AUDIT = 'Audit log' satisfies HelpGroup;

/** lumberjack's megabyte. */
export const MEGABYTE = 1024 * 1024;
/** lumberjack's MaxSize when given 0 (the kube-apiserver's default passes 0): 100 megabytes. */
export const DEFAULT_MAX_SIZE_MB = 100;

export const auditSettings = {
  'audit-log-path': setting({
    type: 'string',
    describe:
      'Write one JSON line per tunnelled connection as it ends, per dial that made none and per refused peer, to this file; "-" writes them to stdout (with the logs). Empty: no audit log (docs/operations.md). A server with --workers N writes one file per worker, <name>.worker-<i>.<ext> (i from 0), and nothing to this file itself',
    group: AUDIT,
    parse: (v: string | undefined, flag): string | undefined => {
      if (v === undefined || v === '') return undefined;
      if (v.includes('\0')) throw new UsageError(`--${flag} must not contain a NUL character`);
      return v;
    },
  }),
  'audit-log-maxsize': setting({
    type: 'number',
    default: 0,
    describe: `Megabytes (MiB) the audit log file may reach before it is renamed to <name>-<UTC time>.<ext> and a new one begun; 0: ${DEFAULT_MAX_SIZE_MB}, as in the kube-apiserver`,
    group: AUDIT,
    parse: (v: number, flag): number => {
      const mb = countFlag(flag, v, 0) || DEFAULT_MAX_SIZE_MB;
      if (!Number.isSafeInteger(mb * MEGABYTE)) throw new UsageError(`--${flag} ${v} is too large`);
      return mb * MEGABYTE;
    },
  }),
  'audit-log-maxbackup': count({
    default: 0,
    min: 0,
    describe: 'Renamed (old) audit log files kept, the newest by the time in their name; 0: no limit by count',
    group: AUDIT,
  }),
  'audit-log-maxage': count({
    default: 0,
    min: 0,
    describe: 'Days an old audit log file is kept, by the time in its name; 0: no limit by age',
    group: AUDIT,
  }),
} as const;

/** The audit settings as the writer takes them (openAuditLog's `file`). */
export interface AuditLogFileOptions {
  /** A file, FIFO or character device; '-' is stdout. */
  path: string;
  /** Bytes a regular file may hold before it is rotated. */
  maxBytes: number;
  /** Old files kept (0: any number). */
  maxBackups: number;
  /** Days an old file is kept (0: for ever). */
  maxAgeDays: number;
}

/** The writer's options from the parsed settings; undefined without --audit-log-path. */
export function auditLogFileOptions(v: ValuesOf<typeof auditSettings>): AuditLogFileOptions | undefined {
  const path = v['audit-log-path'];
  if (path === undefined) return undefined;
  return { path, maxBytes: v['audit-log-maxsize'], maxBackups: v['audit-log-maxbackup'], maxAgeDays: v['audit-log-maxage'] };
}
