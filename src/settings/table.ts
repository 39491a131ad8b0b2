/**
 * What is derived from a command's table: yargs' options and --help groups,
 * the parsed values, and the notices for upstream flags Kanal ignores.
 */
import type { Options } from 'yargs';
import { UsageError } from '../common/usage-error.js';
import type { AnySetting, SettingTable, ValuesOf } from './setting.js';
import { groupRank, type HelpGroup } from './groups.js';

/** yargs' option for each setting: the table's type, default, help, choices, visibility. */
export function yargsOptions(table: SettingTable, forHelp = true): Record<string, Options> {
  const options: Record<string, Options> = {};
  for (const [name, s] of Object.entries(table)) {
    options[name] = {
      type: s.type,
      // Without --help nothing shows them: yargs renders a run command's help text all the same (withSettings).
      ...(forHelp ? { describe: s.describe } : {}),
      ...(s.array ? { array: true } : {}),
      ...(s.default !== undefined ? { default: s.default } : {}),
      ...(s.choices ? { choices: [...s.choices] } : {}),
      ...(s.hidden || !forHelp ? { hidden: true } : {}),
    };
  }
  return options;
}

/** The --help groups in the order groups.ts declares them, each with its visible flags in the table's order. */
export function helpGroups(table: SettingTable): Map<HelpGroup, string[]> {
  const groups = new Map<HelpGroup, string[]>();
  const visible = Object.entries(table).filter(([, s]) => !s.hidden);
  for (const [name, s] of visible.sort(([, a], [, b]) => groupRank(a.group) - groupRank(b.group))) {
    const names = groups.get(s.group) ?? [];
    names.push(name);
    groups.set(s.group, names);
  }
  return groups;
}

function isGivenType(s: AnySetting, value: unknown): boolean {
  const one = (v: unknown): boolean => typeof v === s.type;
  return s.array ? Array.isArray(value) && value.every(one) : one(value);
}

/**
 * Every setting of `table` parsed from what the command line gave (yargs'
 * defaults applied), in the table's order: the first mistake is thrown, a
 * UsageError naming its flag.
 */
export function readSettings<T extends SettingTable>(table: T, given: Readonly<Record<string, unknown>>): ValuesOf<T> {
  const values: Record<string, unknown> = {};
  for (const [name, s] of Object.entries(table)) {
    const value = given[name];
    if (value !== undefined && !isGivenType(s, value))
      throw new UsageError(`--${name} takes ${s.array ? 'a list of ' : ''}${s.type} values`);
    values[name] = s.parse(value, name);
  }
  // Each key of the table was parsed by its own entry's parser, so the record has ValuesOf<T>'s shape.
  return values as ValuesOf<T>;
}

/** The notices for the ignored upstream flags given on this command line, one per flag. */
export function upstreamNotices(given: Readonly<Record<string, unknown>>, table: SettingTable): string[] {
  const notices: string[] = [];
  for (const [name, s] of Object.entries(table)) {
    if (s.notice !== undefined && given[name] !== undefined) notices.push(`--${name} ignored: ${s.notice}`);
  }
  return notices;
}

/** What a settings file gave, parsed: the values with the table's defaults applied, and every mistake found. */
export interface FileSettings<T extends SettingTable> {
  values: ValuesOf<T>;
  /** One line per mistake, each naming its setting as the file spells it (without the flag's dashes). */
  mistakes: string[];
}

/** A setting's default parsed, standing in for a mistaken value (undefined where even that is refused, e.g. a required one). */
function fallback(s: AnySetting, name: string): unknown {
  try {
    return s.parse(s.default, name);
  } catch {
    return undefined;
  }
}

/**
 * Every setting of `table` parsed from a settings file's mapping (a YAML
 * object): defaults applied here (yargs does it for a command line), a
 * single value taken for a repeatable setting, and every mistake collected
 * instead of the first thrown. Keys outside the table are the caller's to
 * report. The values of a setting with a mistake are its default.
 */
export function readFileSettings<T extends SettingTable>(table: T, given: Readonly<Record<string, unknown>>): FileSettings<T> {
  const values: Record<string, unknown> = {};
  const mistakes: string[] = [];
  for (const [name, s] of Object.entries(table)) {
    let value = given[name] ?? s.default;
    if (s.array && value !== undefined && !Array.isArray(value)) value = [value];
    const parse = (v: unknown): unknown => s.parse(v, name);
    if (value !== undefined && !isGivenType(s, value)) {
      mistakes.push(`${name} takes ${s.array ? 'a list of ' : 'a '}${s.type}${s.array ? 's' : ''}, got ${JSON.stringify(value)}`);
      values[name] = fallback(s, name);
      continue;
    }
    try {
      values[name] = parse(value);
    } catch (err) {
      if (!(err instanceof UsageError)) throw err;
      // The parsers name their flag (--name); a file names the key.
      mistakes.push(err.message.replaceAll(`--${name}`, name));
      values[name] = fallback(s, name);
    }
  }
  // Each key of the table was parsed by its own entry's parser, so the record has ValuesOf<T>'s shape.
  return { values: values as ValuesOf<T>, mistakes };
}
