/**
 * Reloads the tenants file when it changes. The directory is watched, not
 * the file: a mounted ConfigMap is updated by swapping the `..data` symlink
 * beside the file (kubelet's AtomicWriter), which a watch on the old file
 * never sees; an editor's rename-into-place is the same case. Events are
 * gathered for a moment (one change is often several events) and the
 * content compared, so a touch without a change reloads nothing.
 */
import fs from 'node:fs';
import path from 'node:path';
import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import { Counter, type Registry } from '../../domain/prom-client.js';
import type { LabelledCounter } from '../../domain/metrics.js';
import { errorMessage } from '../../common/error-message.js';
import { TenantsRefused } from './tenant-definition.js';

/** Events within this long make one reload. */
export const SETTLE_MS = 250;

export interface TenantsWatch {
  close(): void;
}

/** The SHA-256 of `file`'s content; undefined when it cannot be read. */
export function fileDigest(file: string): string | undefined {
  try {
    return createHash('sha256').update(fs.readFileSync(file)).digest('hex');
  } catch {
    return undefined;
  }
}

/**
 * Calls `reload` after the file's content differs from `since` (the digest of
 * the text last loaded) or, later, from what the watch saw last; says once if
 * the directory cannot be watched (SIGHUP still works).
 */
export function watchTenantsFile(file: string, since: string, reload: () => void, log: Logger, what = 'the tenants file'): TenantsWatch {
  let last: string | undefined = since;
  let timer: NodeJS.Timeout | undefined;
  const settle = (): void => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      timer = undefined;
      const now = fileDigest(file);
      if (now === last) return;
      last = now;
      reload();
    }, SETTLE_MS);
    timer.unref();
  };
  let watcher: fs.FSWatcher | undefined;
  try {
    watcher = fs.watch(path.dirname(path.resolve(file)), { persistent: false }, settle);
    watcher.on('error', (err) => log.warn({ err: err.message }, `watching ${what} failed; reload it with SIGHUP`));
  } catch (err) {
    log.warn({ err: errorMessage(err), file }, `cannot watch ${what}; reload it with SIGHUP`);
  }
  return {
    close: () => {
      clearTimeout(timer);
      watcher?.close();
    },
  };
}

/**
 * Reloads on a change of the file and on SIGHUP, saying why in one line: the
 * one path a server of one process and the primary of workers share
 * (docs/multi-tenant.md, "Live changes").
 */
export function reloadOnChangeOrHangup(
  tenants: { file: string; digest: string },
  reload: () => void,
  log: Logger,
  what = 'the tenants file',
): TenantsWatch {
  const file = tenants.file;
  const run = (why: string): void => {
    log.info({ file, why }, `reloading ${what}`);
    reload();
  };
  const onHangup = (): void => run('SIGHUP');
  process.on('SIGHUP', onHangup);
  const watch = watchTenantsFile(file, tenants.digest, () => run('the file changed'), log, what);
  return {
    close: () => {
      process.off('SIGHUP', onHangup);
      watch.close();
    },
  };
}

/** kanal_tenants_config_reloads_total{result}: how each reload of the tenants file ended. */
export function reloadCounter(registry: Registry): LabelledCounter<{ result: 'applied' | 'invalid' }> {
  return new Counter({
    name: 'kanal_tenants_config_reloads_total',
    help: 'Reloads of the tenants file by result: applied, or invalid (refused whole; the running tenants stay)',
    labelNames: ['result'],
    registers: [registry],
  });
}

/** Logs a refused reload: one field per mistake, since a long message would be cut in the log line (log-safety.ts). */
export function logRefusedReload(log: Logger, err: unknown): void {
  const fields = err instanceof TenantsRefused ? { file: err.file, mistakes: err.mistakes } : { err: errorMessage(err) };
  log.error(fields, 'tenants file refused: the running tenants stay as they are');
}
