/**
 * Files a process writes are its own (docs/trust-model.md): what it appends
 * to was made by this user and only this user can write it, and where it
 * creates files no other user can swap a name under it. The checks here are
 * on stat results, so a caller makes them on the descriptor it opened
 * (fstat), not on a path someone may change in between.
 *
 * A directory another user can write is refused unless it is sticky (as
 * /tmp is): there, other users may add names but cannot rename, replace or
 * delete ours (the sticky bit, inode(7)), so a name we create with O_EXCL
 * stays ours; without it they could swap any file we later open or rotate.
 * A symbolic link on the way is followed only when it is this user's or
 * root's: one another user planted is refused (as Linux's
 * fs.protected_symlinks refuses them in sticky directories).
 */
import fs from 'node:fs';
import path from 'node:path';

/** This process's effective user (root on a platform without one). */
export function effectiveUid(): number {
  return process.geteuid?.() ?? 0;
}

/** The sticky bit (inode(7): S_ISVTX), which Node's fs.constants leaves out. */
const STICKY = 0o1000;
/** Permission bits that let someone other than the owner write. */
const WRITABLE_BY_OTHERS = 0o022;

function ownerText(uid: number): string {
  return uid === 0 ? 'root' : `uid ${uid}`;
}

/**
 * Why an existing file or FIFO (its fstat or lstat) is not ours to append
 * to, or undefined when it is: owned by this user, writable by nobody else,
 * and (a regular file) with no other name, so it is not a hard link to a
 * file kept elsewhere.
 */
export function notOwnFileProblem(stat: fs.Stats, uid = effectiveUid()): string | undefined {
  if (stat.isSymbolicLink()) return 'is a symbolic link (Kanal does not follow one where it writes; name the file itself)';
  if (stat.uid !== uid)
    return `is owned by ${ownerText(stat.uid)}, not by this process's user (${ownerText(uid)}); another user could read or forge its lines`;
  if ((stat.mode & WRITABLE_BY_OTHERS) !== 0)
    return `is writable by its group or by others (mode ${(stat.mode & 0o777).toString(8).padStart(4, '0')}); allow only its owner to write (chmod go-w)`;
  if (stat.isFile() && stat.nlink > 1)
    return `has ${stat.nlink} names (a hard link to a file elsewhere); remove the extra links or name another file`;
  return undefined;
}

/** Whether a directory (its stat) lets users other than its owner add, rename or delete names in it that are not theirs. */
function othersMayReplace(stat: fs.Stats): boolean {
  return (stat.mode & 0o002) !== 0 && (stat.mode & STICKY) === 0;
}

function trustedOwner(uid: number, self: number): boolean {
  return uid === self || uid === 0;
}

/**
 * Why files created in `dir` could be swapped by another user, or undefined
 * when they cannot: every symbolic link on the path to it is this user's or
 * root's, and every directory from it up to / is this user's or root's and
 * lets no one else replace names in it (writable by others without the
 * sticky bit). A directory its group may write is accepted (/var/log is
 * root:syslog 0775 on Debian): its group is trusted as its owner chose. Throws what lstat throws
 * (ENOENT for a missing directory).
 */
export function unsafeDirectoryProblem(dir: string, uid = effectiveUid()): string | undefined {
  // The path as given: a symbolic link another user planted on it is refused.
  const given = path.resolve(dir);
  for (let d = given; ; d = path.dirname(d)) {
    const st = fs.lstatSync(d);
    if (st.isSymbolicLink() && !trustedOwner(st.uid, uid))
      return `${d} is a symbolic link owned by ${ownerText(st.uid)}: another user chose where it points`;
    if (d === path.dirname(d)) break;
  }
  // The directories it really is, up to /: each one's owner could rename what is in it.
  const real = fs.realpathSync(given);
  for (let d = real; ; d = path.dirname(d)) {
    const st = fs.statSync(d);
    if (!trustedOwner(st.uid, uid))
      return `${d} is owned by ${ownerText(st.uid)}, neither this process's user (${ownerText(uid)}) nor root: that user could replace a file Kanal writes there`;
    if (othersMayReplace(st))
      return `${d} is writable by every user without the sticky bit (mode ${(st.mode & 0o7777).toString(8).padStart(4, '0')}): another user could replace a file Kanal writes there (chmod o-w or +t, or choose another directory)`;
    if (d === path.dirname(d)) break;
  }
  return undefined;
}
