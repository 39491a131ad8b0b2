/** `kanal server`: its settings (src/server/config/settings.ts) on the command line, validation, start. */
import path from 'node:path';
import { auditLogFileOptions } from '../audit/settings.js';
import { runtimeWarning } from './runtime.js';
import type { Argv } from 'yargs';
import { createLogger } from '../common/logger.js';
import { KanalServer, type ServerOptions } from '../server/server.js';
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
import { loadTransport } from '../transport/choice.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { startAdminPort } from '../common/admin-server.js';
import { parseStatusQuery } from '../domain/status-query.js';
import type { HttpListener } from '../common/http-listener.js';
import { kubeClients } from '../kube/kube-clients.js';
import type { KubeApi } from '../kube/kube-api.js';
import { errorMessage } from '../common/error-message.js';
import { tenantsServerConfig } from '../server/config/tenants-command-line.js';
import { tenantOptionsOf } from '../server/config/tenant-options.js';
import { buildInfo } from './build-info.js';

/** What yargs hands `kanal server`, typed by its settings. */
export type ServerArgs = ServerGiven;

/** The server's configuration from its command line: each setting parsed by its entry (src/server/config/settings.ts), then the checks that tie them together (src/server/config/config.ts). */
export function validateServerArgs(a: ServerArgs): ServerConfig {
  const v = readSettings(serverSettings, a);
  const notices = upstreamNotices(a, serverSettings);
  const file = v['tenants-config'];
  return file ? tenantsServerConfig(v, a, notices, file) : serverConfig(v, notices);
}

export interface ServerCredentials {
  agent: TlsFiles;
  frontend?: TlsFiles;
  /** Certificates outside their validity period: logged, not fatal (see credential-files.ts). */
  warnings: string[];
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

/** `audit.log` of worker 2: `audit.worker-2.log` (rotated as `audit.worker-2-<time>.log`). */
export function workerAuditPath(file: string, index: number): string {
  const ext = path.extname(file);
  return `${file.slice(0, file.length - ext.length)}.worker-${index}${ext}`;
}

/** --audit-log-path and its rotation, when given. */
function withAuditLog(v: ServerConfig['settings']): Pick<ServerOptions, 'auditLog'> {
  const auditLog = auditLogFileOptions(v);
  return auditLog ? { auditLog } : {};
}

export async function buildServerOptions(
  config: ServerConfig,
  credentials: ServerCredentials = loadServerCredentials(config),
): Promise<ServerOptions> {
  const log = createLogger(config.logLevel, 'server', config.logFormat);
  const v = config.settings;
  return {
    serverID: v['server-id'],
    tenant: tenantOptionsOf(v),
    ...withAuditLog(v),
    agent: {
      host: v['agent-bind-address'],
      port: v['agent-port'],
      tls: credentials.agent,
      allowUnauthenticated: v['allow-unauthenticated-agents'],
      clientPins: config.agent.clientPins,
      keepalive: { intervalMs: v['keepalive-time'], timeoutMs: v['keepalive-timeout'] },
      resumeTimeoutMs: v['resume-timeout'],
    },
    frontend: {
      mode: v.mode,
      headerTimeoutMs: v['frontend-header-timeout'],
      uds: config.frontend.uds,
      tcp: config.frontend.tcp &&
        credentials.frontend && {
          host: config.frontend.tcp.host,
          port: config.frontend.tcp.port,
          tls: credentials.frontend,
          clientPins: config.frontend.tcp.clientPins,
        },
    },
    health: config.health,
    maxReceiveMessageBytes: v['max-message-size'],
    memoryBudgetBytes: v['memory-budget'],
    maxNodeToCpConnections: config.maxNodeToCpConnections,
    transport: await loadTransport(v.transport),
    log,
  };
}

/** `forHelp`: whether --help was asked for (withSettings). */
export function serverBuilder(y: Argv, forHelp = true): Argv<ServerArgs> {
  return withExamples(withSettings(y, serverSettings, forHelp), [
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
  ]);
}

export async function runServer(args: ServerArgs): Promise<void> {
  const config = validateServerArgs(args);
  // Only a server of many tenants loads what serves them (the YAML reader among it): a start of one cluster stays as small as it was.
  const many = config.tenants ? await import('./server-tenants.js') : undefined;
  const tenants = many?.tenantsOf(config);
  if (args['dry-run']) {
    await dryRun(config, async () => {
      const credentials = loadServerCredentials(config);
      const list = tenants?.();
      if (list) process.stdout.write(`${JSON.stringify({ tenants: list.map(({ credentials: _, ...t }) => t) }, null, 2)}\n`);
      await serverStartChecks(config, credentials);
      return credentials;
    });
    return;
  }
  // Before anything else: a bad file is a permanent mistake, not worth a retry.
  const credentials = loadServerCredentials(config);
  // The same checks as --dry-run, before anything is bound.
  await serverStartChecks(config, credentials);
  const worker = many?.workerOf();
  if (many && tenants && (config.tenants?.workers ?? 1) > 1 && !worker) return many.runPrimary(config, tenants);
  const options = await buildServerOptions(config, credentials);
  if (worker) {
    options.worker = worker;
    options.health = undefined;
    options.log = options.log.child({ worker: worker.index });
    // Each worker writes a file of its own: processes sharing one would rotate it under each other.
    if (options.auditLog && options.auditLog.path !== '-')
      options.auditLog = { ...options.auditLog, path: workerAuditPath(options.auditLog.path, worker.index) };
  }
  for (const w of credentials.warnings) options.log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) options.log.warn(notice);
  const runtime = runtimeWarning(process.versions.node, 'server');
  if (runtime) options.log.warn(runtime);
  if (args.kubeconfig && !config.kube)
    options.log.warn(`--kubeconfig is not used: neither token authentication nor ${FLAG['enable-lease-controller']} is on`);
  const apiClients = await useKubernetesApi(config, options);
  // Read now, so a file with mistakes stops the start (exit 2) before anything is bound.
  if (many && tenants) options.tenants = many.serverTenants(config, tenants, options.log);
  enableGcPacing();
  const server = new KanalServer(options);
  if (many && worker) {
    server.metrics.registry.setDefaultLabels({ worker: String(worker.index) });
    return many.runWorker(server, options.log);
  }
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
          log: options.log,
        },
        flagsOf(serverSettings, 'admin-bind-address', 'admin-port'),
      );
  } catch (err) {
    for (const c of apiClients) c.close();
    options.log.fatal({ err: errorMessage(err) }, 'cannot start; released everything started so far');
    throw err;
  }
  // systemd (Type=notify): every listener is bound now.
  const notifier = new SystemdNotifier((reason) => options.log.warn({ reason }, 'cannot notify systemd'));
  notifier.ready(`serving agents on port ${server.agentPort}`);
  const reclaimer = startMemoryReclaimer(server.metrics, options.log);
  const watch = many && config.tenants && many.reloadOnChange(server, config.tenants.file, options.log);
  runUntilSignalled(options.log, async () => {
    watch?.close();
    notifier.stopping();
    reclaimer.stop();
    await Promise.all([admin?.close(), server.stop()]);
    for (const c of apiClients) c.close();
  });
}

/**
 * Token authentication and the lease controller, each with a client of its
 * own (kube-clients.ts); returns the clients to close at the end. A kubeconfig
 * that cannot be used fails the start here, naming the file.
 */
async function useKubernetesApi(config: ServerConfig, options: ServerOptions): Promise<KubeApi[]> {
  const { kube, leases } = config;
  const tokens = config.agent.tokens;
  if (!kube) return [];
  const newClient = await kubeClients(kube, options.log.child({ part: 'kube' }));
  const clients: KubeApi[] = [];
  const client = (): KubeApi => {
    const api = newClient();
    clients.push(api);
    return api;
  };
  if (tokens) {
    const { TokenAuthenticator } = await import('../server/identity/token-authenticator.js');
    options.agent.tokens = new TokenAuthenticator({ api: client(), ...tokens });
  }
  if (leases) {
    const { ServerLeaseController } = await import('../server/leases/lease-controller.js');
    options.leases = new ServerLeaseController({
      api: client(),
      serverId: config.settings['server-id'],
      namespace: leases.namespace,
      labels: leases.labels,
      log: options.log.child({ part: 'lease' }),
    });
  }
  return clients;
}
