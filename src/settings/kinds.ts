/**
 * The kinds of setting the tables are made of. Each checks what it is given
 * with the shared checks (checks.ts), so a kind's message is the same on
 * every command that has it.
 */
import { choiceFlag, countFlag, countOrAutoFlag, durationFlag, durationOrOffFlag, portFlag } from './checks.js';
import type { GivenType, Setting } from './setting.js';
import type { HelpGroup } from './groups.js';

/** What every entry says about itself. */
export interface Described {
  describe: string;
  group: HelpGroup;
}

/** A setting of any shape: the kinds below are this with a parser chosen. */
export function setting<G, V>(
  spec: Described & {
    type: GivenType;
    default?: G;
    array?: boolean;
    choices?: readonly string[];
    hidden?: boolean;
    parse: (given: G, flag: string) => V;
  },
): Setting<G, V> {
  return spec;
}

/** Free text with a default; `check` may refuse it. */
export function text(o: Described & { default: string; check?: (value: string, flag: string) => void }): Setting<string, string> {
  const { check, ...rest } = o;
  return setting({
    ...rest,
    type: 'string',
    parse: (v: string, flag) => {
      check?.(v, flag);
      return v;
    },
  });
}

/** Free text that may be absent. */
export function optionalText(
  o: Described & { check?: (value: string, flag: string) => void },
): Setting<string | undefined, string | undefined> {
  const { check, ...rest } = o;
  return setting({
    ...rest,
    type: 'string',
    parse: (v: string | undefined, flag) => {
      if (v !== undefined) check?.(v, flag);
      return v;
    },
  });
}

export function toggle(o: Described & { default?: boolean }): Setting<boolean, boolean> {
  return setting({ ...o, type: 'boolean', default: o.default ?? false, parse: (v: boolean) => v });
}

/** A TCP port; with allowZero, 0 turns the listener off (or asks the kernel for one, where the flag says so). */
export function port(o: Described & { default: number; allowZero: boolean }): Setting<number, number> {
  const { allowZero, ...rest } = o;
  return setting({ ...rest, type: 'number', parse: (v: number, flag) => portFlag(flag, v, allowZero) });
}

/** A whole number of at least `min` (default 1). */
export function count(o: Described & { default: number; min?: number }): Setting<number, number> {
  const { min, ...rest } = o;
  return setting({ ...rest, type: 'number', parse: (v: number, flag) => countFlag(flag, v, min) });
}

/**
 * A count that may be `auto` (what the machine gives, the caller decides
 * how much that is), parsed as 0, which means the same: `--workers auto`
 * and `--workers 0` are one value.
 */
export function countOrAuto(o: Described & { default: number | 'auto'; min?: number }): Setting<string, number> {
  const { min, default: given, ...rest } = o;
  return setting({
    ...rest,
    type: 'string',
    default: String(given),
    parse: (v: string, flag) => countOrAutoFlag(flag, String(v), min),
  });
}

/** A positive Go-style duration ("10s", "1m30s"), in milliseconds. */
export function duration(o: Described & { default: string }): Setting<string, number> {
  return setting({ ...o, type: 'string', parse: (v: string, flag) => durationFlag(flag, v) });
}

/** A duration where 0 turns something off (durationOrOffFlag). */
export function durationOrOff(o: Described & { default: string }): Setting<string, number> {
  return setting({ ...o, type: 'string', parse: (v: string, flag) => durationOrOffFlag(flag, v) });
}

/** One of `choices` (yargs lists them in --help and refuses others). */
export function choice<T extends string>(o: Described & { choices: readonly T[]; default: T }): Setting<string, T> {
  const { choices } = o;
  return setting({ ...o, type: 'string', parse: (v: string, flag) => choiceFlag(flag, v, choices) });
}

/** A repeatable flag, each value checked by `item` (which may throw a UsageError naming the flag). */
export function listOf<T>(o: Described & { item: (value: string, flag: string) => T }): Setting<readonly string[], T[]> {
  const { item, ...rest } = o;
  return setting({
    ...rest,
    type: 'string',
    array: true,
    default: [] as readonly string[],
    parse: (v: readonly string[], flag) => v.map((x) => item(x, flag)),
  });
}

/** A repeatable flag taken as given. */
export function list(o: Described): Setting<readonly string[], string[]> {
  return listOf({ ...o, item: (v) => v });
}
