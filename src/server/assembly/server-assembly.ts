/**
 * `kanal server`'s one assembly: from the validated configuration and the
 * credentials read for it to complete ServerOptions and the Kubernetes API
 * clients to close. The CLI, the in-process kit, the demo and the bench all
 * build a server here, so a test that starts one in process runs what users
 * run (token review, leases, the tenants file, a worker's share, the audit
 * log). Nothing edits the options after this.
 */
import path from 'node:path';
import type { Logger } from 'pino';
import { auditLogFileOptions } from '../../audit/settings.js';
import { createLogger } from '../../common/logger.js';
import type { ExtraFrontendListener, ServerOptions } from '../server-options.js';
import type { TlsFiles } from '../listeners.js';
import type { ServerConfig } from '../config/config.js';
import { loadTransport } from '../../transport/choice.js';
import { tenantOptionsOf } from '../config/tenant-options.js';
import { kubeClients } from '../../kube/kube-clients.js';
import type { KubeApi } from '../../kube/kube-api.js';
import type { TenantDefinition } from '../tenants/tenant-definition.js';
import type { TokenAuthenticator } from '../identity/token-authenticator.js';
import type { TenantsAtStart, TenantsReader } from '../tenants/tenants-at-start.js';
import type { LoadedTenants } from '../config/tenants-loader.js';
import type { PrimaryProcessOptions } from '../workers/primary-process.js';
import { spawnWorker, type WorkerPlace } from '../workers/worker-env.js';
import { FLAG, serverSettings } from '../config/settings.js';
import { flagsOf } from '../../settings/flag-names.js';
import type { ClientEntry } from '../clients/client-entry.js';
import type { ClientsFileSource } from '../tenants/clients-file-watch.js';
import { fileDigest } from '../tenants/tenants-watch.js';

/** The credential files' contents (src/cli/server-command.ts loadServerCredentials). */
export interface ServerCredentials {
  agent: TlsFiles;
  frontend?: TlsFiles;
  /** Certificates outside their validity period: logged, not fatal (see credential-files.ts). */
  warnings: string[];
}

/** What a caller sets that no flag can say; each is named so the few test-only differences stay visible. */
export interface ServerOverrides {
  /** Replaces the logger the configuration names (a test's captured one). */
  log?: Logger;
  /** Health port on this host with a port the kernel picks (the flag can only name a port, or 0 = off). */
  ephemeralHealthHost?: string;
  /** This process is worker `index` of several (workers/worker-env.ts; the CLI reads it from the environment). */
  worker?: WorkerPlace;
  /** The tenants file as read once for this process (readTenantsAtStart); read here when absent. */
  tenants?: TenantsAtStart;
}

export interface AssembledServer {
  readonly options: Readonly<ServerOptions>;
  /** Made for token review and the lease controller: closed once the server stopped, or its start failed. */
  readonly clients: readonly KubeApi[];
}

/** `audit.log` of worker 2: `audit.worker-2.log` (rotated as `audit.worker-2-<time>.log`). */
export function workerAuditPath(file: string, index: number): string {
  const ext = path.extname(file);
  return `${file.slice(0, file.length - ext.length)}.worker-${index}${ext}`;
}

/** The audit files `--workers N` writes instead of `file` (one per worker: processes sharing one would rotate it under each other). */
export function workerAuditPaths(file: string, workers: number): string[] {
  return Array.from({ length: workers }, (_, i) => workerAuditPath(file, i));
}

/** --audit-log-path and its rotation, when given. */
function withAuditLog(v: ServerConfig['settings']): Pick<ServerOptions, 'auditLog'> {
  const auditLog = auditLogFileOptions(v);
  return auditLog ? { auditLog } : {};
}

/**
 * --frontend-clients-config: its list, token files read (a mistake is a
 * UsageError listing every one), and how the running server reads it again.
 * Loaded only here, so a start without it never loads the YAML reader.
 */
export async function oneClusterClients(config: ServerConfig): Promise<{ entries: ClientEntry[]; source: ClientsFileSource } | undefined> {
  const file = config.settings['frontend-clients-config'];
  if (file === undefined) return undefined;
  const { readClientsFile } = await import('../config/clients-config.js');
  const read = (): Promise<ClientEntry[]> =>
    readClientsFile(FLAG['frontend-clients-config'], file, {
      tokenReview: config.agent.tokens !== undefined,
      tokenReviewHint: `token review: ${FLAG['agent-namespace']}, ${FLAG['agent-service-account']} and ${FLAG['authentication-audience']} (with ${FLAG.kubeconfig} or the in-cluster config)`,
    });
  // The digest before the read: a change in between is seen by the watch as a change.
  const digest = fileDigest(file) ?? '';
  return { entries: await read(), source: { flag: FLAG['frontend-clients-config'], file, digest, read } };
}

/** The options of the settings alone (no API client, no tenants file): what one cluster's flags say. */
export async function buildServerOptions(config: ServerConfig, credentials: ServerCredentials): Promise<ServerOptions> {
  const log = createLogger(config.logLevel, 'server', config.logFormat);
  const v = config.settings;
  const clients = await oneClusterClients(config);
  return {
    serverID: v['server-id'],
    flags: {
      tenantsConfig: FLAG['tenants-config'],
      maxNodeToCpConnections: FLAG['max-node-to-cp-connections'],
      health: flagsOf(serverSettings, 'health-bind-address', 'health-port'),
      healthMetrics: FLAG['health-metrics'],
    },
    tenant: tenantOptionsOf(v, undefined, clients?.entries),
    ...(clients ? { clientsFile: clients.source } : {}),
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
      extra: extraListeners(config),
    },
    health: config.health,
    maxReceiveMessageBytes: v['max-message-size'],
    memoryBudgetBytes: v['memory-budget'],
    maxNodeToCpConnections: config.maxNodeToCpConnections,
    transport: await loadTransport(v.transport),
    log,
  };
}

/**
 * `--tenants-config`: what reads the file. Loaded only here, so a start of
 * one cluster never loads the YAML reader.
 */
export async function tenantsReader(config: ServerConfig): Promise<TenantsReader | undefined> {
  const load = await tenantsLoader(config);
  return load && (() => load().tenants);
}

/** The tenants file's loader with the digest of what it read; undefined without --tenants-config. */
async function tenantsLoader(config: ServerConfig): Promise<(() => LoadedTenants) | undefined> {
  const file = config.tenants?.file;
  if (!file) return undefined;
  const { loadTenants } = await import('../config/tenants-loader.js');
  return () => loadTenants(file, { tcpFrontend: !!config.frontend.tcp });
}

/** Reads the file of `config` once (throws a TenantsFileError listing every problem); undefined without --tenants-config. */
export async function readTenantsAtStart(config: ServerConfig): Promise<TenantsAtStart | undefined> {
  const file = config.tenants?.file;
  const load = await tenantsLoader(config);
  if (!file || !load) return undefined;
  const { tenants, digest } = load();
  return { file, first: tenants, digest, read: () => load().tenants };
}

/**
 * The complete options of a KanalServer for `config`: the settings'
 * options, then what this process is (a worker's share, its own audit file,
 * no health port of its own), the Kubernetes API's parts, and the tenants.
 */
export async function assembleServer(
  config: ServerConfig,
  credentials: ServerCredentials,
  overrides: ServerOverrides = {},
): Promise<AssembledServer> {
  const base = await buildServerOptions(config, credentials);
  const worker = overrides.worker;
  const root = overrides.log ?? base.log;
  const log = worker ? root.child({ worker: worker.index }) : root;
  const health = worker
    ? undefined
    : overrides.ephemeralHealthHost !== undefined
      ? { ...base.health, host: overrides.ephemeralHealthHost, port: 0 }
      : base.health;
  // Each worker writes a file of its own: processes sharing one would rotate it under each other.
  const auditLog =
    worker && base.auditLog && base.auditLog.path !== '-'
      ? { ...base.auditLog, path: workerAuditPath(base.auditLog.path, worker.index) }
      : base.auditLog;
  const api = await kubernetesApi(config, log);
  try {
    const tenants = config.tenants ? (overrides.tenants ?? (await readTenantsAtStart(config))) : undefined;
    const options: ServerOptions = {
      ...base,
      ...(auditLog ? { auditLog } : {}),
      health,
      log,
      agent: { ...base.agent, ...(api.tokens ? { tokens: api.tokens } : {}) },
      ...(api.leases ? { leases: api.leases } : {}),
      ...(tenants ? { tenants: serverTenants(config, tenants, log) } : {}),
      ...(worker ? { worker } : {}),
    };
    return { options, clients: api.clients };
  } catch (err) {
    for (const c of api.clients) c.close();
    throw err;
  }
}

/**
 * Token authentication and the lease controller, each with a client of its
 * own (kube-clients.ts). A kubeconfig that cannot be used fails the start
 * here, naming the file.
 */
async function kubernetesApi(
  config: ServerConfig,
  log: Logger,
): Promise<{ clients: KubeApi[]; tokens?: TokenAuthenticator; leases?: ServerOptions['leases'] }> {
  const { kube, leases } = config;
  const tokens = config.agent.tokens;
  if (!kube) return { clients: [] };
  const newClient = await kubeClients(kube, log.child({ part: 'kube' }));
  const clients: KubeApi[] = [];
  const client = (): KubeApi => {
    const api = newClient();
    clients.push(api);
    return api;
  };
  const made: { clients: KubeApi[]; tokens?: TokenAuthenticator; leases?: ServerOptions['leases'] } = { clients };
  if (tokens) {
    const { TokenAuthenticator } = await import('../identity/token-authenticator.js');
    made.tokens = new TokenAuthenticator({ api: client(), ...tokens });
  }
  if (leases) {
    const { ServerLeaseController } = await import('../leases/lease-controller.js');
    made.leases = new ServerLeaseController({
      api: client(),
      serverId: config.settings['server-id'],
      namespace: leases.namespace,
      labels: leases.labels,
      log: log.child({ part: 'lease' }),
    });
  }
  return made;
}

/** What a server of tenants is given (ServerOptions.tenants): the first load (already read, so its mistakes stopped the start), later reloads, token review per tenant. */
function serverTenants(config: ServerConfig, tenants: TenantsAtStart, log: Logger): NonNullable<ServerOptions['tenants']> {
  let pending: readonly TenantDefinition[] | undefined = tenants.first;
  return {
    load: () => {
      const list = pending;
      pending = undefined;
      return list ? [...list] : tenants.read();
    },
    policy: config.tls,
    tokenReview: (tenant) => tenantTokenReview(tenant, log.child({ tenant: tenant.name, part: 'kube' })),
  };
}

/** Token review for one tenant, against its own kube-apiserver (its kubeconfig). */
async function tenantTokenReview(spec: TenantDefinition, log: Logger): Promise<{ authenticator: TokenAuthenticator; release: () => void }> {
  const tokens = spec.tokens;
  if (!tokens) throw new Error(`tenant ${spec.name} has no token review`);
  const newClient = await kubeClients(tokens.kube, log);
  const api = newClient();
  const { TokenAuthenticator } = await import('../identity/token-authenticator.js');
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

/**
 * The primary of `--workers N` (workers/primary-process.ts): its shared
 * ports and the workers' count, from the same configuration; `tenants`
 * absent: a server of one cluster.
 */
export function assemblePrimary(config: ServerConfig, tenants: TenantsAtStart | undefined, log: Logger): PrimaryProcessOptions {
  const workers = tenants ? config.tenants?.workers : config.workers;
  if (!workers) throw new Error(`no ${FLAG.workers} to start`);
  const v = config.settings;
  return {
    ...(tenants ? { tenants } : {}),
    workers,
    spawnWorker,
    agent: { host: v['agent-bind-address'], port: v['agent-port'] },
    ...(config.frontend.tcp ? { frontend: { host: config.frontend.tcp.host, port: config.frontend.tcp.port } } : {}),
    ...(!tenants && config.frontend.uds ? { uds: config.frontend.uds } : {}),
    ...(!tenants ? { extra: extraListeners(config) } : {}),
    ...(!tenants && v['frontend-clients-config'] !== undefined ? { clientsFile: v['frontend-clients-config'] } : {}),
    ...(config.health ? { health: config.health } : {}),
    maxPendingHellos: v['max-pending-client-hellos'],
    maxPendingHellosPerHost: v['max-pending-client-hellos-per-host'],
    flags: {
      agent: flagsOf(serverSettings, 'agent-bind-address', 'agent-port'),
      frontend: flagsOf(serverSettings, 'server-bind-address', 'server-port'),
      health: flagsOf(serverSettings, 'health-bind-address', 'health-port'),
      maxPendingHellos: FLAG['max-pending-client-hellos'],
      maxPendingHellosPerHost: FLAG['max-pending-client-hellos-per-host'],
    },
    log,
  };
}

/** One cluster's plain listeners beside the frontend, in the order a worker's primary hands their connections by (workers/primary.ts). */
function extraListeners(config: ServerConfig): ExtraFrontendListener[] {
  return [...httpProxyListener(config), ...(config.frontend.extra ?? [])];
}

/** --http-proxy-port: the HTTP door (forward proxy and CONNECT) on plain TCP, when on. */
function httpProxyListener(config: ServerConfig): ExtraFrontendListener[] {
  const p = config.frontend.httpProxy;
  return p
    ? [
        {
          mode: 'http-connect',
          flags: `${FLAG['http-proxy-bind-address']}, ${FLAG['http-proxy-port']}`,
          plain: { host: p.host, port: p.port },
        },
      ]
    : [];
}
