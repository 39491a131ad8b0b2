/**
 * The frontend's Unix socket, never reachable with more than its final mode
 * and group. bind() creates the file with 0777 & ~umask; a
 * chmod after listen() left a window in which any local user could connect
 * (0777 under umask 0000). So bind() runs under a umask that leaves only the
 * owner's bits of the final mode, the group is set, and then the mode.
 * The umask is process-wide: it is changed only around listen(), whose
 * bind() is synchronous (net.js: setupListenHandle), so no other JavaScript
 * runs meanwhile, and it is only ever narrowed, so a file another thread
 * creates in that instant is never more exposed than it would have been.
 * (Binding elsewhere and renaming would avoid the umask, but the kernel keeps
 * the bound path: ss and lsof would name a path that no longer exists.)
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { errorMessage } from '../../common/error-message.js';
import { unsafeDirectoryProblem } from '../../common/owned-files.js';

// The settings these messages name, spelt once: this room sits below the server's table (src/server/config/settings.ts).
const UDS_NAME = '--uds-name';
const DELETE_EXISTING_UDS_FILE = '--delete-existing-uds-file';

export interface UnixSocketOptions {
  path: string;
  /** Replace a stale socket left at `path` (never any other kind of file). */
  deleteExisting: boolean;
  /** Permission bits of the socket (connecting needs write permission); default DEFAULT_UDS_MODE. */
  mode?: number;
  /** Group to give the socket; absent keeps the process's. */
  gid?: number;
}

/** A bound socket file; release() removes it if it is still ours. */
export interface UnixSocketFile {
  readonly path: string;
  release(): void;
}

/** Owner and group may connect: the KAS runs as another user in some setups. */
export const DEFAULT_UDS_MODE = 0o660;

/** Longest path bind() accepts on Linux (sun_path is 108 bytes with its NUL). */
const MAX_SOCKET_PATH = 107;
const LIVE_CHECK_MS = 1000;

export class UnixSocketError extends Error {
  override name = 'UnixSocketError';
}

function kindOf(st: fs.Stats): string {
  if (st.isFile()) return 'regular file';
  if (st.isDirectory()) return 'directory';
  if (st.isSymbolicLink()) return 'symbolic link';
  if (st.isFIFO()) return 'named pipe';
  return 'special file';
}

/** Whether a server accepts connections on the socket at `file` now. */
function servedNow(file: string): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = net.connect({ path: file });
    const done = (live: boolean): void => {
      clearTimeout(timer);
      s.destroy();
      resolve(live);
    };
    // A server that does not even accept within a second is not serving anyone.
    const timer = setTimeout(() => done(false), LIVE_CHECK_MS);
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}

/** Checks the directory and whatever is at `opts.path` now, removing a stale socket if allowed. */
async function clearTheWay(opts: UnixSocketOptions): Promise<void> {
  const file = opts.path;
  const dir = path.dirname(file);
  let dirStat: fs.Stats;
  try {
    dirStat = fs.statSync(dir);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT')
      throw new UnixSocketError(`${UDS_NAME} ${file}: directory ${dir} does not exist; create it first (systemd: RuntimeDirectory=)`);
    throw new UnixSocketError(`${UDS_NAME} ${file}: cannot use directory ${dir}: ${errorMessage(err)}`);
  }
  if (!dirStat.isDirectory()) throw new UnixSocketError(`${UDS_NAME} ${file}: ${dir} is not a directory`);
  // The mode and group are set by path after bind(): no other user may swap the socket for a link in between (owned-files.ts).
  const unsafe = unsafeDirectoryProblem(dir);
  if (unsafe) throw new UnixSocketError(`${UDS_NAME} ${file}: ${unsafe}`);
  let existing: fs.Stats;
  try {
    existing = fs.lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw new UnixSocketError(`${UDS_NAME} ${file}: ${errorMessage(err)}`);
  }
  if (!existing.isSocket()) {
    throw new UnixSocketError(
      `${UDS_NAME} ${file} is a ${kindOf(existing)}, not a socket; Kanal removes only a stale socket there (${DELETE_EXISTING_UDS_FILE}), so move it away or choose another path`,
    );
  }
  if (!opts.deleteExisting)
    throw new UnixSocketError(
      `${UDS_NAME} ${file} already exists; pass ${DELETE_EXISTING_UDS_FILE} (the default) to replace a stale socket`,
    );
  if (await servedNow(file)) throw new UnixSocketError(`${UDS_NAME} ${file}: another process is serving on this socket; stop it first`);
  try {
    fs.unlinkSync(file);
  } catch (err) {
    throw new UnixSocketError(`${DELETE_EXISTING_UDS_FILE}: cannot remove the stale socket ${file}: ${errorMessage(err)}`);
  }
}

/** listen() on `file` with `mask` added to the umask around its (synchronous) bind(). */
function listenAt(server: net.Server, file: string, mask: number): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    // process.umask() without an argument is deprecated (DEP0139): read it by setting it.
    const previous = process.umask(mask);
    process.umask(previous | mask);
    try {
      server.listen({ path: file }, () => {
        server.off('error', reject);
        resolve();
      });
    } finally {
      process.umask(previous);
    }
  });
}

/**
 * Makes `server` listen on `opts.path`; the socket never has more than
 * mode `opts.mode` and group `opts.gid`.
 */
export async function listenUnix(server: net.Server, opts: UnixSocketOptions): Promise<UnixSocketFile> {
  const file = path.resolve(opts.path);
  if (Buffer.byteLength(file) > MAX_SOCKET_PATH) {
    throw new UnixSocketError(
      `${UDS_NAME} ${file}: the path is ${Buffer.byteLength(file)} bytes long; Unix socket paths are limited to ${MAX_SOCKET_PATH}`,
    );
  }
  await clearTheWay({ ...opts, path: file });
  const mode = opts.mode ?? DEFAULT_UDS_MODE;
  try {
    // Only the owner's bits of the final mode until the group is right.
    await listenAt(server, file, 0o777 & ~(mode & 0o600));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
      throw new UnixSocketError(`${UDS_NAME} ${file}: no permission to create files in ${path.dirname(file)} (${code})`);
    }
    throw new UnixSocketError(`${UDS_NAME} ${file}: cannot listen: ${errorMessage(err)}`);
  }
  try {
    if (opts.gid !== undefined) {
      try {
        fs.chownSync(file, -1, opts.gid);
      } catch (err) {
        throw new UnixSocketError(
          `--uds-group: cannot give ${file} group ${opts.gid}: ${errorMessage(err)} (the server must be root or a member of that group)`,
        );
      }
    }
    fs.chmodSync(file, mode);
  } catch (err) {
    server.close();
    throw err;
  }
  const ours = fs.lstatSync(file);
  return {
    path: file,
    release(): void {
      // Only the file we made (Node removes it itself when the server closes): a newer server may have replaced it meanwhile.
      try {
        const now = fs.lstatSync(file);
        if (now.ino === ours.ino && now.dev === ours.dev) fs.unlinkSync(file);
      } catch {
        // already gone
      }
    },
  };
}
