/**
 * yargs turns a repeated scalar flag into an array, which then slips past
 * `choices`. Go's flag package (and so upstream's CLI) keeps the last value;
 * so do we, for every flag not declared as an array.
 */
import type { Arguments } from 'yargs';

export function lastValueWins(flags: Readonly<Record<string, object>>): (argv: Arguments) => void {
  const scalars = Object.entries(flags)
    .filter(([, spec]) => !('array' in spec && spec.array === true))
    .map(([name]) => name);
  return (argv) => {
    for (const name of scalars) {
      const value: unknown = argv[name];
      if (Array.isArray(value)) argv[name] = value[value.length - 1];
    }
  };
}
