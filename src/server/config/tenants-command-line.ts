/**
 * `kanal server --tenants-config`: what the command line still says when a
 * file declares the tenants (docs/multi-tenant.md). The process's own
 * settings stay on it (ports, the agent port's default certificate, the
 * shared TCP frontend, keepalive, transport, logging); a tenant's settings
 * given there are refused, naming the file as their place, so no setting
 * has two places that could disagree.
 */
import { cpuQuota } from '../../common/cpu-quota.js';
import { UsageError } from '../../common/usage-error.js';
import { FLAG, serverSettings, type ServerSettings } from './settings.js';
import { processConfig, type ServerConfig } from './config.js';
import { keysOfScope } from '../../settings/scope.js';

/** A tenant's own settings: refused here, their place is each tenant's entry (kept here: the process-and-tenant ones). */
const TENANTS_OWN = keysOfScope(serverSettings, ['tenant']);

/** Settings of one cluster that have no meaning for a server of many. */
const ONE_CLUSTER_ONLY = keysOfScope(serverSettings, ['one-cluster']);

function isDefault(name: keyof ServerSettings, given: unknown): boolean {
  const d: unknown = serverSettings[name].default;
  if (Array.isArray(given)) return given.length === 0;
  return given === undefined || given === d;
}

/** The configuration of a server of many tenants; `given` is the command line as yargs parsed it (defaults applied). */
export function tenantsServerConfig(
  v: ServerSettings,
  given: Readonly<Record<string, unknown>>,
  notices: string[],
  file: string,
): ServerConfig {
  const misplaced = TENANTS_OWN.filter((n) => !isDefault(n, given[n]));
  const mistakes = misplaced.map(
    (n) => `--${n} is a tenant's setting with ${FLAG['tenants-config']}: set ${n} in each tenant's entry of ${file}`,
  );
  for (const n of ONE_CLUSTER_ONLY) {
    if (!isDefault(n, given[n])) mistakes.push(`--${n} is not offered with ${FLAG['tenants-config']} (docs/multi-tenant.md)`);
  }
  if (mistakes.length > 0)
    throw new UsageError(mistakes.length === 1 ? mistakes[0] : `${mistakes.length} mistakes:\n  ${mistakes.join('\n  ')}`);
  const certFile = v['cluster-cert'] ?? v['server-cert'];
  const keyFile = v['cluster-key'] ?? v['server-key'];
  if (!certFile || !keyFile)
    throw new UsageError(
      `the agent port needs a default certificate (for agents that send no tenant server name): pass ${FLAG['cluster-cert']} and ${FLAG['cluster-key']} (or ${FLAG['server-cert']} and ${FLAG['server-key']})`,
    );
  const [cert, key] = [v['server-cert'], v['server-key']];
  return {
    ...processConfig(v, notices, { certFile, keyFile }),
    frontend:
      cert && key
        ? {
            tcp: {
              host: v['server-bind-address'],
              port: v['server-port'],
              certFile: cert,
              keyFile: key,
              clientPins: { subjects: [], ekus: [] },
            },
          }
        : {},
    tenants: { file, workers: v.workers || cpuQuota() },
  };
}
