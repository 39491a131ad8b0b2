/** `kanal server`: its settings (src/server/config/settings.ts) on the command line, validation, start. */
import { runtimeWarning } from './runtime.js';
import type { Argv } from 'yargs';
import { createLogger } from '../common/logger.js';
import { KanalServer, type ServerOptions } from '../server/server.js';
import type { TlsFiles } from '../server/listeners.js';
import { serverConfig, type ServerConfig } from '../server/config/config.js';
import { serverSettings, type ServerGiven } from '../server/config/settings.js';
import type { TlsPolicy } from '../server/config/tls-flags.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import { withSettings } from './with-settings.js';
import { readSettings, upstreamNotices } from '../settings/table.js';
import { runUntilSignalled } from './lifecycle.js';
import { loadTransport } from '../transport/choice.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpListener } from '../common/http-listener.js';
import { kubeClients } from '../kube/kube-clients.js';
import type { KubeApi } from '../kube/kube-api.js';
import { errorMessage } from '../common/error-message.js';
import type { Logger } from 'pino';
import { tenantsServerConfig } from '../server/config/tenants-command-line.js';
import { loadTenants } from '../server/config/tenants-loader.js';
import type { TenantDefinition } from '../server/tenants/tenant-definition.js';
import type { TokenAuthenticator } from '../server/identity/token-authenticator.js';
import { watchTenantsFile } from '../server/tenants/tenants-watch.js';
import { checkForWorkers, startPrimary, workerOf } from './server-workers.js';
import { linkToPrimary } from '../server/workers/worker-link.js';

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
  const agent = loadListenerTls(check, [config.agent.certFlag, config.agent.keyFlag, 'cluster-ca-cert'], agentFiles, config.tls);
  const tcp = config.frontend.tcp;
  const frontend = tcp ? loadListenerTls(check, ['server-cert', 'server-key', 'server-ca-cert'], tcp, config.tls) : undefined;
  check.done();
  return { agent: agent!, frontend, warnings: check.warnings };
}

export async function buildServerOptions(
  config: ServerConfig,
  credentials: ServerCredentials = loadServerCredentials(config),
): Promise<ServerOptions> {
  const log = createLogger(config.logLevel, 'server');
  const v = config.settings;
  return {
    serverID: v['server-id'],
    serverCount: v['server-count'],
    agent: {
      host: v['agent-bind-address'],
      port: v['agent-port'],
      tls: credentials.agent,
      allowUnauthenticated: v['allow-unauthenticated-agents'],
      clientPins: config.agent.clientPins,
      maxAgentsPerCredential: v['max-agents-per-credential'],
      keepalive: { intervalMs: v['keepalive-time'], timeoutMs: v['keepalive-timeout'] },
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
    backendDialTimeoutMs: v['backend-dial-timeout'].ms,
    proxyStrategies: v['proxy-strategies'],
    allowedDestinations: v['allowed-destination'],
    destinationDialTimeoutMs: v['destination-dial-timeout'],
    maxReceiveMessageBytes: v['max-message-size'],
    limits: { maxWindowBytes: v['max-connection-window'], peerReadTimeoutMs: v['peer-read-timeout'] },
    agentLimits: {
      maxInboundConnections: v['max-node-to-cp-connections-per-agent'],
      maxOutboundConnections: v['max-cp-to-node-connections-per-agent'],
      maxPendingDials: v['max-pending-dials-per-agent'],
    },
    maxNodeToCpConnections: config.maxNodeToCpConnections,
    transport: await loadTransport(v.transport),
    log,
  };
}

/** `forHelp`: whether --help was asked for (withSettings). */
export function serverBuilder(y: Argv, forHelp = true): Argv<ServerArgs> {
  return withSettings(y, serverSettings, forHelp).example(
    '$0 server --uds-name /etc/kanal/konnectivity.sock --cluster-cert agent-port.crt --cluster-key agent-port.key --cluster-ca-cert ca.crt',
    'Frontend on a Unix socket, agents with mTLS',
  );
}

/** `--tenants-config`: the file's tenants, loaded (and checked against the command line's shared TCP frontend). */
function tenantsOf(config: ServerConfig): (() => TenantDefinition[]) | undefined {
  const file = config.tenants?.file;
  if (!file) return undefined;
  return () => loadTenants(file, { tcpFrontend: !!config.frontend.tcp });
}

export async function runServer(args: ServerArgs): Promise<void> {
  const config = validateServerArgs(args);
  const tenants = tenantsOf(config);
  if (args['dry-run']) {
    dryRun(config, () => {
      const credentials = loadServerCredentials(config);
      if (tenants) process.stdout.write(`${JSON.stringify({ tenants: tenants().map(({ credentials: _, ...t }) => t) }, null, 2)}\n`);
      return credentials;
    });
    return;
  }
  // Before anything else: a bad file is a permanent mistake, not worth a retry.
  const credentials = loadServerCredentials(config);
  const worker = workerOf();
  if (tenants && (config.tenants?.workers ?? 1) > 1 && !worker) return runPrimary(config, tenants);
  const options = await buildServerOptions(config, credentials);
  if (worker) {
    options.worker = worker;
    options.health = undefined;
    options.log = options.log.child({ worker: worker.index });
  }
  for (const w of credentials.warnings) options.log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) options.log.warn(notice);
  const runtime = runtimeWarning(process.versions.node, 'server');
  if (runtime) options.log.warn(runtime);
  if (args.kubeconfig && !config.kube)
    options.log.warn('--kubeconfig is not used: neither token authentication nor --enable-lease-controller is on');
  const apiClients = await useKubernetesApi(config, options);
  if (tenants) {
    // Read now, so a file with mistakes stops the start (exit 2) before anything is bound.
    const first = tenants();
    let pending: TenantDefinition[] | undefined = worker ? checkForWorkers(first, config.tenants?.file ?? '') : first;
    options.tenants = {
      load: () => {
        const list = pending ?? tenants();
        pending = undefined;
        return list;
      },
      policy: config.tls,
      tokenReview: (tenant) => tenantTokenReview(tenant, options.log.child({ tenant: tenant.name, part: 'kube' })),
    };
  }
  enableGcPacing();
  const server = new KanalServer(options);
  if (worker) server.metrics.registry.setDefaultLabels({ worker: String(worker.index) });
  if (worker) return runWorker(server, options.log);
  let admin: HttpListener | undefined;
  try {
    await server.start();
    if (config.admin)
      admin = await startAdminPort(
        { ...config.admin, registry: server.metricsSource, log: options.log },
        '--admin-bind-address, --admin-port',
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
  const watch = config.tenants && reloadOnChange(server, config.tenants.file, options.log);
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

/** Reloads the tenants file when it changes and on SIGHUP (docs/multi-tenant.md, "Live changes"). */
function reloadOnChange(server: KanalServer, file: string, log: Logger): { close(): void } {
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

/** `--workers N`: the primary; the workers are this command again (server-workers.ts). */
async function runPrimary(config: ServerConfig, load: () => TenantDefinition[]): Promise<void> {
  const log = createLogger(config.logLevel, 'server').child({ worker: 'primary' });
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
async function runWorker(server: KanalServer, log: Logger): Promise<void> {
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
