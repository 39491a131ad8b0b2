/**
 * A setting's scope (Scope, setting.ts) declared in its table entry and
 * carried by the types: the keys of one scope are derived from the table, so
 * a tenant's keys, what the command line refuses with --tenants-config and
 * what a tenants file may name are never listed by hand (docs/multi-tenant.md).
 */
import type { AnySetting, Scope, SettingTable } from './setting.js';

/** `s` with its scope declared. */
export function scoped<C extends Scope, S extends AnySetting>(scope: C, s: S): S & { readonly scope: C } {
  return { ...s, scope };
}

/** A tenant's own setting; the command line gives the one cluster's. */
export function perTenant<S extends AnySetting>(s: S): S & { readonly scope: 'tenant' } {
  return scoped('tenant', s);
}

/** The process's on the command line, and a tenant's own in its entry. */
export function processAndTenant<S extends AnySetting>(s: S): S & { readonly scope: 'process-and-tenant' } {
  return scoped('process-and-tenant', s);
}

/** Only for a server of one cluster (refused with --tenants-config). */
export function oneClusterOnly<S extends AnySetting>(s: S): S & { readonly scope: 'one-cluster' } {
  return scoped('one-cluster', s);
}

/** The keys of `T` whose entries declare one of the scopes `C`. */
export type KeysOfScope<T extends SettingTable, C extends Scope> = {
  [K in keyof T]: T[K] extends { readonly scope: C } ? K : never;
}[keyof T] &
  string;

/** The keys of `table` whose entries declare one of `scopes`, in the table's order. */
export function keysOfScope<T extends SettingTable, C extends Scope>(table: T, scopes: readonly C[]): KeysOfScope<T, C>[] {
  const keys = Object.keys(table).filter((k) => scopes.some((c) => c === table[k].scope));
  // Each key kept declares a scope of `scopes`, which is what KeysOfScope selects.
  return keys as KeysOfScope<T, C>[];
}

/** The entries of `table` named by `keys`, under the same names. */
export function pickSettings<T extends SettingTable, K extends keyof T & string>(table: T, keys: readonly K[]): { [P in K]: T[P] } {
  const out: Partial<Record<K, AnySetting>> = {};
  for (const k of keys) out[k] = table[k];
  // Each key was copied from `table` under its own name.
  return out as { [P in K]: T[P] };
}
