/**
 * The primary process of `--workers N` (docs/multi-tenant.md, "Workers"):
 * its private directory, the worker pool (primary.ts) on the shared ports,
 * and, with a tenants file, its reload on change and SIGHUP, whose server
 * names and tenant names the pool routes by.
 */
import type { ChildProcess } from 'node:child_process';
import type { Logger } from 'pino';
import { KanalMetrics } from '../../domain/metrics.js';
import type { HealthPortOptions } from '../../common/health-server.js';
import type { UnixSocketOptions } from '../frontends/unix-socket.js';
import { sharesOf, type TenantDefinition } from '../tenants/tenant-definition.js';
import type { TenantsAtStart } from '../tenants/tenants-at-start.js';
import { logRefusedReload, reloadCounter, reloadOnChangeOrHangup } from '../tenants/tenants-watch.js';
import { WorkerPool, type PrimaryExtraListener, type PrimaryFlags } from './primary.js';
import { createPrivateDir, removeStaleDirs } from './private-dir.js';
import { ownersOf } from './owner.js';
import { isShared } from './worker-server.js';

export interface PrimaryProcessOptions {
  /** The file as read at start; read again on each reload. Absent: a server of one cluster. */
  tenants?: TenantsAtStart;
  workers: number;
  /** Starts worker `index` of `count` with the handoff directory `dir` (worker-env.ts spawnWorker). */
  spawnWorker(index: number, count: number, dir: string): ChildProcess;
  agent: { host: string; port: number };
  frontend?: { host: string; port: number };
  /** One cluster's Unix socket frontend. */
  uds?: UnixSocketOptions;
  /** One cluster's plain listeners (HTTP proxy, SOCKS5), bound here for the workers. */
  extra?: readonly PrimaryExtraListener[];
  /** One cluster's --frontend-clients-config, which each worker reads; the primary passes SIGHUP on to them. */
  clientsFile?: string;
  health?: HealthPortOptions;
  maxPendingHellos: number;
  maxPendingHellosPerHost: number;
  flags: PrimaryFlags;
  log: Logger;
}

export interface Primary {
  pool: WorkerPool;
  metrics: KanalMetrics;
  stop(): Promise<void>;
}

/** The tenants' names of the file (the primary's `/readyz?tenant=`). */
function tenantNames(list: readonly TenantDefinition[]): Set<string> {
  return new Set(list.map((t) => t.name));
}

/** The server names of the file's tenants, for the primary to route by. */
function serverNames(list: readonly TenantDefinition[]): Map<string, string> {
  const names = new Map<string, string>();
  for (const t of list) for (const n of t.credentials.serverNames) names.set(n, t.name);
  return names;
}

/** The Unix sockets of the file's tenants that several of `workers` share: the primary binds them (a worker alone binds its own). */
function sharedSockets(list: readonly TenantDefinition[], workers: number): Map<string, UnixSocketOptions> {
  const out = new Map<string, UnixSocketOptions>();
  for (const t of list) if (t.uds && isShared(t.workers, workers)) out.set(t.name, t.uds);
  return out;
}

/** The primary: starts the workers and the shared ports, reloads on change and SIGHUP. */
export async function startPrimary(o: PrimaryProcessOptions): Promise<Primary> {
  const { log, workers, tenants } = o;
  let names = serverNames(tenants?.first ?? []);
  let known = tenantNames(tenants?.first ?? []);
  let shares = sharesOf(tenants?.first ?? []);
  removeStaleDirs(log);
  // Removed by stop() below, or when the process exits however it does (private-dir.ts).
  const dir = createPrivateDir();
  const metrics = new KanalMetrics('server');
  metrics.registry.setDefaultLabels({ worker: 'primary' });
  const reloads = reloadCounter(metrics.registry);
  const pool = new WorkerPool({
    count: workers,
    spawn: (i) => o.spawnWorker(i, workers, dir.path),
    agent: o.agent,
    flags: o.flags,
    ...(o.frontend ? { frontend: o.frontend } : {}),
    ...(o.health ? { health: o.health } : {}),
    ...(o.uds ? { uds: o.uds } : {}),
    ...(o.extra ? { extra: o.extra } : {}),
    ...(tenants
      ? {
          tenantSockets: sharedSockets(tenants.first, workers),
          tenants: {
            tenantOfServerName: (name: string) => names.get(name),
            owners: (tenant: string) => ownersOf(tenant, shares.get(tenant) ?? 1, workers),
            tenantNames: () => known,
          },
        }
      : {}),
    maxPendingHellos: o.maxPendingHellos,
    maxPendingHellosPerHost: o.maxPendingHellosPerHost,
    metrics,
    log,
  });
  try {
    await pool.start();
  } catch (err) {
    await pool.stop();
    dir.remove();
    throw err;
  }
  if (!tenants) {
    // The workers watch the clients file themselves; a SIGHUP (systemd's ExecReload) reaches only this process,
    // and would end it unhandled (signal(7): Term), so it is passed on as a reload.
    const clientsFile = o.clientsFile;
    const onHangup = (): void => {
      log.info(
        { file: clientsFile },
        clientsFile ? 'SIGHUP: each worker reads the frontend clients file again' : 'SIGHUP: nothing to read again',
      );
      if (clientsFile) void pool.reload();
    };
    process.on('SIGHUP', onHangup);
    return {
      pool,
      metrics,
      stop: async () => {
        process.off('SIGHUP', onHangup);
        await pool.stop();
        dir.remove();
      },
    };
  }
  const reload = (): void => {
    let list: TenantDefinition[];
    try {
      list = tenants.read();
      names = serverNames(list);
      known = tenantNames(list);
      shares = sharesOf(list);
    } catch (err) {
      logRefusedReload(log, err);
      reloads.inc({ result: 'invalid' });
      return;
    }
    reloads.inc({ result: 'applied' });
    void pool.reload(sharedSockets(list, workers));
  };
  const watch = reloadOnChangeOrHangup(tenants, reload, log);
  return {
    pool,
    metrics,
    stop: async () => {
      watch.close();
      await pool.stop();
      dir.remove();
    },
  };
}
