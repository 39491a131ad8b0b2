/**
 * Rotated audit files named as lumberjack names them (github.com/natefinch/lumberjack,
 * lumberjack.go: backupName, timeFromName, millRunOnce), so tools written for
 * the kube-apiserver's audit files find Kanal's: `<name>-<time>.<ext>`, the
 * time in UTC as Go's layout "2006-01-02T15-04-05.000" (`audit.log` becomes
 * `audit-2026-11-27T05-40-00.123.log`).
 */
import path from 'node:path';

/** The current file's name split where lumberjack splits it: before its last extension. */
function prefixAndExt(file: string): { prefix: string; ext: string } {
  const base = path.basename(file);
  const ext = path.extname(base);
  return { prefix: `${base.slice(0, base.length - ext.length)}-`, ext };
}

const two = (n: number): string => String(n).padStart(2, '0');

/** `2006-01-02T15-04-05.000` for `ms` since the epoch, in UTC. */
export function backupTimestamp(ms: number): string {
  const d = new Date(ms);
  return (
    `${d.getUTCFullYear()}-${two(d.getUTCMonth() + 1)}-${two(d.getUTCDate())}` +
    `T${two(d.getUTCHours())}-${two(d.getUTCMinutes())}-${two(d.getUTCSeconds())}.${String(d.getUTCMilliseconds()).padStart(3, '0')}`
  );
}

/** The path `file` is renamed to when rotated at `ms`. */
export function backupPath(file: string, ms: number): string {
  const { prefix, ext } = prefixAndExt(file);
  return path.join(path.dirname(file), `${prefix}${backupTimestamp(ms)}${ext}`);
}

const TIMESTAMP = /^(\d{4})-(\d{2})-(\d{2})T(\d{2})-(\d{2})-(\d{2})\.(\d{3})$/;

/** The rotation time in a backup's name (ms since the epoch), or undefined for a name that is not a backup of `file`. */
export function backupTime(file: string, name: string): number | undefined {
  const { prefix, ext } = prefixAndExt(file);
  if (!name.startsWith(prefix) || !name.endsWith(ext) || name.length <= prefix.length + ext.length) return undefined;
  const m = TIMESTAMP.exec(name.slice(prefix.length, name.length - ext.length));
  if (!m) return undefined;
  const [year, month, day, hour, minute, second, milli] = m.slice(1).map(Number);
  const ms = Date.UTC(year, month - 1, day, hour, minute, second, milli);
  // Date.UTC rolls over (month 13, second 61): such a name is none of ours.
  return backupTimestamp(ms) === m[0] ? ms : undefined;
}

export interface Retention {
  /** Backups kept, newest first (0: any number). */
  maxBackups: number;
  /** Days a backup is kept after its rotation time (0: for ever). */
  maxAgeDays: number;
}

const DAY_MS = 24 * 60 * 60 * 1000;

/**
 * Of the names in the current file's directory, the backups to delete:
 * beyond the newest maxBackups, and older than maxAgeDays at `now`
 * (lumberjack's millRunOnce). Other names are never chosen.
 */
export function expiredBackups(file: string, names: readonly string[], retention: Retention, now: number): string[] {
  const backups = names
    .map((name) => ({ name, time: backupTime(file, name) }))
    .filter((b): b is { name: string; time: number } => b.time !== undefined)
    .sort((a, b) => b.time - a.time);
  const cutoff = now - retention.maxAgeDays * DAY_MS;
  return backups
    .filter((b, i) => (retention.maxBackups > 0 && i >= retention.maxBackups) || (retention.maxAgeDays > 0 && b.time < cutoff))
    .map((b) => b.name);
}
