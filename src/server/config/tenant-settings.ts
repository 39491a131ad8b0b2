/**
 * A tenant's settings in the tenants file (docs/multi-tenant.md): the
 * command line's own entries whose scope is a tenant's, under the same names,
 * with the same parsers and defaults (src/server/config/settings.ts), so a
 * tenants file cannot name a process-wide setting; and the few that only a
 * tenant has: its name, how its agents are recognised (server-name,
 * token-issuer) and the tenant-wide limits that keep tenants fair.
 */
import { UsageError } from '../../common/usage-error.js';
import { count, listOf, optionalText, setting } from '../../settings/kinds.js';
import { serverSettings } from '../config/settings.js';
import type { ValuesOf } from '../../settings/setting.js';
import { keysOfScope, pickSettings } from '../../settings/scope.js';

const TENANT = 'Tenant';
const FAIRNESS = 'Tenant-wide limits';

/** Lowercase DNS label (RFC 1123): the `tenant` label of logs and metrics. */
const TENANT_NAME = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;

/** A DNS name as TLS SNI carries it (RFC 6066 section 3: no IP address, no trailing dot), compared in lower case. */
const SERVER_NAME = /^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;

/** The command line's entries a tenant has too (their scope says so): who its agents and kube-apiserver are, and what they may do. */
export const TENANT_KEYS = keysOfScope(serverSettings, ['tenant', 'process-and-tenant']);

/** A setting of the command line that a tenant has too. */
export type TenantKey = (typeof TENANT_KEYS)[number];

export const tenantSettings = {
  name: setting({
    type: 'string',
    describe: 'The tenant, as logs, metrics and /readyz name it: a lowercase DNS label',
    group: TENANT,
    parse: (v: string | undefined, flag): string => {
      if (v === undefined || v === '') throw new UsageError(`${flag} is required`);
      if (!TENANT_NAME.test(v))
        throw new UsageError(`--${flag} ${JSON.stringify(v)}: use a lowercase DNS label (a-z, 0-9, '-', at most 63)`);
      return v;
    },
  }),
  'server-name': listOf({
    describe: "TLS server names (SNI) that pick this tenant on the agent port; the server presents the tenant's cluster-cert for them",
    group: TENANT,
    item: (v, flag) => {
      const name = v.toLowerCase();
      if (!SERVER_NAME.test(name)) throw new UsageError(`--${flag} ${JSON.stringify(v)}: want a DNS name (SNI carries no IP address)`);
      return name;
    },
  }),
  'token-issuer': optionalText({
    describe: "An agent with neither a matching server name nor certificate belongs to this tenant when its token's iss claim is this",
    group: TENANT,
  }),
  'tenant-workers': count({
    default: 1,
    describe:
      'Workers of --workers that serve this tenant, each a server of its own to its agents (server ID suffixed -wN, server-count multiplied); 1: one worker serves it whole. At most --workers',
    group: TENANT,
  }),
  'max-agents': count({ default: 1000, describe: 'Agents (distinct agentIDs) of the tenant on this server', group: FAIRNESS }),
  'max-connections': count({
    default: 10_000,
    describe: 'Tunnelled connections of the tenant, both directions, dialling or open',
    group: FAIRNESS,
  }),
  'max-pending-dials': count({ default: 1000, describe: 'Dials of the tenant waiting for an answer, both directions', group: FAIRNESS }),
  'dial-rate': count({
    default: 500,
    min: 0,
    describe: 'Dials per second of the tenant, both directions (0: no rate limit)',
    group: FAIRNESS,
  }),
  'dial-burst': count({ default: 1000, describe: 'Dials the tenant may make at once above dial-rate', group: FAIRNESS }),
  ...pickSettings(serverSettings, TENANT_KEYS),
} as const;

export type TenantSettings = ValuesOf<typeof tenantSettings>;
