// sd_notify(3) without libsystemd: one AF_UNIX datagram to $NOTIFY_SOCKET.
//
// Why koffi: Node has no AF_UNIX datagram sockets (dgram is UDP only), and a
// Type=notify unit needs exactly one datagram "READY=1" from the main process.
// Why non-blocking: a notification must never stall the event loop; systemd
// drains its socket promptly, so EAGAIN is reported instead of waited for.
//
// Addresses: "/path" (file system socket) or "@name" (Linux abstract
// namespace: the '@' becomes a leading NUL and the address has no trailing
// NUL). Other forms (e.g. "vsock:" from systemd >= 254) are reported as
// unsupported. Credentials (SCM_CREDENTIALS) are attached by the kernel, which
// is what NotifyAccess=main checks.

import koffi from 'koffi';
import { EINTR, SOCK_CLOEXEC, getLibc, type Libc } from './libc.js';
import { errnoName } from './netlink-error.js';

const AF_UNIX = 1;
const SOCK_DGRAM = 2;
const MSG_DONTWAIT = 0x40;
const MSG_NOSIGNAL = 0x4000;
const SUN_PATH_BYTES = 108; // sizeof(sockaddr_un.sun_path) on Linux

export interface SdNotifyResult {
  /** True when the datagram was handed to the kernel. */
  sent: boolean;
  /** Why nothing was sent: no NOTIFY_SOCKET, bad address, or the failing call and errno. */
  reason?: string;
}

/**
 * struct sockaddr_un for a NOTIFY_SOCKET value, and the address length to pass
 * to sendto. Throws on addresses that cannot be used.
 */
export function encodeNotifyAddress(socketPath: string): { addr: Buffer; length: number } {
  let path: Buffer;
  let length: number;
  if (socketPath.startsWith('@')) {
    path = Buffer.concat([Buffer.from([0]), Buffer.from(socketPath.slice(1), 'utf8')]);
    length = 2 + path.length; // abstract: the length delimits the name, no trailing NUL
  } else if (socketPath.startsWith('/')) {
    path = Buffer.concat([Buffer.from(socketPath, 'utf8'), Buffer.from([0])]);
    length = 2 + path.length;
  } else {
    throw new Error(`NOTIFY_SOCKET ${JSON.stringify(socketPath)}: only absolute paths and @abstract names are supported`);
  }
  if (path.length > SUN_PATH_BYTES || path.length < 2) {
    throw new Error(`NOTIFY_SOCKET ${JSON.stringify(socketPath)}: address must be 1-${SUN_PATH_BYTES - 1} bytes long`);
  }
  const addr = Buffer.alloc(2 + SUN_PATH_BYTES);
  new Uint16Array(addr.buffer, addr.byteOffset, 1)[0] = AF_UNIX; // sa_family_t, host byte order
  path.copy(addr, 2);
  return { addr, length };
}

/**
 * Sends `state` (newline-separated KEY=VALUE assignments, e.g. "READY=1") to
 * `socketPath` (default: $NOTIFY_SOCKET). Never throws; a missing
 * NOTIFY_SOCKET means "not started by systemd" and is not an error.
 */
export function sdNotify(state: string, socketPath: string | undefined = process.env.NOTIFY_SOCKET): SdNotifyResult {
  if (!socketPath) return { sent: false, reason: 'NOTIFY_SOCKET is not set' };
  let address: { addr: Buffer; length: number };
  try {
    address = encodeNotifyAddress(socketPath);
  } catch (err) {
    return { sent: false, reason: err instanceof Error ? err.message : String(err) };
  }
  let c: Libc;
  try {
    c = getLibc();
  } catch (err) {
    return { sent: false, reason: `cannot load libc: ${err instanceof Error ? err.message : String(err)}` };
  }
  const fd = c.socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return { sent: false, reason: `socket(AF_UNIX, SOCK_DGRAM) failed (${errnoName(koffi.errno())})` };
  try {
    const msg = Buffer.from(state, 'utf8');
    for (;;) {
      const n = Number(c.sendto(fd, msg, msg.length, MSG_DONTWAIT | MSG_NOSIGNAL, address.addr, address.length));
      if (n >= 0) return { sent: true };
      const errno = koffi.errno();
      if (errno !== EINTR) return { sent: false, reason: `sendto ${socketPath} failed (${errnoName(errno)})` };
    }
  } finally {
    c.close(fd);
  }
}

/**
 * The watchdog ping interval systemd asks for (half of WatchdogSec), or
 * undefined when no watchdog is configured for this process.
 */
export function watchdogIntervalMs(env: NodeJS.ProcessEnv = process.env, pid: number = process.pid): number | undefined {
  const usec = Number(env.WATCHDOG_USEC ?? '');
  if (!Number.isFinite(usec) || usec <= 0) return undefined;
  if (env.WATCHDOG_PID && Number(env.WATCHDOG_PID) !== pid) return undefined;
  return Math.max(1, Math.floor(usec / 2000));
}

/**
 * Readiness, status and watchdog reporting for a long-running command. Does
 * nothing when the process was not started by systemd (no NOTIFY_SOCKET). Each
 * failure is reported once through `onError` and never thrown.
 */
export class SystemdNotifier {
  private readonly socketPath: string | undefined;
  private watchdog: NodeJS.Timeout | undefined;
  private readyAlready = false;
  private failures = new Set<string>();

  constructor(
    private readonly onError: (reason: string) => void = () => undefined,
    env: NodeJS.ProcessEnv = process.env,
  ) {
    this.socketPath = env.NOTIFY_SOCKET || undefined;
    const interval = watchdogIntervalMs(env);
    if (this.socketPath && interval !== undefined) {
      this.watchdog = setInterval(() => this.send('WATCHDOG=1'), interval);
      this.watchdog.unref();
    }
  }

  /** True when systemd is listening (NOTIFY_SOCKET is set). */
  get active(): boolean {
    return this.socketPath !== undefined;
  }

  get isReady(): boolean {
    return this.readyAlready;
  }

  ready(status?: string): void {
    if (this.readyAlready) return;
    this.readyAlready = true;
    this.send(status ? `READY=1\nSTATUS=${oneLine(status)}` : 'READY=1');
  }

  status(text: string): void {
    this.send(`STATUS=${oneLine(text)}`);
  }

  /** STOPPING=1. Watchdog pings go on while the process drains (they end with it). */
  stopping(status?: string): void {
    this.send(status ? `STOPPING=1\nSTATUS=${oneLine(status)}` : 'STOPPING=1');
  }

  close(): void {
    if (this.watchdog) clearInterval(this.watchdog);
    this.watchdog = undefined;
  }

  private send(state: string): void {
    if (!this.socketPath) return;
    const result = sdNotify(state, this.socketPath);
    if (!result.sent && result.reason && !this.failures.has(result.reason)) {
      this.failures.add(result.reason);
      this.onError(result.reason);
    }
  }
}

function oneLine(text: string): string {
  return text.replace(/[\r\n]+/g, ' ');
}
