/** `kanal server`: its settings (src/server/config/settings.ts) on the command line, validation, start. */
import { runtimeWarning } from './runtime.js';
import type { Argv } from 'yargs';
import { KanalServer } from '../server/server.js';
import type { TlsFiles } from '../server/listeners.js';
import { serverConfig, type ServerConfig } from '../server/config/config.js';
import { FLAG, serverSettings, type ServerGiven } from '../server/config/settings.js';
import { flagsOf, keyOf } from '../settings/flag-names.js';
import type { TlsPolicy } from '../server/config/tls-flags.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { serverStartChecks } from './start-checks.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import { withSettings } from './with-settings.js';
import { withExamples } from './help-examples.js';
import { readSettings, upstreamNotices } from '../settings/table.js';
import { runUntilSignalled } from './lifecycle.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { startAdminPort } from '../common/admin-server.js';
import { parseStatusQuery } from '../domain/status-query.js';
import type { HttpListener } from '../common/http-listener.js';
import { errorMessage } from '../common/error-message.js';
import { tenantsServerConfig } from '../server/config/tenants-command-line.js';
import { buildInfo } from './build-info.js';
import { assembleServer, oneClusterClients, readTenantsAtStart, type ServerCredentials } from '../server/assembly/server-assembly.js';
import { workerOf } from '../server/workers/worker-env.js';
import { clusterWorkerSettings } from '../server/config/cluster-worker.js';
import { reloadOnChangeOrHangup } from '../server/tenants/tenants-watch.js';

export type { ServerCredentials } from '../server/assembly/server-assembly.js';

/** What yargs hands `kanal server`, typed by its settings. */
export type ServerArgs = ServerGiven;

/** The server's configuration from its command line: each setting parsed by its entry (src/server/config/settings.ts), then the checks that tie them together (src/server/config/config.ts). */
export function validateServerArgs(a: ServerArgs): ServerConfig {
  const v = readSettings(serverSettings, a);
  const notices = upstreamNotices(a, serverSettings);
  const file = v['tenants-config'];
  return file ? tenantsServerConfig(v, a, notices, file) : serverConfig(v, notices);
}

/** One listener's serving pair and client CA, each checked (a missing piece is recorded in `check`). */
function loadListenerTls(
  check: CredentialCheck,
  names: [cert: string, key: string, ca: string],
  files: { certFile: string; keyFile: string; caFile?: string },
  policy: TlsPolicy,
): TlsFiles | undefined {
  const pair = check.keyPair({ flag: names[0], path: files.certFile }, { flag: names[1], path: files.keyFile }, 'server');
  const ca = files.caFile ? check.certificates({ flag: names[2], path: files.caFile }) : undefined;
  return pair && { cert: pair.cert.pem, key: pair.key.pem, ca: ca?.pem, ...policy };
}

/** Reads and checks every credential file the flags name; throws CredentialFilesError listing each problem. */
export function loadServerCredentials(config: ServerConfig): ServerCredentials {
  const check = new CredentialCheck();
  const agentFiles = { ...config.agent, caFile: config.settings['cluster-ca-cert'] };
  const agent = loadListenerTls(
    check,
    [config.agent.certFlag, config.agent.keyFlag, keyOf(serverSettings, 'cluster-ca-cert')],
    agentFiles,
    config.tls,
  );
  const tcp = config.frontend.tcp;
  const frontend = tcp
    ? loadListenerTls(
        check,
        [keyOf(serverSettings, 'server-cert'), keyOf(serverSettings, 'server-key'), keyOf(serverSettings, 'server-ca-cert')],
        tcp,
        config.tls,
      )
    : undefined;
  check.done();
  return { agent: agent!, frontend, warnings: check.warnings };
}

/** `forHelp`: whether --help was asked for (withSettings). */
export function serverBuilder(y: Argv, forHelp = true): Argv<ServerArgs> {
  return withExamples(
    withSettings(y, serverSettings, forHelp),
    [
      {
        what: 'Frontend on a Unix socket, agents with mTLS',
        lines: [
          '$0 server --uds-name /etc/kanal/konnectivity.sock',
          '--cluster-cert agent-port.crt --cluster-key agent-port.key',
          '--cluster-ca-cert agent-ca.crt',
        ],
      },
      {
        what: 'Also let nodes reach the kube-apiserver (KEP-2025)',
        lines: ['$0 server ... --allowed-destination 10.0.0.10:6443'],
      },
      { what: 'Check the flags and files without starting', lines: ['$0 server ... --dry-run'] },
    ],
    forHelp,
  );
}

export async function runServer(args: ServerArgs): Promise<void> {
  const config = validateServerArgs(args);
  if (args['dry-run']) return serverDryRun(config);
  // Before anything else: a bad file is a permanent mistake, not worth a retry.
  const credentials = loadServerCredentials(config);
  // The same checks as --dry-run, before anything is bound.
  await serverStartChecks(config, credentials);
  // Read once for this process; its mistakes stop the start (exit 2) before anything is bound.
  const tenants = await readTenantsAtStart(config);
  // Only a server of several processes loads what runs them: a start of one process stays as small as it was.
  const many = tenants || config.workers ? await import('./server-tenants.js') : undefined;
  // A worker is the same command line started again by its primary, with its place in the environment.
  const worker = many ? workerOf() : undefined;
  if (many && !worker && (tenants ? (config.tenants?.workers ?? 1) > 1 : config.workers)) return many.runPrimary(config, tenants);
  // A worker of one cluster is a server of its own: its own ID, the server count multiplied.
  const own = worker && !tenants ? { ...config, settings: clusterWorkerSettings(config.settings, worker) } : config;
  const { options, clients } = await assembleServer(own, credentials, {
    ...(worker ? { worker } : {}),
    ...(tenants ? { tenants } : {}),
  });
  const log = options.log;
  for (const w of credentials.warnings) log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) log.warn(notice);
  const runtime = runtimeWarning(process.versions.node, 'server');
  if (runtime) log.warn(runtime);
  if (args.kubeconfig && !config.kube)
    log.warn(`--kubeconfig is not used: neither token authentication nor ${FLAG['enable-lease-controller']} is on`);
  enableGcPacing();
  const server = new KanalServer(options);
  if (many && worker) return many.runWorker(server, log);
  let admin: HttpListener | undefined;
  try {
    await server.start();
    if (config.admin)
      admin = await startAdminPort(
        {
          ...config.admin,
          registry: server.metricsSource,
          status: (query) => {
            const q = parseStatusQuery(query);
            return 'error' in q ? q : server.status(buildInfo(), q);
          },
          readiness: (query) => server.readiness(query),
          onRefusal: (reason) => server.metrics.refusals.inc({ reason }),
          hostFlag: FLAG['admin-bind-address'],
          log,
        },
        flagsOf(serverSettings, 'admin-bind-address', 'admin-port'),
      );
  } catch (err) {
    await server.stop();
    for (const c of clients) c.close();
    log.fatal({ err: errorMessage(err) }, 'cannot start; released everything started so far');
    throw err;
  }
  // systemd (Type=notify): every listener is bound now.
  const notifier = new SystemdNotifier((reason) => log.warn({ reason }, 'cannot notify systemd'));
  notifier.ready(`serving agents on port ${server.agentPort}`);
  const reclaimer = startMemoryReclaimer(server.metrics, log);
  const watch = tenants && reloadOnChangeOrHangup(tenants, () => void server.reloadTenants(), log);
  runUntilSignalled(log, async () => {
    watch?.close();
    notifier.stopping();
    reclaimer.stop();
    await Promise.all([admin?.close(), server.stop()]);
    for (const c of clients) c.close();
  });
}

/**
 * `--dry-run`: one JSON document (the configuration, with the entries of
 * --tenants-config as the file declares them), then the start's checks:
 * the command line's credential files, the files the tenants name, the rest.
 * A tenants file with mistakes of its own prints nothing but them.
 */
async function serverDryRun(config: ServerConfig): Promise<void> {
  const file = config.tenants?.file;
  const checked = file ? (await import('../server/config/tenants-file.js')).readTenantsFile(file) : undefined;
  // The file's own mistakes, with its unusable credential files among them, in one report (exit 2).
  if (checked && checked.mistakes.length > 0) await readTenantsAtStart(config);
  const entries = checked?.entries.flatMap(({ spec }) => (spec ? [{ name: spec.name, settings: spec.settings }] : []));
  const document = config.tenants && entries ? { ...config, tenants: { ...config.tenants, entries } } : config;
  await dryRun(document, async () => {
    const credentials = loadServerCredentials(config);
    // The files the tenants name, and --frontend-clients-config with its token files, read as a start reads them.
    await readTenantsAtStart(config);
    await oneClusterClients(config);
    await serverStartChecks(config, credentials);
    return credentials;
  });
}
