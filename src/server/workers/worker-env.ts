/**
 * What makes a `kanal server` process one of its primary's workers
 * (docs/multi-tenant.md, "Workers"): a worker is the same command line
 * started again with KANAL_WORKER set; it binds no port of its own.
 */
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { isSea } from 'node:sea';
import { ownersOf } from './owner.js';

/** Set in a worker's environment: `index/count` and the directory of the handoff sockets. */
export const WORKER_ENV = 'KANAL_WORKER';
export const WORKER_DIR_ENV = 'KANAL_WORKER_DIR';

/** Worker `index` of several: which workers serve a tenant, and where each worker takes relayed connections. */
export interface WorkerPlace {
  index: number;
  /** How many workers the primary runs. */
  count: number;
  /** The workers that serve `tenant`, shared by `share` of them (its tenants-file `tenant-workers`), first owner first. */
  owners(tenant: string, share: number): number[];
  handoffPath(index: number): string;
}

/** This process as a worker (from its environment), or undefined for a primary or a server without workers. */
export function workerOf(env: NodeJS.ProcessEnv = process.env): WorkerPlace | undefined {
  const m = /^(\d+)\/(\d+)$/.exec(env[WORKER_ENV] ?? '');
  const dir = env[WORKER_DIR_ENV];
  if (!m || !dir) return undefined;
  const [index, count] = [Number(m[1]), Number(m[2])];
  return { index, count, owners: (tenant, share) => ownersOf(tenant, share, count), handoffPath: (i) => path.join(dir, `w${i}.sock`) };
}

/** Starts worker `index`: this process's own command line, in this runtime's form (npm package or executable). */
export function spawnWorker(index: number, count: number, dir: string): ChildProcess {
  const args = isSea() ? process.argv.slice(2) : [...process.execArgv, process.argv[1], ...process.argv.slice(2)];
  return spawn(process.execPath, args, {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, [WORKER_ENV]: `${index}/${count}`, [WORKER_DIR_ENV]: dir },
  });
}
