/**
 * The frontend's Unix socket, created with its final mode and group (#11
 * finding 9). Binding creates the file with 0777 & ~umask; a chmod after
 * listen() left a window in which any local user could connect (0777 under
 * umask 0000), and the umask is process-wide, so changing it around bind()
 * would also change files other code creates meanwhile. Instead the socket
 * is bound in a fresh private directory (0700, nobody else can reach it),
 * given its mode and group there, and then hard-linked into place: link()
 * never replaces an existing file, unlike rename().
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { randomBytes } from 'node:crypto';

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
    if (code === 'ENOENT') throw new UnixSocketError(`--uds-name ${file}: directory ${dir} does not exist; create it first (systemd: RuntimeDirectory=)`);
    throw new UnixSocketError(`--uds-name ${file}: cannot use directory ${dir}: ${(err as Error).message}`);
  }
  if (!dirStat.isDirectory()) throw new UnixSocketError(`--uds-name ${file}: ${dir} is not a directory`);
  let existing: fs.Stats;
  try {
    existing = fs.lstatSync(file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
    throw new UnixSocketError(`--uds-name ${file}: ${(err as Error).message}`);
  }
  if (!existing.isSocket()) {
    throw new UnixSocketError(
      `--uds-name ${file} is a ${kindOf(existing)}, not a socket; Kanal removes only a stale socket there (--delete-existing-uds-file), so move it away or choose another path`,
    );
  }
  if (!opts.deleteExisting) throw new UnixSocketError(`--uds-name ${file} already exists; pass --delete-existing-uds-file to replace a stale socket`);
  if (await servedNow(file)) throw new UnixSocketError(`--uds-name ${file}: another process is serving on this socket; stop it first`);
  try {
    fs.unlinkSync(file);
  } catch (err) {
    throw new UnixSocketError(`--delete-existing-uds-file: cannot remove the stale socket ${file}: ${(err as Error).message}`);
  }
}

function listenAt(server: net.Server, file: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ path: file }, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/**
 * Makes `server` listen on `opts.path` with mode `opts.mode` and group
 * `opts.gid` from the first instant the path exists.
 */
export async function listenUnix(server: net.Server, opts: UnixSocketOptions): Promise<UnixSocketFile> {
  const file = path.resolve(opts.path);
  await clearTheWay({ ...opts, path: file });
  const dir = path.dirname(file);
  // Short names: the private path must fit in sun_path too.
  const privateDir = path.join(dir, `.k${randomBytes(4).toString('hex')}`);
  const staged = path.join(privateDir, 's');
  if (Buffer.byteLength(staged) > MAX_SOCKET_PATH) {
    throw new UnixSocketError(
      `--uds-name ${file}: the directory's path is too long to create the socket safely (Kanal binds at ${staged} first, and socket paths are limited to ${MAX_SOCKET_PATH} bytes)`,
    );
  }
  try {
    fs.mkdirSync(privateDir, { mode: 0o700 });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EACCES' || code === 'EPERM' || code === 'EROFS') {
      throw new UnixSocketError(`--uds-name ${file}: no permission to create files in ${dir} (${code})`);
    }
    throw new UnixSocketError(`--uds-name ${file}: cannot create a file in ${dir}: ${(err as Error).message}`);
  }
  try {
    await listenAt(server, staged);
    fs.chmodSync(staged, opts.mode ?? DEFAULT_UDS_MODE);
    if (opts.gid !== undefined) {
      try {
        fs.chownSync(staged, -1, opts.gid);
      } catch (err) {
        throw new UnixSocketError(`--uds-group: cannot give ${file} group ${opts.gid}: ${(err as Error).message} (the server must be root or a member of that group)`);
      }
    }
    try {
      fs.linkSync(staged, file);
    } catch (err) {
      throw new UnixSocketError(`--uds-name ${file}: cannot put the socket in place: ${(err as Error).message}`);
    }
  } catch (err) {
    server.close();
    throw err;
  } finally {
    fs.rmSync(privateDir, { recursive: true, force: true });
  }
  const ours = fs.lstatSync(file);
  return {
    path: file,
    release(): void {
      // Only the file we made: a newer server may have replaced it meanwhile.
      try {
        const now = fs.lstatSync(file);
        if (now.ino === ours.ino && now.dev === ours.dev) fs.unlinkSync(file);
      } catch {
        // already gone
      }
    },
  };
}
