/** `--log-level` and klog's `--v`, the same on server and agent. */
import type { LevelWithSilent } from 'pino';
import { LOG_LEVELS } from './logger.js';
import { choiceFlag } from './flag-values.js';
import { UsageError } from './usage-error.js';

/** The log level: --log-level when given, else klog's --v mapped (#14), else info. */
export function logLevelFrom(logLevel: string | undefined, v: number | undefined): LevelWithSilent {
  if (logLevel !== undefined) return choiceFlag('log-level', logLevel, LOG_LEVELS);
  if (v === undefined) return 'info';
  if (!Number.isInteger(v) || v < 0) throw new UsageError(`--v must be a whole number of at least 0, got ${Number.isNaN(v) ? 'a value that is not a number' : v}`);
  return v >= 5 ? 'trace' : v === 4 ? 'debug' : 'info';
}
