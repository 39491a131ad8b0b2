/**
 * yargs lays out the running command's whole help text at every start, in
 * case a later failure shows it (its command.js calls cacheHelpMessage after
 * the command's handler); Kanal's .fail() prints a message of its own and
 * never that text. Without --help the layout is skipped: string-width's
 * Intl.Segmenter and the cell-by-cell measuring cost ≈ 10-15 ms of CPU and
 * 1.6 MiB at every start (bench/RESULTS.md, "a start close to a Go binary").
 * It is reached through yargs' internal methods; where they are not, the
 * help is laid out as before (test/cli/help-layout checks they are there).
 */
import type { Argv } from 'yargs';

/** The part of yargs' internals touched here (yargs' build/lib/usage.js). */
export interface UsageInternals {
  getInternalMethods?: () => {
    getUsageInstance?: () => { cacheHelpMessage?: () => void; hasCachedHelpMessage?: () => boolean };
  };
}

/** Makes `y` skip laying out the help text it would keep for a failure. */
export function skipHelpLayout(y: Argv): void {
  const usage = (y as unknown as UsageInternals).getInternalMethods?.().getUsageInstance?.();
  if (usage && typeof usage.cacheHelpMessage === 'function') usage.cacheHelpMessage = () => undefined;
}
