/**
 * `kanal server --workers N` (with --tenants-config FILE or of one cluster):
 * the command's glue for its processes (docs/multi-tenant.md, "Workers"):
 * the primary (server/workers/primary-process.ts) with its admin port and
 * systemd, and a worker run until its primary or a signal stops it. Loaded
 * by server-command.ts only with --tenants-config or --workers.
 */
import type { Logger } from 'pino';
import type { ServerConfig } from '../server/config/config.js';
import type { KanalServer } from '../server/server.js';
import { createLogger } from '../common/logger.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpListener } from '../common/http-listener.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { linkToPrimary } from '../server/workers/worker-link.js';
import { startPrimary } from '../server/workers/primary-process.js';
import type { TenantsAtStart } from '../server/tenants/tenants-at-start.js';
import { assemblePrimary, workerAuditPaths } from '../server/assembly/server-assembly.js';
import { runUntilSignalled } from './lifecycle.js';
import { FLAG } from '../server/config/settings.js';

/** `--workers N`: the primary; the workers are this command again. `tenants` absent: a server of one cluster. */
export async function runPrimary(config: ServerConfig, tenants: TenantsAtStart | undefined): Promise<void> {
  const log = createLogger(config.logLevel, 'server', config.logFormat).child({ worker: 'primary' });
  for (const notice of config.notices) log.warn(notice);
  const workers = (tenants ? config.tenants?.workers : config.workers) ?? 1;
  const audit = config.settings['audit-log-path'];
  if (audit && audit !== '-')
    log.info(
      { auditLogPath: audit, files: workerAuditPaths(audit, workers) },
      `${FLAG['audit-log-path']} with --workers: each worker writes a file of its own, nothing is written to ${audit}`,
    );
  const primary = await startPrimary(assemblePrimary(config, tenants, log));
  let admin: HttpListener | undefined;
  if (config.admin)
    admin = await startAdminPort(
      {
        ...config.admin,
        registry: primary.pool.metricsSource,
        statusUnavailable: `this is the primary of --workers ${workers}: the agents are held by its workers, and the primary does not gather their status yet; start the server without --workers to see it (docs/multi-tenant.md, "Workers")`,
        log,
      },
      `${FLAG['admin-bind-address']}, ${FLAG['admin-port']}`,
    );
  const notifier = new SystemdNotifier((reason) => log.warn({ reason }, 'cannot notify systemd'));
  notifier.ready(`serving agents on port ${primary.pool.agentPort} with ${workers} workers`);
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
