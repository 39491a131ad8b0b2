/**
 * --frontend-clients-config, live: re-read when the file changes and on
 * SIGHUP (as the tenants file is, tenants/tenants-watch.ts), and applied in
 * place (TenantClients.configure): connections open stay, the next
 * admission and dial use the new list. A file with mistakes is refused
 * whole and the running list stays; kanal_frontend_clients_config_reloads_total{result}
 * counts both (docs/frontends.md, "Clients and rules").
 */
import type { Logger } from 'pino';
import { Counter, type Registry } from '../../domain/prom-client.js';
import { errorMessage } from '../../common/error-message.js';
import { reloadOnChangeOrHangup, type TenantsWatch } from './tenants-watch.js';
import type { ClientEntry } from '../clients/client-entry.js';

/** Where a server of one cluster reads its clients: the file, what was loaded of it, and how to read it again. */
export interface ClientsFileSource {
  /** The flag that named it (--frontend-clients-config), for the metric's help. */
  readonly flag: string;
  readonly file: string;
  /** SHA-256 of the text the entries in use came from. */
  readonly digest: string;
  /** Reads and checks the file; rejects with the list of its mistakes (config/clients-config.ts). */
  read(): Promise<ClientEntry[]>;
}

/** The watch, and a reload asked for by another process (the primary of workers passes its SIGHUP on this way). */
export interface ClientsFileWatch extends TenantsWatch {
  /** Reads the file again now; resolves once that read is applied or refused. */
  reload(why: string): Promise<void>;
}

export function watchClientsFile(
  source: ClientsFileSource,
  apply: (entries: readonly ClientEntry[]) => void,
  registry: Registry,
  log: Logger,
): ClientsFileWatch {
  const reloads = new Counter({
    name: 'kanal_frontend_clients_config_reloads_total',
    help: `Reloads of ${source.flag} by result: applied, or invalid (refused whole; the running list stays)`,
    labelNames: ['result'],
    registers: [registry],
  });
  // One reload at a time; a change during one is read by the next.
  let running: Promise<void> = Promise.resolve();
  const reload = (): Promise<void> => {
    running = running.then(async () => {
      try {
        const entries = await source.read();
        apply(entries);
        reloads.inc({ result: 'applied' });
        log.info({ file: source.file, clients: entries.map((e) => e.name) }, 'frontend clients reloaded');
      } catch (err) {
        reloads.inc({ result: 'invalid' });
        log.error({ file: source.file, err: errorMessage(err) }, 'frontend clients file refused: the running list stays as it is');
      }
    });
    return running;
  };
  const watch = reloadOnChangeOrHangup({ file: source.file, digest: source.digest }, () => void reload(), log, 'the frontend clients file');
  return {
    close: () => watch.close(),
    reload: (why) => {
      log.info({ file: source.file, why }, 'reloading the frontend clients file');
      return reload();
    },
  };
}
