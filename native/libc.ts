/**
 * The libc calls Kanal makes through koffi (netlink and sd_notify sockets),
 * loaded once, on first use, so importing a module never fails on its own.
 */
import koffi, { type LibraryHandle } from 'koffi';

/** Linux values shared by the callers (x86_64 and arm64 agree on these). */
export const SOCK_CLOEXEC = 0o2000000;
export const SOL_SOCKET = 1;
export const EINTR = 4;
export const EAGAIN = 11;

export interface Libc {
  socket(domain: number, type: number, protocol: number): number;
  bind(fd: number, addr: Buffer, addrlen: number): number;
  setsockopt(fd: number, level: number, name: number, value: Buffer, len: number): number;
  getsockopt(fd: number, level: number, name: number, value: Buffer, len: Buffer): number;
  sendto(fd: number, buf: Buffer, len: number, flags: number, addr: Buffer, addrlen: number): number;
  recv(fd: number, buf: Buffer, len: number, flags: number): number;
  close(fd: number): number;
}

let libc: Libc | undefined;

export function getLibc(): Libc {
  if (libc) return libc;
  let lib: LibraryHandle;
  try {
    lib = koffi.load('libc.so.6');
  } catch {
    // musl and other libcs: the symbols are already in the node process.
    lib = koffi.load(null);
  }
  libc = {
    socket: lib.func('int socket(int, int, int)') as Libc['socket'],
    bind: lib.func('int bind(int, const void *, uint32_t)') as Libc['bind'],
    setsockopt: lib.func('int setsockopt(int, int, int, const void *, uint32_t)') as Libc['setsockopt'],
    getsockopt: lib.func('int getsockopt(int, int, int, void *, void *)') as Libc['getsockopt'],
    sendto: lib.func('intptr_t sendto(int, const void *, size_t, int, const void *, uint32_t)') as Libc['sendto'],
    recv: lib.func('intptr_t recv(int, void *, size_t, int)') as Libc['recv'],
    close: lib.func('int close(int)') as Libc['close'],
  };
  return libc;
}
