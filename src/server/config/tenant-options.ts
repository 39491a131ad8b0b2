/**
 * A tenant's settings made the options its room is built from and updated
 * with (tenants/tenant.ts, TenantSettingsOptions): the one mapping, for the
 * one cluster of a command line and for each entry of a tenants file alike.
 * It takes only the values of settings whose scope is a tenant's
 * (settings.ts), so a process-wide setting cannot slip into a tenant.
 */
import type { TenantSettingsOptions } from '../tenants/tenant.js';
import type { ServerSettings } from './settings.js';
import type { TenantKey, TenantSettings } from './tenant-settings.js';
import type { ClientEntry } from '../clients/client-entry.js';

/** The values of a tenant's settings, from a command line or a tenants file's entry. */
export type PerTenantValues = Pick<ServerSettings, TenantKey>;

/** The limits only a tenants file's entry has: the tenant's share of the shared server. */
export type TenantWideValues = Pick<TenantSettings, 'max-agents' | 'max-connections' | 'max-pending-dials' | 'dial-rate' | 'dial-burst'>;

/**
 * `v` as a tenant's options; `tenantWide`: the tenant-wide limits of a tenants file's entry (absent: none, one cluster);
 * `clients`: its `clients:` list, token files read (config/clients-config.ts; --frontend-clients-config for one cluster).
 */
export function tenantOptionsOf(
  v: PerTenantValues,
  tenantWide?: TenantWideValues,
  clients?: readonly ClientEntry[],
): TenantSettingsOptions {
  return {
    ...(clients && clients.length > 0 ? { clients } : {}),
    serverCount: v['server-count'],
    maxAgentsPerCredential: v['max-agents-per-credential'],
    ...(tenantWide
      ? {
          maxAgents: tenantWide['max-agents'],
          quota: {
            maxConnections: tenantWide['max-connections'],
            maxPendingDials: tenantWide['max-pending-dials'],
            dialRate: tenantWide['dial-rate'],
            dialBurst: tenantWide['dial-burst'],
          },
        }
      : {}),
    proxyStrategies: v['proxy-strategies'],
    backendDialTimeoutMs: v['backend-dial-timeout'].ms,
    allowedDestinations: v['allowed-destination'],
    destinationDialTimeoutMs: v['destination-dial-timeout'],
    directRoutes: v['direct-route'],
    limits: { maxWindowBytes: v['max-connection-window'], peerReadTimeoutMs: v['peer-read-timeout'] },
    agentLimits: {
      maxInboundConnections: v['max-node-to-cp-connections-per-agent'],
      maxOutboundConnections: v['max-cp-to-node-connections-per-agent'],
      maxPendingDials: v['max-pending-dials-per-agent'],
      dialRate: v['dial-rate-per-agent'],
      dialBurst: v['dial-burst-per-agent'],
    },
    retainedBytes: { perAgent: v['max-retained-bytes-per-agent'], perTenant: v['max-retained-bytes-per-tenant'] },
  };
}
