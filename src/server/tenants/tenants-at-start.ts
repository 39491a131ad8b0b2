/**
 * The tenants file as a process read it at its start: read and checked once,
 * the list passed on to what needs it (the dry run, the primary of workers,
 * a server's first load); every later read is a reload.
 */
import type { TenantDefinition } from './tenant-definition.js';

/** Reads the file and every file it names; throws a TenantsFileError listing every problem. */
export type TenantsReader = () => TenantDefinition[];

export interface TenantsAtStart {
  /** The tenants-config file's path (for log lines and the watch). */
  readonly file: string;
  readonly first: readonly TenantDefinition[];
  /** SHA-256 of the text `first` was read from: the watch compares later contents with it, so a change made just after the read is not missed. */
  readonly digest: string;
  readonly read: TenantsReader;
}
