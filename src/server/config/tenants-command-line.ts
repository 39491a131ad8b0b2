/**
 * `kanal server --tenants-config`: what the command line still says when a
 * file declares the tenants (docs/multi-tenant.md). The process's own
 * settings stay on it (ports, the agent port's default certificate, the
 * shared TCP frontend, keepalive, transport, logging); a tenant's settings
 * given there are refused, naming the file as their place, so no setting
 * has two places that could disagree.
 */
import os from 'node:os';
import { UsageError } from '../../common/usage-error.js';
import { serverSettings, type ServerSettings } from './settings.js';
import { processConfig, type ServerConfig } from './config.js';
import { SHARED_WITH_COMMAND_LINE } from './tenant-settings.js';

/** Kept on the command line with --tenants-config: the agent port's default certificate, and how the API client asks. */
const STILL_THE_PROCESS: readonly string[] = ['cluster-cert', 'cluster-key', 'kube-api-content-type', 'kubeconfig-qps', 'kubeconfig-burst'];

/** Settings of one cluster that have no meaning for a server of many. */
const ONE_CLUSTER_ONLY: readonly (keyof ServerSettings)[] = ['allow-unauthenticated-agents', 'enable-lease-controller', 'lease-label'];

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
  const misplaced = SHARED_WITH_COMMAND_LINE.filter((n) => !STILL_THE_PROCESS.includes(n) && !isDefault(n, given[n]));
  const mistakes = misplaced.map((n) => `--${n} is a tenant's setting with --tenants-config: set ${n} in each tenant's entry of ${file}`);
  for (const n of ONE_CLUSTER_ONLY) {
    if (!isDefault(n, given[n])) mistakes.push(`--${n} is not offered with --tenants-config (docs/multi-tenant.md)`);
  }
  if (mistakes.length > 0)
    throw new UsageError(mistakes.length === 1 ? mistakes[0] : `${mistakes.length} mistakes:\n  ${mistakes.join('\n  ')}`);
  const certFile = v['cluster-cert'] ?? v['server-cert'];
  const keyFile = v['cluster-key'] ?? v['server-key'];
  if (!certFile || !keyFile)
    throw new UsageError(
      'the agent port needs a default certificate (for agents that send no tenant server name): pass --cluster-cert and --cluster-key (or --server-cert and --server-key)',
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
    tenants: { file, workers: v.workers || os.availableParallelism() },
  };
}
