/**
 * A tenant as the server is given it: the tenants file's entry read, checked
 * and its credential files loaded (config/tenants-loader.ts), in the shapes
 * the tenant (tenant.ts), the directory (tenant-directory.ts) and its Unix
 * socket take. Kept apart from the file's own format, which only config/ reads.
 */
import { UsageError } from '../../common/usage-error.js';
import type { KubeClientConfig } from '../../kube/kube-clients.js';
import type { UnixSocketOptions } from '../frontends/unix-socket.js';
import type { TenantCredentials } from './tenant-directory.js';
import type { TenantSettingsOptions } from './tenant.js';

// The settings these messages name, spelt once here: this module sits below the server's table (src/server/config/settings.ts) in the layers.
export const TENANTS_CONFIG = '--tenants-config';

export interface TenantDefinition {
  name: string;
  credentials: TenantCredentials;
  /** What its settings give it (config/tenant-options.ts); the rest a tenant takes from the server. */
  options: TenantSettingsOptions;
  /** Token review against the tenant's own kube-apiserver. */
  tokens?: { namespace: string; serviceAccount: string; audience: string; kube: KubeClientConfig };
  /** How many workers of --workers serve it (tenants-file `tenant-workers`; 1: one serves it whole, workers/owner.ts). */
  workers: number;
  /** Its kube-apiserver's own Unix socket. */
  uds?: UnixSocketOptions & { path: string };
  /** The entry and the contents of every file it names: equal fingerprints, unchanged tenant. */
  fingerprint: string;
  /**
   * Who the tenant is: its credentials' contents, names, pins, token review
   * and socket. A change of the fingerprint with this one equal is a change of
   * settings alone, applied in place (tenant.ts update()).
   */
  identity: string;
}

/** How many workers share each tenant of `list` (its `tenant-workers`). */
export function sharesOf(list: readonly TenantDefinition[]): Map<string, number> {
  return new Map(list.map((t) => [t.name, t.workers]));
}

/** Tenants that cannot be served as given (a file with mistakes): every mistake, one line each. */
export class TenantsRefused extends UsageError {
  override name = 'TenantsRefused';
  constructor(
    readonly file: string,
    readonly mistakes: readonly string[],
  ) {
    super(
      mistakes.length === 1
        ? `${TENANTS_CONFIG} ${file}: ${mistakes[0]}`
        : `${TENANTS_CONFIG} ${file}: ${mistakes.length} mistakes:\n  ${mistakes.join('\n  ')}`,
    );
  }
}
