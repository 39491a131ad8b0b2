/** Settings every command has: how it logs, and --dry-run. */
import type { LevelWithSilent } from 'pino';
import { LOG_FORMATS, LOG_LEVELS } from '../common/logger.js';
import { choiceFlag } from './checks.js';
import { choice, optionalText, toggle } from './kinds.js';

export const LOGGING = 'Logging';

export const processSettings = {
  'log-level': {
    ...optionalText({
      describe: 'Log level (logs on stdout; default: from --v, else info)',
      group: LOGGING,
      check: (v, flag) => void choiceFlag(flag, v, LOG_LEVELS),
    }),
    choices: LOG_LEVELS,
  },
  // The Kubernetes components' flag and values (component-base/logs); json stays the default even on a
  // terminal, so what a process writes never depends on whether a container was given a TTY.
  'logging-format': choice({
    choices: LOG_FORMATS,
    default: 'json',
    describe: 'Log format: json (one JSON object a line, for log pipelines) or text (one readable line a record, for a terminal)',
    group: LOGGING,
  }),
  'dry-run': toggle({ describe: 'Validate flags, print the configuration as JSON and exit', group: 'Command' }),
} as const;

/** The log level: --log-level when given, else klog's --v mapped (docs/upstream-flags.md), else info. */
export function logLevelFrom(logLevel: string | undefined, v: number | undefined): LevelWithSilent {
  if (logLevel !== undefined) return choiceFlag('log-level', logLevel, LOG_LEVELS);
  if (v === undefined) return 'info';
  return v >= 5 ? 'trace' : v === 4 ? 'debug' : 'info';
}
