/**
 * The process at the other end of a Unix socket, as the kernel recorded it
 * at connect time (SO_PEERCRED, unix(7) and socket(7)): who asked, for the
 * audit log. Read through libc: Node has no API for it.
 */
import { getLibc } from './libc.js';

const SOL_SOCKET = 1;
const SO_PEERCRED = 17;

/** struct ucred: pid, uid, gid (int32 each). */
const ucred = Buffer.alloc(12);
const len = Buffer.alloc(4);

/** The peer's pid and uid, or undefined when `fd` is not a connected Unix socket. */
export function peerCredentials(fd: number): { pid: number; uid: number } | undefined {
  if (fd < 0) return undefined;
  len.writeUInt32LE(ucred.length);
  if (getLibc().getsockopt(fd, SOL_SOCKET, SO_PEERCRED, ucred, len) !== 0) return undefined;
  return { pid: ucred.readInt32LE(0), uid: ucred.readUInt32LE(4) };
}
