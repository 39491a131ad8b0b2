/**
 * The examples at the end of a command's --help, each command line whole:
 * yargs' .example() puts a command in a column of its own and wraps it
 * mid-command. Here each line of a command is written as it is to be typed,
 * continued with a backslash, at most EXAMPLE_WIDTH characters wide (a
 * test checks) so a terminal of 80 columns shows it unwrapped.
 */
import type { Argv } from 'yargs';

export const EXAMPLE_WIDTH = 78;

export interface HelpExample {
  /** What it does, one line. */
  what: string;
  /** The command line in the pieces it is shown in, one per line; `$0` is the program's name. */
  lines: readonly string[];
}

export function examplesText(examples: readonly HelpExample[]): string {
  const one = (e: HelpExample): string => `  ${e.what}:\n    ${e.lines.join(' \\\n      ')}`;
  return `Examples:\n${examples.map(one).join('\n\n')}`;
}

/**
 * `forHelp`: whether --help was asked for. yargs lays out the run command's
 * help text at every start (src/cli/with-settings.ts); the examples are most
 * of it, and string-width measures them cell by cell.
 */
export function withExamples<T>(y: Argv<T>, examples: readonly HelpExample[], forHelp = true): Argv<T> {
  return forHelp ? y.epilogue(examplesText(examples)) : y;
}
