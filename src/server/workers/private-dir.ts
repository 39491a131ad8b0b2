/**
 * The primary's private directory (docs/multi-tenant.md, "Workers"): the
 * Unix sockets its workers relay connections over. Created 0700 in the
 * temporary directory with the primary's pid in its name, removed on every
 * way out the process has (a stop, a signal, an uncaught error: the 'exit'
 * event); a primary killed with SIGKILL cannot, so the next primary removes
 * the directories of primaries that are gone.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Logger } from 'pino';
import { errorMessage } from '../../common/error-message.js';

const PREFIX = 'kanal-workers-';
/** `kanal-workers-<pid>-<mkdtemp's 6 characters>`. */
const NAME = /^kanal-workers-([1-9]\d{0,9})-[A-Za-z0-9]{6}$/;

/** Whether process `pid` exists (EPERM: it does, as another user). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'ESRCH';
  }
}

/**
 * Removes what a primary killed before it could clean up left in `tmp`: only
 * entries named as this module names them, that are directories (lstat: a
 * symlink is never followed), owned by this user with mode 0700, whose pid
 * is gone. In a sticky /tmp nobody else can rename an entry this user owns,
 * so what was checked is what is removed. Returns the paths removed.
 */
export function removeStaleDirs(log: Logger, tmp = os.tmpdir()): string[] {
  const uid = process.getuid?.();
  let names: string[];
  try {
    names = fs.readdirSync(tmp);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const name of names) {
    const m = NAME.exec(name);
    if (!m || Number(m[1]) === process.pid) continue;
    const dir = path.join(tmp, name);
    let st: fs.Stats;
    try {
      st = fs.lstatSync(dir);
    } catch {
      continue;
    }
    if (!st.isDirectory() || (uid !== undefined && st.uid !== uid) || (st.mode & 0o777) !== 0o700) continue;
    if (alive(Number(m[1]))) continue;
    try {
      fs.rmSync(dir, { recursive: true, force: true });
      removed.push(dir);
    } catch (err) {
      log.warn({ dir, err: errorMessage(err) }, 'cannot remove the directory a stopped primary left');
    }
  }
  if (removed.length > 0) log.info({ removed }, 'removed the directories of primaries that ended without cleaning up');
  return removed;
}

/** A private directory, removed by remove() or at the latest when the process exits. */
export interface PrivateDir {
  readonly path: string;
  remove(): void;
}

export function createPrivateDir(tmp = os.tmpdir()): PrivateDir {
  const dir = fs.mkdtempSync(path.join(tmp, `${PREFIX}${process.pid}-`));
  // mkdtemp creates 0700 already; said again so a umask or a platform cannot widen it.
  fs.chmodSync(dir, 0o700);
  let removed = false;
  const remove = (): void => {
    if (removed) return;
    removed = true;
    process.off('exit', remove);
    fs.rmSync(dir, { recursive: true, force: true });
  };
  // 'exit' runs on process.exit() and after an uncaught error too; only SIGKILL skips it.
  process.on('exit', remove);
  return { path: dir, remove };
}
