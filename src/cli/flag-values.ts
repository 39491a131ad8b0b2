/** Checks for flag values shared by the commands; mistakes are UsageErrors (exit 2). */
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
