/**
 * `kanal server --tenants-config FILE [--workers N]`: loading the tenants,
 * reloading them, their token review, and the primary process
 * (workers/primary.ts) and what makes a `kanal server` process one of its
 * workers (docs/multi-tenant.md). A worker is the same command line started
 * again with KANAL_WORKER set; it binds no port of its own. Loaded by
 * server-command.ts only with --tenants-config.
 */
import path from 'node:path';
import { spawn, type ChildProcess } from 'node:child_process';
import { isSea } from 'node:sea';
import type { Logger } from 'pino';
import { KanalMetrics } from '../domain/metrics.js';
import type { ServerConfig } from '../server/config/config.js';
import type { KanalServer, ServerOptions } from '../server/server.js';
import { createLogger } from '../common/logger.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpListener } from '../common/http-listener.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { kubeClients } from '../kube/kube-clients.js';
import type { TokenAuthenticator } from '../server/identity/token-authenticator.js';
import { loadTenants } from '../server/config/tenants-loader.js';
import { linkToPrimary } from '../server/workers/worker-link.js';
import { runUntilSignalled } from './lifecycle.js';
import type { TenantDefinition } from '../server/tenants/tenant-definition.js';
import { WorkerPool } from '../server/workers/primary.js';
import { createPrivateDir, removeStaleDirs } from '../server/workers/private-dir.js';
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

/** Starts worker `index`: this process's own command line, in this runtime's form (npm package or executable). */
function spawnWorker(index: number, count: number, dir: string): ChildProcess {
  const args = isSea() ? process.argv.slice(2) : [...process.execArgv, process.argv[1], ...process.argv.slice(2)];
  return spawn(process.execPath, args, {
    stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
    env: { ...process.env, [WORKER_ENV]: `${index}/${count}`, [WORKER_DIR_ENV]: dir },
  });
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
  const first = load();
  let names = serverNames(first);
  let known = tenantNames(first);
  removeStaleDirs(log);
  // Removed by stop() below, or when the process exits however it does (private-dir.ts).
  const dir = createPrivateDir();
  const metrics = new KanalMetrics('server');
  metrics.registry.setDefaultLabels({ worker: 'primary' });
  const reloads = reloadCounter(metrics.registry);
  const v = config.settings;
  const pool = new WorkerPool({
    count: tenants.workers,
    spawn: (i) => spawnWorker(i, tenants.workers, dir.path),
    agent: { host: v['agent-bind-address'], port: v['agent-port'] },
    ...(config.frontend.tcp ? { frontend: { host: config.frontend.tcp.host, port: config.frontend.tcp.port } } : {}),
    ...(config.health ? { health: config.health } : {}),
    tenantOfServerName: (name) => names.get(name),
    owner: (tenant) => ownerOf(tenant, tenants.workers),
    tenantNames: () => known,
    maxPendingHellos: v['max-pending-client-hellos'],
    maxPendingHellosPerHost: v['max-pending-client-hellos-per-host'],
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
  const reload = (why: string): void => {
    log.info({ file, why }, 'reloading the tenants file');
    try {
      const list = load();
      names = serverNames(list);
      known = tenantNames(list);
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
      dir.remove();
    },
  };
}

/** `--tenants-config`: the file's tenants, loaded (and checked against the command line's shared TCP frontend). */
export function tenantsOf(config: ServerConfig): (() => TenantDefinition[]) | undefined {
  const file = config.tenants?.file;
  if (!file) return undefined;
  return () => loadTenants(file, { tcpFrontend: !!config.frontend.tcp });
}

/** What a server of tenants is given (ServerOptions.tenants): the first load (already read, so its mistakes stop the start), later reloads, token review per tenant. */
export function serverTenants(config: ServerConfig, load: () => TenantDefinition[], log: Logger): NonNullable<ServerOptions['tenants']> {
  let pending: TenantDefinition[] | undefined = load();
  return {
    load: () => {
      const list = pending ?? load();
      pending = undefined;
      return list;
    },
    policy: config.tls,
    tokenReview: (tenant) => tenantTokenReview(tenant, log.child({ tenant: tenant.name, part: 'kube' })),
  };
}

/** Reloads the tenants file when it changes and on SIGHUP (docs/multi-tenant.md, "Live changes"). */
export function reloadOnChange(server: KanalServer, file: string, log: Logger): { close(): void } {
  const reload = (why: string): void => {
    log.info({ file, why }, 'reloading the tenants file');
    void server.reloadTenants();
  };
  const onHangup = (): void => reload('SIGHUP');
  process.on('SIGHUP', onHangup);
  const watch = watchTenantsFile(file, () => reload('the file changed'), log);
  return {
    close: () => {
      process.off('SIGHUP', onHangup);
      watch.close();
    },
  };
}

/** Token review for one tenant, against its own kube-apiserver (its kubeconfig). */
async function tenantTokenReview(spec: TenantDefinition, log: Logger): Promise<{ authenticator: TokenAuthenticator; release: () => void }> {
  const tokens = spec.tokens;
  if (!tokens) throw new Error(`tenant ${spec.name} has no token review`);
  const newClient = await kubeClients(tokens.kube, log);
  const api = newClient();
  const { TokenAuthenticator } = await import('../server/identity/token-authenticator.js');
  return {
    authenticator: new TokenAuthenticator({
      api,
      namespace: tokens.namespace,
      serviceAccount: tokens.serviceAccount,
      audience: tokens.audience,
    }),
    release: () => api.close(),
  };
}

/** `--workers N`: the primary; the workers are this command again. */
export async function runPrimary(config: ServerConfig, load: () => TenantDefinition[]): Promise<void> {
  const log = createLogger(config.logLevel, 'server', config.logFormat).child({ worker: 'primary' });
  for (const notice of config.notices) log.warn(notice);
  const primary = await startPrimary(config, load, log);
  let admin: HttpListener | undefined;
  if (config.admin)
    admin = await startAdminPort({ ...config.admin, registry: primary.pool.metricsSource, log }, '--admin-bind-address, --admin-port');
  const notifier = new SystemdNotifier((reason) => log.warn({ reason }, 'cannot notify systemd'));
  notifier.ready(`serving agents on port ${primary.pool.agentPort} with ${config.tenants?.workers ?? 1} workers`);
  runUntilSignalled(log, async () => {
    notifier.stopping();
    await Promise.all([admin?.close(), primary.stop()]);
  });
}

/** A worker: started, linked to its primary, stopped with it or on SIGTERM; reloads only when the primary says. */
export async function runWorker(server: KanalServer, log: Logger): Promise<void> {
  await server.start();
  const stop = async (): Promise<void> => {
    await server.stop();
  };
  linkToPrimary(server, log, () => {
    log.warn('the primary is gone: this worker stops');
    void stop().finally(() => process.exit(0));
  });
  runUntilSignalled(log, stop);
}
