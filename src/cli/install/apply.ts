/**
 * Brings a root directory in line with a plan, idempotently: a file whose
 * bytes and mode already match is not touched (its mtime stays), everything
 * else is written atomically (temporary file + rename). Managed paths absent
 * from the plan are removed, so a re-install with other flags leaves nothing
 * stale behind.
 */
import fs from 'node:fs';
import path from 'node:path';
import { DIR_MODES, MANAGED_DIRS, MANAGED_PATHS, type PlannedEntry } from './node-plan.js';

export type ChangeKind = 'created' | 'updated' | 'unchanged' | 'removed';

export interface Change {
  /** Path as it will be on the node (without the --root prefix). */
  path: string;
  kind: ChangeKind;
  /** The file a copy comes from (the running kanal executable). */
  source?: string;
}

/** `path` (absolute, as on the node) inside `root`. */
export function underRoot(root: string, nodePath: string): string {
  return path.join(root, nodePath);
}

function lstat(file: string): fs.Stats | undefined {
  try {
    return fs.lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
}

function ensureDir(root: string, nodeDir: string, dryRun: boolean): void {
  const missing: string[] = [];
  for (let d = nodeDir; d !== path.dirname(d); d = path.dirname(d)) {
    if (lstat(underRoot(root, d))) break;
    missing.unshift(d);
  }
  if (dryRun) return;
  for (const d of missing) fs.mkdirSync(underRoot(root, d), { mode: DIR_MODES[d] ?? 0o755 });
}

/**
 * The temporary file beside `file`, created new (O_EXCL: never a link or a
 * file someone put there, docs/trust-model.md); a leftover of a run that
 * died at the same pid is removed first (rm removes a link, not its target).
 */
function createTemporary(file: string): { tmp: string; fd: number } {
  const tmp = `${file}.kanal-tmp-${process.pid}`;
  fs.rmSync(tmp, { force: true });
  return { tmp, fd: fs.openSync(tmp, 'wx', 0o600) };
}

function writeAtomically(file: string, content: Buffer, mode: number): void {
  const { tmp, fd } = createTemporary(file);
  try {
    try {
      fs.writeFileSync(fd, content);
      fs.fchmodSync(fd, mode); // on the descriptor: the umask may have narrowed it, and the name may not be ours by now
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
}

/** Same bytes, read in pieces: the executable is over 100 MiB. */
function sameBytes(a: string, b: string): boolean {
  const fa = fs.openSync(a, 'r');
  const fb = fs.openSync(b, 'r');
  try {
    const ba = Buffer.alloc(1 << 20);
    const bb = Buffer.alloc(1 << 20);
    for (;;) {
      const na = fs.readSync(fa, ba);
      const nb = fs.readSync(fb, bb);
      if (na !== nb || !ba.subarray(0, na).equals(bb.subarray(0, nb))) return false;
      if (na === 0) return true;
    }
  } finally {
    fs.closeSync(fa);
    fs.closeSync(fb);
  }
}

/**
 * The program: a copy written beside the target, made root's when we are root
 * (a unit running a file others can replace runs their code), flushed, then
 * renamed over it, so a node never sees half an executable (rename(2)).
 */
function copyAtomically(source: string, file: string, mode: number): void {
  const { tmp, fd } = createTemporary(file);
  try {
    try {
      const input = fs.openSync(source, 'r');
      try {
        const buffer = Buffer.alloc(1 << 20);
        for (let n = fs.readSync(input, buffer); n > 0; n = fs.readSync(input, buffer)) fs.writeSync(fd, buffer, 0, n);
      } finally {
        fs.closeSync(input);
      }
      fs.fchmodSync(fd, mode);
      if (process.getuid?.() === 0) fs.fchownSync(fd, 0, 0);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
  } catch (err) {
    fs.rmSync(tmp, { force: true });
    throw err;
  }
}

function applyCopy(root: string, entry: Extract<PlannedEntry, { kind: 'copy' }>, dryRun: boolean): ChangeKind {
  const file = underRoot(root, entry.path);
  const st = lstat(file);
  if (st && !st.isFile() && !st.isSymbolicLink()) throw new Error(`${entry.path} exists and is not a file; remove it first`);
  if (st?.isFile()) {
    const src = fs.statSync(entry.source);
    // Running from there already (the same inode), or the same program with the unit's mode.
    if (st.dev === src.dev && st.ino === src.ino) return 'unchanged';
    if ((st.mode & 0o7777) === entry.mode && st.size === src.size && sameBytes(file, entry.source)) return 'unchanged';
  }
  if (!dryRun) {
    ensureDir(root, path.dirname(entry.path), false);
    copyAtomically(entry.source, file, entry.mode); // rename(2) replaces an npm install's symbolic link too
  }
  return st ? 'updated' : 'created';
}

function applyEntry(root: string, entry: PlannedEntry, dryRun: boolean): ChangeKind {
  if (entry.kind === 'copy') return applyCopy(root, entry, dryRun);
  const file = underRoot(root, entry.path);
  const st = lstat(file);
  if (entry.kind === 'symlink') {
    if (st?.isSymbolicLink() && fs.readlinkSync(file) === entry.target) return 'unchanged';
    if (!dryRun) {
      ensureDir(root, path.dirname(entry.path), false);
      if (st) fs.rmSync(file, { force: true });
      fs.symlinkSync(entry.target, file);
    }
    return st ? 'updated' : 'created';
  }
  if (st?.isFile() && (st.mode & 0o7777) === entry.mode && fs.readFileSync(file).equals(entry.content)) return 'unchanged';
  if (st && !st.isFile() && !st.isSymbolicLink()) throw new Error(`${entry.path} exists and is not a file; remove it first`);
  if (!dryRun) {
    ensureDir(root, path.dirname(entry.path), false);
    if (st?.isSymbolicLink()) fs.rmSync(file);
    writeAtomically(file, entry.content, entry.mode);
  }
  return st ? 'updated' : 'created';
}

function removeEntry(root: string, nodePath: string, dryRun: boolean): boolean {
  const file = underRoot(root, nodePath);
  const st = lstat(file);
  if (!st) return false;
  if (st.isDirectory()) throw new Error(`${nodePath} is a directory; kanal install-node only manages a file there`);
  if (!dryRun) fs.rmSync(file);
  return true;
}

export function applyPlan(root: string, plan: readonly PlannedEntry[], dryRun = false): Change[] {
  const changes: Change[] = plan.map((entry) => ({
    path: entry.path,
    kind: applyEntry(root, entry, dryRun),
    ...(entry.kind === 'copy' ? { source: entry.source } : {}),
  }));
  const planned = new Set(plan.map((e) => e.path));
  for (const stale of MANAGED_PATHS.filter((p) => !planned.has(p))) {
    if (removeEntry(root, stale, dryRun)) changes.push({ path: stale, kind: 'removed' });
  }
  return changes;
}

/** Removes every managed path, then the managed directories that are left empty. */
export function uninstall(root: string, dryRun = false): Change[] {
  const changes: Change[] = [];
  for (const p of MANAGED_PATHS) if (removeEntry(root, p, dryRun)) changes.push({ path: p, kind: 'removed' });
  if (!dryRun) {
    for (const d of MANAGED_DIRS) {
      const dir = underRoot(root, d);
      try {
        if (fs.readdirSync(dir).length === 0) {
          fs.rmdirSync(dir);
          changes.push({ path: d, kind: 'removed' });
        }
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }
  }
  return changes;
}
