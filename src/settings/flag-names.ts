/**
 * Typed handles on a setting's name: a message, a refusal or a check names
 * its setting through these, checked against the table's keys, so a renamed
 * or removed setting fails to compile instead of leaving a stale free string
 * (test/settings/flag-spellings.test.ts counts the free ones).
 */
import type { SettingTable } from './setting.js';

/** `--name`, as a command line spells the setting. */
export function flagOf<T extends SettingTable, K extends keyof T & string>(_table: T, name: K): `--${K}` {
  return `--${name}`;
}

/** `name`, as a settings file (or a credential check's `flag`) spells it. */
export function keyOf<T extends SettingTable, K extends keyof T & string>(_table: T, name: K): K {
  return name;
}

/** Several settings as a message lists them: `--a, --b`. */
export function flagsOf<T extends SettingTable, K extends keyof T & string>(table: T, ...names: K[]): string {
  return names.map((n) => flagOf(table, n)).join(', ');
}

/** Every setting of `table` as the command line spells it: `FLAG['uds-name']` is '--uds-name', typed by the table's keys. */
export function flagNames<T extends SettingTable>(table: T): { readonly [K in keyof T & string]: `--${K}` } {
  const out: Record<string, string> = {};
  for (const name of Object.keys(table)) out[name] = `--${name}`;
  // One entry per key of the table, each `--` and its key.
  return Object.freeze(out) as { readonly [K in keyof T & string]: `--${K}` };
}
