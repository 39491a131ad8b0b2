import { pino, type Logger, type LevelWithSilent } from 'pino';
import { BOUNDED_LOG_FIELDS } from './log-safety.js';
import { stdoutDestination } from './log-destination.js';

export const LOG_LEVELS: readonly LevelWithSilent[] = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/**
 * JSON lines on stdout; `component` says which part of Kanal wrote the line,
 * `level` is the level's name (`"info"`, not pino's 30: what log tools and
 * people read). Every field is bounded in size (log-safety.ts).
 */
export function createLogger(level: LevelWithSilent, component: string): Logger {
  return pino(
    {
      level,
      base: { component },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
      ...BOUNDED_LOG_FIELDS,
    },
    stdoutDestination(),
  );
}

export type { Logger };
