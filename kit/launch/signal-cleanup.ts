/**
 * Ctrl-C and SIGTERM for a program that starts children and temp dirs (the
 * demo): Node's default for these signals ends the process at once, without
 * its 'exit' handlers, so the children would outlive it and its temp dir (with
 * a CA key) would stay. The first signal runs the cleanup, then exits with
 * 128 + the signal's number, as a shell reports it; a second one exits at once
 * and leaves the rest to exit-cleanup.ts.
 */
import os from 'node:os';

export function cleanUpOnSignals(cleanup: () => Promise<void>): void {
  let cleaning = false;
  const onSignal = (signal: NodeJS.Signals): void => {
    const code = 128 + os.constants.signals[signal];
    if (cleaning) process.exit(code);
    cleaning = true;
    cleanup()
      .catch(() => undefined)
      .finally(() => process.exit(code));
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
}
