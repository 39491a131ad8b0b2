/**
 * What makes a worker a server of its own to the agents it shares with the
 * other workers (docs/multi-tenant.md, "Workers"): its own server ID, and
 * the server count multiplied by how many workers share them, so agents
 * (upstream's and Kanal's) keep a tunnel to each, as they keep one to every
 * replica (docs/ha.md; upstream pkg/agent/clientset.go, sync).
 */
import type { TenantSettingsOptions } from '../tenants/tenant.js';
import type { WorkerPlace } from './worker-env.js';

/** The server ID of worker `index` of the server `serverID`. */
export function workerServerID(serverID: string, index: number): string {
  return `${serverID}-w${index}`;
}

/** Whether a tenant of `tenant-workers: tenantWorkers` is shared by several of `count` workers (else one serves it whole). */
export function isShared(tenantWorkers: number, count: number): boolean {
  return Math.min(tenantWorkers, count) > 1;
}

/** A tenant on `worker`: shared by several workers (its `tenant-workers`), a server of its own on each; served whole by one, the server's own ID and the tenant's count. */
export function sharedTenantServer(
  serverID: string,
  tenant: { workers: number; options: Pick<TenantSettingsOptions, 'serverCount'> },
  worker: Pick<WorkerPlace, 'index' | 'count'>,
): { shared: boolean; serverID: string; serverCount: number } {
  const share = Math.min(tenant.workers, worker.count);
  if (!isShared(tenant.workers, worker.count)) return { shared: false, serverID, serverCount: tenant.options.serverCount };
  return { shared: true, serverID: workerServerID(serverID, worker.index), serverCount: tenant.options.serverCount * share };
}
