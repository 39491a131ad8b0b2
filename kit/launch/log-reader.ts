/**
 * Reading a child's JSON log (pino lines, or any one-object-per-line output)
 * from its log file while it runs: the one log reader of the kit.
 */
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { levels, type Level } from 'pino';

export interface LogLine {
  /** The level's name, as Kanal writes it (`"level":"warn"`); pino's number on another writer's line is read as its name. */
  level: Level;
  msg: string;
  [field: string]: unknown;
}

/** Whether a line's `level` (a name, or pino's number) is `floor` or more severe; false for anything else. */
export function levelAtLeast(level: unknown, floor: Level): boolean {
  const n = typeof level === 'number' ? level : typeof level === 'string' ? levels.values[level] : undefined;
  return n !== undefined && n >= levels.values[floor];
}

function levelName(level: unknown): Level | undefined {
  const name = typeof level === 'number' ? levels.labels[level] : level;
  return typeof name === 'string' && name in levels.values ? (name as Level) : undefined;
}

/** The file's text ('' while it does not exist). */
export function readLogText(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}

/** Every line of `text` that is a JSON object; a line being written (not yet whole) is skipped. */
export function jsonObjects(text: string): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  for (const line of text.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      const parsed: unknown = JSON.parse(line);
      if (parsed && typeof parsed === 'object' && !Array.isArray(parsed)) out.push(parsed as Record<string, unknown>);
    } catch {
      // a line being written right now; the next read sees it whole
    }
  }
  return out;
}

/** Lines of a JSON log that look like pino's (a string msg and a level), each level as its name. */
export function pinoLines(objects: Record<string, unknown>[]): LogLine[] {
  return objects.flatMap((o) => {
    const level = levelName(o.level);
    return typeof o.msg === 'string' && level !== undefined ? [{ ...o, msg: o.msg, level }] : [];
  });
}

/** The pino lines of a log file. */
export function readLog(file: string): LogLine[] {
  return pinoLines(jsonObjects(readLogText(file)));
}

/** The last lines of a log file, for failure messages. */
export function logTail(file: string, lines = 15): string {
  return fs.existsSync(file) ? readLogText(file).split('\n').slice(-lines).join('\n') : '(no log file)';
}

/** A wait for a log file to show something. */
export interface LogWait<T> {
  file: string;
  /** What is sought in the file's whole text; undefined while it is not there. */
  find: (text: string) => T | undefined;
  timeoutMs: number;
  /** Names what is awaited in the error. */
  what: string;
  /** Why the writer is gone (e.g. "exited with code 1"), or undefined while it runs. */
  ended?: () => string | undefined;
}

/**
 * Polls a log file until `find` finds something in its text; throws with the
 * log's tail after timeoutMs, or as soon as `ended()` tells the writer is gone
 * without it.
 */
export async function waitUntilLogged<T>({ file, find, timeoutMs, what, ended = () => undefined }: LogWait<T>): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    // Exit first, then the read: a line written just before the exit still counts.
    const gone = ended();
    const found = find(readLogText(file));
    if (found !== undefined) return found;
    if (gone !== undefined) throw new Error(`no log line "${what}" in ${file}: the process ${gone}; tail:\n${logTail(file)}`);
    if (Date.now() >= deadline) {
      throw new Error(`no log line "${what}" in ${file} after ${timeoutMs} ms; tail:\n${logTail(file)}`);
    }
    await sleep(50);
  }
}

/** Polls a JSON log file until a pino line matches (see waitUntilLogged). */
export function waitForLog({ match, ...wait }: Omit<LogWait<LogLine>, 'find'> & { match: (l: LogLine) => boolean }): Promise<LogLine> {
  return waitUntilLogged({ ...wait, find: (text) => pinoLines(jsonObjects(text)).find(match) });
}

/** A warn (or worse) line whose msg contains `text`. */
export const warnLine =
  (text: string, extra: (l: LogLine) => boolean = () => true) =>
  (l: LogLine): boolean =>
    levelAtLeast(l.level, 'warn') && l.msg.includes(text) && extra(l);
