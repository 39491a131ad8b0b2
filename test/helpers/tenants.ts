/** What the tenant tests share: credential files, the tenants file's frame, and a shared server's command line (docs/multi-tenant.md). */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Child } from '../../kit/launch/child.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { freePort, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';

/** A certificate and its key, as files. */
export interface Pem {
  cert: string;
  key: string;
}

/** Writes an issued pair into `dir` as NAME.crt and NAME.key (the key readable by its owner only). */
export async function writePair(dir: string, name: string, issued: { certPem: string; keyPem: string }): Promise<Pem> {
  const cert = path.join(dir, `${name}.crt`);
  const key = path.join(dir, `${name}.key`);
  await fs.writeFile(cert, issued.certPem);
  await fs.writeFile(key, issued.keyPem, { mode: 0o600 });
  return { cert, key };
}

/** A tenants file of the given entries (each a YAML list item of its own). */
export function tenantsFile(entries: readonly string[]): string {
  return `apiVersion: kanal.dev/v1alpha1\nkind: TenantsConfig\ntenants:\n${entries.join('')}`;
}

/** `kanal server --tenants-config FILE` on one agent port with `defaultPair` for connections without a tenant's name, debug logs. */
export function tenantsServerArgs(o: {
  file: string;
  defaultPair: Pem;
  agentHost: string;
  agentPort: number;
  healthPort: number;
}): string[] {
  return [
    'server',
    '--tenants-config',
    o.file,
    '--agent-bind-address',
    o.agentHost,
    '--agent-port',
    String(o.agentPort),
    '--cluster-cert',
    o.defaultPair.cert,
    '--cluster-key',
    o.defaultPair.key,
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    String(o.healthPort),
    '--admin-port',
    '0',
    '--server-id',
    'shared',
    '--log-level',
    'debug',
  ];
}

/** A tenants server (tenantsServerArgs) on fresh loopback ports for each attempt (withPortRetry), once its `/ready` path answers. */
export function startTenantsServer(
  scope: Scope,
  o: { file: string; defaultPair: Pem; name: string; logFile: string; ready: 'healthz' | 'readyz' },
): Promise<Child & { agentPort: number; healthPort: number }> {
  return withPortRetry(async () => {
    const [agentPort, healthPort] = [await freePort(), await freePort()];
    const args = tenantsServerArgs({ file: o.file, defaultPair: o.defaultPair, agentHost: '127.0.0.1', agentPort, healthPort });
    const proc = spawnKanal(scope, { name: o.name, args, logFile: o.logFile });
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/${o.ready}`, 20_000);
    return Object.assign(proc, { agentPort, healthPort });
  });
}

/** The shared mTLS TCP frontend on 127.0.0.1:`port`, serving `pair` (the workspace's frontend certificate). */
export function tcpFrontendArgs(port: number, pair: Pem): string[] {
  return ['--server-bind-address', '127.0.0.1', '--server-port', String(port), '--server-cert', pair.cert, '--server-key', pair.key];
}
