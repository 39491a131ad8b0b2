/** A command's yargs options, --help groups and last-value-wins rule, all derived from its settings table. */
import type { Argv } from 'yargs';
import type { GivenOf, SettingTable } from '../settings/setting.js';
import { helpGroups, yargsOptions } from '../settings/table.js';
import { lastValueWins } from './last-value-wins.js';

/**
 * `forHelp`: whether --help was asked for. yargs renders the run command's
 * whole help text on every start (yargs' command.js, cacheHelpMessage); with
 * every flag hidden and undescribed that costs nothing: ≈ 40 ms of CPU and
 * 6 MiB of a server's start (docs/memory.md, "Node 26").
 */
export function withSettings<T extends SettingTable>(y: Argv, table: T, forHelp = true): Argv<GivenOf<T>> {
  let argv = y.options(yargsOptions(table, forHelp)).middleware(lastValueWins(table), true);
  if (forHelp) for (const [group, names] of helpGroups(table)) argv = argv.group(names, `${group}:`);
  // yargs types argv from literal option objects; the table types each value by its entry instead (GivenOf).
  return argv as unknown as Argv<GivenOf<T>>;
}
