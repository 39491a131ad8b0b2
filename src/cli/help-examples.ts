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

export function withExamples<T>(y: Argv<T>, examples: readonly HelpExample[]): Argv<T> {
  return y.epilogue(examplesText(examples));
}
