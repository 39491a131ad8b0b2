/** A command's yargs options, --help groups and last-value-wins rule, all derived from its settings table. */
import type { Argv } from 'yargs';
import type { GivenOf, SettingTable } from '../settings/setting.js';
import { helpGroups, yargsOptions } from '../settings/table.js';
import { lastValueWins } from './last-value-wins.js';

export function withSettings<T extends SettingTable>(y: Argv, table: T): Argv<GivenOf<T>> {
  let argv = y.options(yargsOptions(table)).middleware(lastValueWins(table), true);
  for (const [group, names] of helpGroups(table)) argv = argv.group(names, `${group}:`);
  // yargs types argv from literal option objects; the table types each value by its entry instead (GivenOf).
  return argv as unknown as Argv<GivenOf<T>>;
}
