/**
 * What makes worker `index` of a server of one cluster a server of its own
 * to the agents (docs/multi-tenant.md, "Workers of one cluster"): its own
 * server ID, and the server count multiplied by the workers, so agents
 * (upstream's and Kanal's) keep a tunnel to every worker of every replica,
 * as they keep one to every replica (docs/ha.md). With the lease controller
 * each worker holds a lease of its own under its ID: lease counting agents
 * count the workers too. A tenant shared by several workers is the same
 * on each of them (workers/worker-server.ts).
 */
import type { ServerSettings } from './settings.js';
import type { WorkerPlace } from '../workers/worker-env.js';
import { workerServerID } from '../workers/worker-server.js';

/** The settings of `worker` from the command line's. */
export function clusterWorkerSettings(v: ServerSettings, worker: Pick<WorkerPlace, 'index' | 'count'>): ServerSettings {
  const own = { ...v };
  own['server-id'] = workerServerID(v['server-id'], worker.index);
  own['server-count'] = v['server-count'] * worker.count;
  return own;
}
