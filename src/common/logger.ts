/** The process's pino logger: its levels and `--logging-format`, every field bounded (log-safety.ts), one line per record on stdout. */
import { pino, type Logger, type LevelWithSilent, type LoggerOptions } from 'pino';
import { BOUNDED_LOG_FIELDS } from './log-safety.js';
import { stdoutDestination } from './log-destination.js';
import { textLine } from './log-text.js';

export const LOG_LEVELS: readonly LevelWithSilent[] = ['trace', 'debug', 'info', 'warn', 'error', 'fatal', 'silent'];

/** `--logging-format`, as the Kubernetes components name it: JSON lines for log pipelines, or text for a terminal (log-text.ts). */
export const LOG_FORMATS = ['json', 'text'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

/** How each format writes one of pino's JSON lines. */
export const RENDER: Record<LogFormat, (line: string) => string> = { json: (line) => line, text: textLine };

/**
 * pino's options for Kanal's lines: `component` says which part of Kanal wrote
 * the line, `level` is the level's name (`"info"`, not pino's 30: what log
 * tools and people read), and every field is bounded in size (log-safety.ts).
 */
export function loggerOptions(level: LevelWithSilent, component: string): LoggerOptions {
  return {
    level,
    base: { component },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label) => ({ level: label }) },
    ...BOUNDED_LOG_FIELDS,
  };
}

/** One line per record on stdout, as `format` says. */
export function createLogger(level: LevelWithSilent, component: string, format: LogFormat = 'json'): Logger {
  // A silent logger writes nothing: it leaves stdout and its format alone.
  return pino(loggerOptions(level, component), level === 'silent' ? { write: () => undefined } : stdoutDestination(RENDER[format]));
}

export type { Logger };
