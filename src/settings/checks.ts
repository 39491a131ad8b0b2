/** Checks for flag values shared by the commands; a mistake is a UsageError naming the flag (exit 2). */
import { parseDuration } from '../common/duration.js';
import { UsageError } from '../common/usage-error.js';
import { errorMessage } from '../common/error-message.js';
import { MAX_WINDOW_BYTES } from '../wire/window-maximum.js';

/** What a number flag was given, for the message. */
function got(value: number): string {
  return Number.isNaN(value) ? 'a value that is not a number' : String(value);
}

/** A positive Go-style duration, in milliseconds. */
export function durationFlag(flag: string, value: string): number {
  try {
    const ms = parseDuration(value);
    if (ms <= 0) throw new Error('must be positive');
    return ms;
  } catch (err) {
    throw new UsageError(`--${flag}: ${errorMessage(err)}`);
  }
}

/** A duration that may be 0 (off); a bare "0" needs no unit, as in Go's time.ParseDuration. */
export function durationOrOffFlag(flag: string, value: string): number {
  if (value.trim() === '0') return 0;
  try {
    const ms = parseDuration(value);
    if (ms < 0) throw new Error('must not be negative');
    return ms;
  } catch (err) {
    throw new UsageError(`--${flag}: ${errorMessage(err)}`);
  }
}

export function portFlag(flag: string, value: number, allowZero: boolean): number {
  if (!Number.isInteger(value) || value < (allowZero ? 0 : 1) || value > 65535) {
    throw new UsageError(`--${flag} must be a port number ${allowZero ? '0' : '1'}-65535, got ${got(value)}`);
  }
  return value;
}

/** A whole number of at least `min` (counts: connections, dials). */
export function countFlag(flag: string, value: number, min = 1): number {
  if (!Number.isInteger(value) || value < min)
    throw new UsageError(`--${flag} must be a whole number of at least ${min}, got ${got(value)}`);
  return value;
}

/** A count or the word `auto`, which is returned as 0 (countOrAuto in kinds.ts). */
export function countOrAutoFlag(flag: string, value: string, min = 1): number {
  if (value === 'auto') return 0;
  const n = /^\s*\d+\s*$/.test(value) ? Number(value) : NaN;
  if (!Number.isInteger(n) || n < min)
    throw new UsageError(`--${flag} must be auto or a whole number of at least ${min}, got ${JSON.stringify(value)}`);
  return n;
}

const MAX_CONNECTION_WINDOW_CEILING = MAX_WINDOW_BYTES;

/** `--max-connection-window`: from `initial` (the window every connection starts with, DEFAULT_LIMITS.windowBytes) to 64 MiB. */
export function connectionWindowFlag(flag: string, value: number, initial: number): number {
  if (!Number.isInteger(value) || value < initial || value > MAX_CONNECTION_WINDOW_CEILING) {
    throw new UsageError(
      `--${flag} must be a whole number of bytes from ${initial} (the window every connection starts with) to ${MAX_CONNECTION_WINDOW_CEILING}, got ${got(value)}`,
    );
  }
  return value;
}

/** One of `choices`, typed as such; else a UsageError naming the flag and every choice. */
export function choiceFlag<T extends string>(flag: string, value: string, choices: readonly T[]): T {
  const choice = choices.find((c) => c === value);
  if (choice === undefined) throw new UsageError(`--${flag} ${JSON.stringify(value)}: use ${choices.join(', ')}`);
  return choice;
}

/** `parse()`'s value; whatever it throws becomes a UsageError that names the flag first (`--flag: why`, or `--flag why` with `separator` ' '). */
export function namedFlag<T>(flag: string, parse: () => T, separator = ': '): T {
  try {
    return parse();
  } catch (err) {
    throw new UsageError(`--${flag}${separator}${errorMessage(err)}`);
  }
}
