/**
 * A setting: one flag of a command declared once. Its entry gives the flag's
 * name (the key in its table), the type it is given as, its default, its
 * help text and help group, and the parser that turns what was given into
 * the value the code uses. Everything else is derived from the tables
 * (src/agent/settings.ts, src/server/config/settings.ts): yargs' options, the
 * --help groups, the notices for upstream flags Kanal ignores, and the flag
 * reference in docs/flags.md. The path of one setting from its entry to its
 * use: docs/architecture.md, "Settings".
 */

import type { HelpGroup } from './groups.js';

/** What yargs hands over: a string, a number or a boolean, or a list of one of them. */
export type GivenType = 'string' | 'number' | 'boolean';

/**
 * Where a setting's value holds (scope.ts; docs/multi-tenant.md):
 * - process: one value for the whole process, given on the command line only;
 * - tenant: each tenant's own, in its tenants-file entry; without
 *   --tenants-config the command line gives the one cluster's (with it, the
 *   command line refuses it, so no setting has two places that could disagree);
 * - process-and-tenant: the command line's value is the process's own (e.g.
 *   the agent port's default certificate) and a tenant's entry gives its own;
 * - one-cluster: only without --tenants-config.
 */
export type Scope = 'process' | 'tenant' | 'process-and-tenant' | 'one-cluster';

export interface Setting<Given, Value> {
  readonly type: GivenType;
  /** Repeatable: given as a list (every other flag keeps its last value, like Go's flag package). */
  readonly array?: boolean;
  readonly default?: Given;
  readonly describe: string;
  /** The --help heading and docs/flags.md section it is listed under (one of groups.ts). */
  readonly group: HelpGroup;
  /** yargs refuses anything else with its own "Invalid values" message. */
  readonly choices?: readonly string[];
  /** Accepted for upstream's manifests but not shown in --help. */
  readonly hidden?: boolean;
  /** Set only for upstream flags Kanal ignores: logged once when the flag is given. */
  readonly notice?: string;
  /** Where its value holds; absent: the process (scope.ts). */
  readonly scope?: Scope;
  /** What was given (the default applied) to its value; a mistake throws a UsageError naming `--${flag}`. */
  parse(given: Given, flag: string): Value;
}

/** Any setting, as a table holds it (a method's parameter is bivariant, so every Setting<G, V> fits). */
export type AnySetting = Setting<unknown, unknown>;

/** A command's settings, by flag name. */
export type SettingTable = Readonly<Record<string, AnySetting>>;

/** What the command line gives for each setting of `T` (yargs' defaults applied). */
export type GivenOf<T extends SettingTable> = { [K in keyof T]: T[K] extends Setting<infer G, unknown> ? G : never };

/** Each setting of `T` parsed. */
export type ValuesOf<T extends SettingTable> = { [K in keyof T]: T[K] extends { parse: (...args: never[]) => infer V } ? V : never };
