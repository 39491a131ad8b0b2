/**
 * Runs a started component until SIGTERM/SIGINT. The first signal starts a
 * graceful stop; a second one exits at once. Logs are flushed before exit,
 * for a bounded time only: a stdout nobody reads never keeps the process
 * alive.
 */
import type { Logger } from 'pino';
import { flushLogs } from '../common/log-destination.js';

/** Longest wait for the last log lines to be written before the process exits. */
export const EXIT_LOG_FLUSH_MS = 1000;

/** Flushes the logs (bounded), then exits with `code`. */
export function exitAfterLogs(code: number): void {
  void flushLogs(EXIT_LOG_FLUSH_MS).finally(() => process.exit(code));
}

export function runUntilSignalled(log: Logger, stop: () => Promise<void>): void {
  let stopping = false;
  const onSignal = (signal: NodeJS.Signals): void => {
    if (stopping) {
      log.warn({ signal }, 'second signal: exiting now');
      process.exit(1);
    }
    stopping = true;
    log.info({ signal }, 'shutting down');
    stop().then(
      () => exitAfterLogs(0),
      (err: Error) => {
        log.error({ err: err.message }, 'error during shutdown');
        exitAfterLogs(1);
      },
    );
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
