/** Checks for flag values shared by the commands; mistakes are UsageErrors (exit 2). */
import { DEFAULT_LIMITS } from '../tunnel/limits.js';
import { parseDuration } from './duration.js';
import { UsageError } from './usage-error.js';

/** A positive Go-style duration, in milliseconds. */
export function durationFlag(flag: string, value: string): number {
  try {
    const ms = parseDuration(value);
    if (ms <= 0) throw new Error('must be positive');
    return ms;
  } catch (err) {
    throw new UsageError(`--${flag}: ${(err as Error).message}`);
  }
}

export function portFlag(flag: string, value: number, allowZero: boolean): number {
  if (!Number.isInteger(value) || value < (allowZero ? 0 : 1) || value > 65535) {
    const got = Number.isNaN(value) ? 'a value that is not a number' : String(value);
    throw new UsageError(`--${flag} must be a port number ${allowZero ? '0' : '1'}-65535, got ${got}`);
  }
  return value;
}

const MAX_CONNECTION_WINDOW_CEILING = 64 * 1024 * 1024;

/** `--max-connection-window`, the same on server and agent: each bounds what it receives. */
export const maxConnectionWindowOption = {
  type: 'number',
  default: DEFAULT_LIMITS.maxWindowBytes,
  describe:
    'Receive window a tunnelled connection may grow to while it moves bulk data, bytes; 1048576 (the window every connection starts with) turns growth off. Lower favours latency next to bulk transfers, higher favours their throughput',
} as const;

export function connectionWindowFlag(flag: string, value: number): number {
  const min = DEFAULT_LIMITS.windowBytes;
  if (!Number.isInteger(value) || value < min || value > MAX_CONNECTION_WINDOW_CEILING) {
    const got = Number.isNaN(value) ? 'a value that is not a number' : String(value);
    throw new UsageError(`--${flag} must be a whole number of bytes from ${min} (the window every connection starts with) to ${MAX_CONNECTION_WINDOW_CEILING}, got ${got}`);
  }
  return value;
}

/** A whole number of at least `min` (counts: connections, dials). */
export function countFlag(flag: string, value: number, min = 1): number {
  if (!Number.isInteger(value) || value < min) {
    const got = Number.isNaN(value) ? 'a value that is not a number' : String(value);
    throw new UsageError(`--${flag} must be a whole number of at least ${min}, got ${got}`);
  }
  return value;
}

/** `--peer-read-timeout`, the same on server and agent (TunnelLimits.peerReadTimeoutMs). */
export const peerReadTimeoutOption = {
  type: 'string',
  default: `${DEFAULT_LIMITS.peerReadTimeoutMs / 1000}s`,
  describe: 'A peer that leaves what this side sent unread (it stopped reading, or floods requests without reading the answers) is not read from either; its stream is closed after this long',
} as const;
