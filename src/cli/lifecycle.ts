/**
 * Runs a started component until SIGTERM/SIGINT. The first signal starts a
 * graceful stop; a second one exits at once.
 */
import type { Logger } from 'pino';

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
      () => process.exit(0),
      (err: Error) => {
        log.error({ err: err.message }, 'error during shutdown');
        process.exit(1);
      },
    );
  };
  process.on('SIGTERM', onSignal);
  process.on('SIGINT', onSignal);
}
