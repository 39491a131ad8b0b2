/**
 * `kanal server --tenants-config FILE --workers N`: the primary process
 * (workers/primary.ts) and what makes a `kanal server` process one of its
 * workers (docs/multi-tenant.md, "Workers"). A worker is the same command
 * line started again with KANAL_WORKER set; it binds no port of its own.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { isSea } from 'node:sea';
import type { Logger } from 'pino';
import { KanalMetrics } from '../domain/metrics.js';
import type { ServerConfig } from '../server/config/config.js';
import type { ServerOptions } from '../server/server.js';
import { TenantsRefused, type TenantDefinition } from '../server/tenants/tenant-definition.js';
import { WorkerPool } from '../server/workers/primary.js';
import { ownerOf } from '../server/workers/owner.js';
import { logRefusedReload, reloadCounter, watchTenantsFile } from '../server/tenants/tenants-watch.js';

/** Set in a worker's environment: `index/count` and the directory of the handoff sockets. */
export const WORKER_ENV = 'KANAL_WORKER';
export const WORKER_DIR_ENV = 'KANAL_WORKER_DIR';

/** This process as a worker (from its environment), or undefined for a primary or a server without workers. */
export function workerOf(env: NodeJS.ProcessEnv = process.env): ServerOptions['worker'] {
  const m = /^(\d+)\/(\d+)$/.exec(env[WORKER_ENV] ?? '');
  const dir = env[WORKER_DIR_ENV];
  if (!m || !dir) return undefined;
  const [index, count] = [Number(m[1]), Number(m[2])];
  return { index, owner: (tenant) => ownerOf(tenant, count), handoffPath: (i) => path.join(dir, `w${i}.sock`) };
}

/**
 * Tenants a worker cannot take: one recognised only by its token's issuer is
 * known only per stream, after the connection reached some worker, and a
 * stream cannot be moved alone; give it a server-name.
 */
export function checkForWorkers(list: readonly TenantDefinition[], file: string): TenantDefinition[] {
  const issuerOnly = list.filter((t) => t.credentials.serverNames.length === 0 && !t.credentials.agentCa);
  if (issuerOnly.length > 0)
    throw new TenantsRefused(
      file,
      issuerOnly.map(
        (t) =>
          `tenant ${JSON.stringify(t.name)}: with --workers, agents recognised by token-issuer alone cannot reach their worker; give the tenant a server-name`,
      ),
    );
  return [...list];
}

/** Starts worker `index`: this process's own command line, in this runtime's form (npm package or executable). */
function spawnWorker(index: number, count: number, dir: string): ChildProcess {
  const args = isSea() ? process.argv.slice(2) : [...process.execArgv, process.argv[1], ...process.argv.slice(2)];
  return spawn(process.execPath, args, {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, [WORKER_ENV]: `${index}/${count}`, [WORKER_DIR_ENV]: dir },
  });
}

/** The server names of the file's tenants, for the primary to route by. */
function serverNames(list: readonly TenantDefinition[]): Map<string, string> {
  const names = new Map<string, string>();
  for (const t of list) for (const n of t.credentials.serverNames) names.set(n, t.name);
  return names;
}

export interface Primary {
  pool: WorkerPool;
  metrics: KanalMetrics;
  stop(): Promise<void>;
}

/** The primary: checks the file, starts the workers and the shared ports, reloads on change and SIGHUP. */
export async function startPrimary(config: ServerConfig, load: () => TenantDefinition[], log: Logger): Promise<Primary> {
  const tenants = config.tenants;
  if (!tenants) throw new Error('workers need --tenants-config');
  const file = tenants.file;
  let names = serverNames(checkForWorkers(load(), file));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-workers-'));
  const metrics = new KanalMetrics('server');
  metrics.registry.setDefaultLabels({ worker: 'primary' });
  const reloads = reloadCounter(metrics.registry);
  const v = config.settings;
  const pool = new WorkerPool({
    count: tenants.workers,
    spawn: (i) => spawnWorker(i, tenants.workers, dir),
    agent: { host: v['agent-bind-address'], port: v['agent-port'] },
    ...(config.frontend.tcp ? { frontend: { host: config.frontend.tcp.host, port: config.frontend.tcp.port } } : {}),
    ...(config.health ? { health: config.health } : {}),
    tenantOfServerName: (name) => names.get(name),
    owner: (tenant) => ownerOf(tenant, tenants.workers),
    metrics,
    log,
  });
  try {
    await pool.start();
  } catch (err) {
    await pool.stop();
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const reload = (why: string): void => {
    log.info({ file, why }, 'reloading the tenants file');
    try {
      names = serverNames(checkForWorkers(load(), file));
    } catch (err) {
      logRefusedReload(log, err);
      reloads.inc({ result: 'invalid' });
      return;
    }
    reloads.inc({ result: 'applied' });
    void pool.reload();
  };
  const onHangup = (): void => reload('SIGHUP');
  process.on('SIGHUP', onHangup);
  const watch = watchTenantsFile(file, () => reload('the file changed'), log);
  return {
    pool,
    metrics,
    stop: async () => {
      process.off('SIGHUP', onHangup);
      watch.close();
      await pool.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
