// The one error type of the kernel boundary: which operation failed and the
// errno the kernel (or libc) gave, so callers can branch on the number and
// operators get a sentence that names the cause.

import { getSystemErrorName } from 'node:util';

export class NetlinkError extends Error {
  override name = 'NetlinkError';
  /** Positive errno (e.g. 95 for EOPNOTSUPP); 0 when no errno applies (timeouts, malformed replies). */
  readonly errno: number;
  /** What we were doing, e.g. "RTM_NEWLINK kanal0 kind dummy". */
  readonly operation: string;
  /** Kernel's extended-ACK message, when it sent one. */
  readonly kernelMessage: string | undefined;

  constructor(operation: string, errno: number, message: string, kernelMessage?: string) {
    super(message);
    this.operation = operation;
    this.errno = errno;
    this.kernelMessage = kernelMessage;
  }

  /** Symbolic name such as "EOPNOTSUPP", or "" when errno is 0. */
  get code(): string {
    return errnoName(this.errno);
  }
}

// libuv's names differ from Linux's for a few values; prefer the kernel's.
const LINUX_NAMES: Record<number, string> = { 95: 'EOPNOTSUPP', 11: 'EAGAIN' };

export function errnoName(errno: number): string {
  if (errno <= 0) return '';
  const linux = LINUX_NAMES[errno];
  if (linux) return linux;
  try {
    return getSystemErrorName(-errno);
  } catch {
    return `errno ${errno}`;
  }
}

/** "EOPNOTSUPP, errno 95" — the form used in every message. */
export function describeErrno(errno: number): string {
  return `${errnoName(errno)}, errno ${errno}`;
}
