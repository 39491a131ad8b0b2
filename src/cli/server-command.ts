/** `kanal server`: flags (upstream names where the meaning matches), validation, start. */
import os from 'node:os';
import { randomUUID } from 'node:crypto';
import type { Argv, InferredOptionTypes } from 'yargs';
import type { LevelWithSilent } from 'pino';
import { createLogger, LOG_LEVELS } from '../common/logger.js';
import { parseHostPort } from '../common/host-port.js';
import { KanalServer, type ServerOptions } from '../server/server.js';
import type { FrontendMode, TlsFiles } from '../server/listeners.js';
import { parseEku, parseSubjectPattern, type RolePins } from '../server/client-roles.js';
import { DEFAULT_AGENT_KEEPALIVE } from '../server/server.js';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../transport/liveness.js';
import { connectionWindowFlag, countFlag, durationFlag as duration, maxConnectionWindowOption, peerReadTimeoutOption, portFlag as port } from './flag-values.js';
import { DEFAULT_CP_TO_NODE_CONNECTIONS, DEFAULT_LIMITS, DEFAULT_NODE_TO_CP_CONNECTIONS } from '../tunnel/limits.js';
import { defaultNodeToCpConnections } from '../common/open-files-limit.js';
import { fileModeFlag, groupFlag } from './unix-socket-flags.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { UsageError } from './usage-error.js';
import { lastValueWins } from './last-value-wins.js';
import { runUntilSignalled } from './lifecycle.js';
import { selectTransport, TRANSPORT_NAMES } from './transport-choice.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { parseProxyStrategies, PROXY_STRATEGIES, type ProxyStrategy } from '../server/routing/proxy-strategies.js';
import { klogFlags, logLevelFrom, serverIgnoredFlags, upstreamNotices } from './upstream-flags.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpListener } from '../common/http-listener.js';
import { tlsPolicyFlags, type TlsPolicy } from './tls-flags.js';
import { kubeApiContentTypeOption, kubeClientConfig, kubeconfigOption, leaseLabelsFlag, leaseNamespaceOption } from './kube-flags.js';
import { kubeClients, type KubeClientConfig } from '../kube/kube-clients.js';
import { DEFAULT_LEASE_LABEL, serverLeaseName } from '../kube/lease.js';
import type { Labels } from '../kube/labels.js';
import type { KubeApi } from '../kube/kube-api.js';

export const serverFlags = {
  'server-id': { type: 'string', describe: 'Unique ID of this server, sent to agents (default: $PROXY_SERVER_ID, else host name + random suffix)' },
  'server-count': { type: 'number', default: 1, describe: 'Number of proxy servers behind the agent address (HA); agents keep a tunnel to each' },
  'agent-port': { type: 'number', default: 8091, describe: 'Port agents connect to (mTLS gRPC)' },
  'agent-bind-address': { type: 'string', default: '0.0.0.0', describe: 'Address the agent port listens on' },
  'cluster-cert': { type: 'string', describe: 'Certificate the agent port presents (default: --server-cert)' },
  'cluster-key': { type: 'string', describe: 'Key for --cluster-cert (default: --server-key)' },
  'cluster-ca-cert': { type: 'string', describe: 'CA that signs agent client certificates; agents without a valid one are refused (with token authentication: required as well)' },
  'allow-unauthenticated-agents': { type: 'boolean', default: false, describe: 'Accept agents without a valid client certificate (insecure; upstream default); they are told apart by peer address' },
  'agent-namespace': { type: 'string', describe: 'Token authentication: namespace of the agents\' service account (with --agent-service-account, --authentication-audience)' },
  'agent-service-account': { type: 'string', describe: 'Token authentication: the agents\' service account; every agent stream needs its token (see docs/kubernetes-api.md)' },
  'authentication-audience': { type: 'string', describe: 'Token authentication: audience the agents\' tokens must be for, e.g. system:konnectivity-server' },
  kubeconfig: kubeconfigOption,
  'kubeconfig-qps': { type: 'number', default: 0, describe: 'Requests per second to the Kubernetes API, per client (0: client-go\'s 5; negative: no limit)' },
  'kubeconfig-burst': { type: 'number', default: 0, describe: 'Burst of requests to the Kubernetes API, per client (0: client-go\'s 10)' },
  'kube-api-content-type': kubeApiContentTypeOption,
  'enable-lease-controller': { type: 'boolean', default: false, describe: 'Publish this server\'s Lease (renewed every 15s, 30s long) and delete expired ones, so agents can count servers' },
  'lease-namespace': leaseNamespaceOption,
  'lease-label': { type: 'string', default: DEFAULT_LEASE_LABEL, describe: 'Labels of the server Leases (k=v,k2=v2)' },
  'max-agents-per-credential': { type: 'number', default: 1, describe: 'Agents (distinct agentIDs) one credential may hold on this server; raise it only for a credential shared by several agents (see docs/trust-model.md)' },
  'agent-client-subject': { type: 'string', array: true, default: [] as string[], describe: 'Agent client certificates must have this subject attribute, e.g. O=system:nodes or CN=node-* (repeatable; needed when agents and the frontend trust one CA)' },
  'agent-client-eku': { type: 'string', array: true, default: [] as string[], describe: 'Agent client certificates must carry this extended key usage OID (repeatable; alternative to --agent-client-subject)' },
  'frontend-client-subject': { type: 'string', array: true, default: [] as string[], describe: 'The frontend client certificate (the kube-apiserver) must have this subject attribute, e.g. CN=kube-apiserver (repeatable)' },
  'frontend-client-eku': { type: 'string', array: true, default: [] as string[], describe: 'The frontend client certificate must carry this extended key usage OID (repeatable)' },
  'keepalive-time': { type: 'string', default: `${DEFAULT_AGENT_KEEPALIVE.intervalMs / 1000}s`, describe: 'How often the server PINGs each agent connection; an agent that does not answer within 2s is avoided for dials' },
  'keepalive-timeout': { type: 'string', default: `${DEFAULT_AGENT_KEEPALIVE.timeoutMs / 1000}s`, describe: 'An agent connection whose PING stays unanswered this long is closed' },
  mode: { type: 'string', choices: ['both', 'grpc', 'http-connect'], default: 'both', describe: 'Frontend protocol(s) for the kube-apiserver; "both" tells them apart per connection' },
  'uds-name': { type: 'string', describe: 'Serve the frontend on this Unix socket instead of TCP' },
  // Upstream's default (true): its manifests rely on it across restarts; Kanal removes only a stale socket (#14).
  'delete-existing-uds-file': { type: 'boolean', default: true, describe: 'Remove a stale socket at --uds-name before listening (never a file of another kind, nor a socket a live process serves)' },
  'uds-mode': { type: 'string', default: '0660', describe: 'Permission bits of the --uds-name socket, set before anyone can reach it (the umask does not apply)' },
  'uds-group': { type: 'string', describe: 'Group (name or ID) of the --uds-name socket (default: the server\'s group)' },
  'frontend-header-timeout': { type: 'string', default: '30s', describe: 'Time a frontend client has from connecting to the end of its request head (CONNECT headers, or the HTTP/2 preface); then 408 and closed' },
  'server-port': { type: 'number', default: 8090, describe: 'Frontend TCP port (mTLS); ignored with --uds-name' },
  'server-bind-address': { type: 'string', default: '0.0.0.0', describe: 'Address the frontend TCP port listens on' },
  'server-cert': { type: 'string', describe: 'Frontend TLS certificate' },
  'server-key': { type: 'string', describe: 'Frontend TLS key' },
  'server-ca-cert': { type: 'string', describe: 'CA for kube-apiserver client certificates on the frontend (mTLS)' },
  'proxy-strategies': { type: 'string', default: 'default', describe: `Ordered, comma-separated ways to pick an agent for a dial: ${PROXY_STRATEGIES.join(', ')} (see docs/routing.md)` },
  'tls-min-version': { type: 'string', default: '', describe: 'Oldest TLS version the agent port and TCP frontend accept: VersionTLS12 (default) or VersionTLS13' },
  'cipher-suites': { type: 'string', array: true, default: [] as string[], describe: 'TLS 1.2 cipher suites allowed, Go names, comma-separated (default: Node\'s list); no effect on TLS 1.3' },
  'backend-dial-timeout': { type: 'string', default: '10s', describe: 'How long a dial through an agent may take (then HTTP 504); 0 (upstream: no timeout) keeps 10s' },
  'allowed-destination': { type: 'string', array: true, default: [] as string[], describe: 'host:port agents may reach through this server (repeatable; none = deny all)' },
  'destination-dial-timeout': { type: 'string', default: '10s', describe: 'Timeout for dials to allowed destinations' },
  'health-port': { type: 'number', default: 8092, describe: 'Port for /healthz, /readyz and /metrics (0 disables)' },
  'health-bind-address': { type: 'string', default: '0.0.0.0', describe: 'Address the health port listens on' },
  'admin-port': { type: 'number', default: 8095, describe: 'Port for /metrics and, with --enable-profiling, profiles (0 disables)' },
  'admin-bind-address': { type: 'string', default: '127.0.0.1', describe: 'Address the admin port listens on' },
  'enable-profiling': { type: 'boolean', default: false, describe: 'Serve CPU profiles and heap snapshots on the admin port (see docs/upstream-flags.md)' },
  'max-message-size': { type: 'number', default: 4 * 1024 * 1024, describe: 'Largest gRPC message accepted, bytes' },
  'max-connection-window': maxConnectionWindowOption,
  'max-node-to-cp-connections-per-agent': { type: 'number', default: DEFAULT_NODE_TO_CP_CONNECTIONS, describe: 'Node -> control plane connections one agent tunnel may hold (dialling or open); more are refused' },
  'max-node-to-cp-connections': { type: 'number', default: 0, describe: 'Node -> control plane connections of all agents together (each holds a file descriptor); 0 = half the open-files limit' },
  'max-cp-to-node-connections-per-agent': { type: 'number', default: DEFAULT_CP_TO_NODE_CONNECTIONS, describe: 'Control plane -> node connections through one agent tunnel (dialling or open); more fail with 503' },
  'max-pending-dials-per-agent': { type: 'number', default: DEFAULT_LIMITS.maxPendingDials, describe: 'Dials waiting for an answer on one agent tunnel, in each direction; more are refused' },
  'peer-read-timeout': peerReadTimeoutOption,
  transport: { type: 'string', choices: TRANSPORT_NAMES, default: TRANSPORT_NAMES[0], describe: 'gRPC implementation' },
  'log-level': { type: 'string', choices: LOG_LEVELS, describe: 'Log level (JSON logs on stdout; default: from --v, else info)' },
  'dry-run': { type: 'boolean', default: false, describe: 'Validate flags, print the configuration as JSON and exit' },
  ...klogFlags,
  ...serverIgnoredFlags,
} as const;

export type ServerArgs = InferredOptionTypes<typeof serverFlags>;

/** Flag values after validation, before any file is read. */
export interface ServerConfig {
  serverID: string;
  serverCount: number;
  /** certFlag/keyFlag: the flags certFile/keyFile came from (--server-cert/--server-key stand in for the --cluster-* pair). */
  agent: {
    host: string;
    port: number;
    certFile: string;
    keyFile: string;
    certFlag: string;
    keyFlag: string;
    caFile?: string;
    allowUnauthenticated: boolean;
    clientPins: RolePins;
    maxAgentsPerCredential: number;
    keepalive: { intervalMs: number; timeoutMs: number };
    /** Service account token authentication (all three flags given). */
    tokens?: { namespace: string; serviceAccount: string; audience: string };
  };
  /** Set when token authentication or the lease controller uses the API. */
  kube?: KubeClientConfig;
  /** `--enable-lease-controller`. */
  leases?: { namespace: string; labels: Labels };
  frontend: {
    mode: FrontendMode;
    headerTimeoutMs: number;
    uds?: { path: string; deleteExisting: boolean; mode: number; gid?: number };
    tcp?: { host: string; port: number; certFile: string; keyFile: string; caFile?: string; clientPins: RolePins };
  };
  health?: { host: string; port: number };
  tls: TlsPolicy;
  admin?: { host: string; port: number; profiling: boolean };
  backendDialTimeoutMs: number;
  proxyStrategies: ProxyStrategy[];
  allowedDestinations: string[];
  destinationDialTimeoutMs: number;
  maxReceiveMessageBytes: number;
  maxConnectionWindowBytes: number;
  perAgent: { maxNodeToCpConnections: number; maxCpToNodeConnections: number; maxPendingDials: number };
  maxNodeToCpConnections: number;
  peerReadTimeoutMs: number;
  transport: string;
  logLevel: LevelWithSilent;
  /** Upstream flags given that Kanal ignores, one line each (logged at start). */
  notices: string[];
}

function rolePins(subjectFlag: string, subjects: string[], ekuFlag: string, ekus: string[]): RolePins {
  const parse = <T>(flag: string, f: (v: string) => T) => (v: string): T => {
    try {
      return f(v);
    } catch (err) {
      throw new UsageError(`--${flag} ${(err as Error).message}`);
    }
  };
  return { subjects: subjects.map(parse(subjectFlag, parseSubjectPattern)), ekus: ekus.map(parse(ekuFlag, parseEku)) };
}

export function validateServerArgs(a: ServerArgs): ServerConfig {
  const certFile = a['cluster-cert'] ?? a['server-cert'];
  const keyFile = a['cluster-key'] ?? a['server-key'];
  if (!certFile || !keyFile) throw new UsageError('the agent port needs a certificate: pass --cluster-cert and --cluster-key (or --server-cert and --server-key)');
  const tokens = tokenAuthFlags(a);
  if (tokens && a['allow-unauthenticated-agents']) {
    throw new UsageError('--allow-unauthenticated-agents contradicts token authentication (--agent-namespace, --agent-service-account, --authentication-audience): every agent needs a token');
  }
  if (!a['cluster-ca-cert'] && !tokens && !a['allow-unauthenticated-agents']) {
    throw new UsageError(
      '--cluster-ca-cert is required to authenticate agents by client certificate (or --agent-namespace, --agent-service-account and --authentication-audience to authenticate them by service account token, or --allow-unauthenticated-agents to accept any agent, which is insecure)',
    );
  }
  const serverCount = a['server-count'];
  if (!Number.isInteger(serverCount) || serverCount < 1) throw new UsageError(`--server-count must be a positive integer, got ${serverCount}`);
  const maxAgentsPerCredential = countFlag('max-agents-per-credential', a['max-agents-per-credential']);
  const keepalive = { intervalMs: duration('keepalive-time', a['keepalive-time']), timeoutMs: duration('keepalive-timeout', a['keepalive-timeout']) };
  if (keepalive.intervalMs < MIN_KEEPALIVE_INTERVAL_MS) throw new UsageError(`--keepalive-time must be at least ${MIN_KEEPALIVE_INTERVAL_MS / 1000}s`);
  const frontendPins = rolePins('frontend-client-subject', a['frontend-client-subject'], 'frontend-client-eku', a['frontend-client-eku']);
  const frontend: ServerConfig['frontend'] = { mode: a.mode as FrontendMode, headerTimeoutMs: duration('frontend-header-timeout', a['frontend-header-timeout']) };
  if (a['uds-name']) {
    frontend.uds = {
      path: a['uds-name'],
      deleteExisting: a['delete-existing-uds-file'],
      mode: fileModeFlag('uds-mode', a['uds-mode']),
      ...(a['uds-group'] === undefined ? {} : { gid: groupFlag('uds-group', a['uds-group']) }),
    };
  } else {
    if (!a['server-cert'] || !a['server-key']) throw new UsageError('the frontend needs --uds-name, or --server-cert and --server-key for mTLS TCP');
    if (!a['server-ca-cert']) throw new UsageError('--server-ca-cert is required for the TCP frontend so only the kube-apiserver can use it');
    frontend.tcp = {
      host: a['server-bind-address'],
      port: port('server-port', a['server-port'], true),
      certFile: a['server-cert'],
      keyFile: a['server-key'],
      caFile: a['server-ca-cert'],
      clientPins: frontendPins,
    };
  }
  const allowedDestinations = a['allowed-destination'].map((d) => {
    try {
      parseHostPort(d);
      return d;
    } catch (err) {
      throw new UsageError(`--allowed-destination: ${(err as Error).message}`);
    }
  });
  const healthPort = port('health-port', a['health-port'], true);
  const adminPort = port('admin-port', a['admin-port'], true);
  const notices = upstreamNotices(a, serverFlags);
  let backendDialTimeout = a['backend-dial-timeout'];
  if (/^0+(\.0*)?[a-z]*$/.test(backendDialTimeout)) {
    // Upstream's 0 waits for ever; every wait in Kanal is bounded.
    notices.push(`--backend-dial-timeout ${backendDialTimeout}: upstream's "no timeout" is not offered; using ${serverFlags['backend-dial-timeout'].default}`);
    backendDialTimeout = serverFlags['backend-dial-timeout'].default;
  }
  const serverID = a['server-id'] || process.env.PROXY_SERVER_ID || `${os.hostname()}-${randomUUID().slice(0, 8)}`;
  const leases = a['enable-lease-controller'] ? { namespace: a['lease-namespace'], labels: leaseLabelsFlag(a['lease-label']) } : undefined;
  if (leases) {
    try {
      serverLeaseName(serverID);
    } catch (err) {
      throw new UsageError(`--enable-lease-controller: ${(err as Error).message}`);
    }
  }
  const kube = tokens || leases ? kubeClientConfig(a) : undefined;
  const maxMessage = a['max-message-size'];
  if (!Number.isInteger(maxMessage) || maxMessage < 64 * 1024) throw new UsageError('--max-message-size must be at least 65536 bytes');
  return {
    serverID,
    serverCount,
    agent: {
      host: a['agent-bind-address'],
      port: port('agent-port', a['agent-port'], true),
      certFile,
      keyFile,
      certFlag: a['cluster-cert'] ? 'cluster-cert' : 'server-cert',
      keyFlag: a['cluster-key'] ? 'cluster-key' : 'server-key',
      caFile: a['cluster-ca-cert'],
      allowUnauthenticated: a['allow-unauthenticated-agents'],
      clientPins: rolePins('agent-client-subject', a['agent-client-subject'], 'agent-client-eku', a['agent-client-eku']),
      maxAgentsPerCredential,
      keepalive,
      ...(tokens ? { tokens } : {}),
    },
    ...(kube ? { kube } : {}),
    ...(leases ? { leases } : {}),
    frontend,
    health: healthPort > 0 ? { host: a['health-bind-address'], port: healthPort } : undefined,
    tls: tlsPolicyFlags(a['tls-min-version'], a['cipher-suites']),
    admin: adminPort > 0 ? { host: a['admin-bind-address'], port: adminPort, profiling: a['enable-profiling'] } : undefined,
    backendDialTimeoutMs: duration('backend-dial-timeout', backendDialTimeout),
    proxyStrategies: proxyStrategiesFlag(a['proxy-strategies']),
    allowedDestinations,
    destinationDialTimeoutMs: duration('destination-dial-timeout', a['destination-dial-timeout']),
    maxReceiveMessageBytes: maxMessage,
    maxConnectionWindowBytes: connectionWindowFlag('max-connection-window', a['max-connection-window']),
    perAgent: {
      maxNodeToCpConnections: countFlag('max-node-to-cp-connections-per-agent', a['max-node-to-cp-connections-per-agent']),
      maxCpToNodeConnections: countFlag('max-cp-to-node-connections-per-agent', a['max-cp-to-node-connections-per-agent']),
      maxPendingDials: countFlag('max-pending-dials-per-agent', a['max-pending-dials-per-agent']),
    },
    maxNodeToCpConnections: countFlag('max-node-to-cp-connections', a['max-node-to-cp-connections'], 0) || defaultNodeToCpConnections(),
    peerReadTimeoutMs: duration('peer-read-timeout', a['peer-read-timeout']),
    transport: a.transport,
    logLevel: logLevelFrom(a['log-level'], a.v),
    notices,
  };
}

function proxyStrategiesFlag(text: string): ProxyStrategy[] {
  try {
    return parseProxyStrategies(text);
  } catch (err) {
    throw new UsageError(`--proxy-strategies: ${(err as Error).message}`);
  }
}

/** `--agent-namespace`, `--agent-service-account`, `--authentication-audience`: all three or none (upstream). */
function tokenAuthFlags(a: ServerArgs): ServerConfig['agent']['tokens'] {
  const [namespace, serviceAccount, audience] = [a['agent-namespace'], a['agent-service-account'], a['authentication-audience']];
  if (!namespace && !serviceAccount && !audience) return undefined;
  if (!namespace || !serviceAccount || !audience) {
    const missing = [['--agent-namespace', namespace], ['--agent-service-account', serviceAccount], ['--authentication-audience', audience]].filter(([, v]) => !v).map(([f]) => f);
    throw new UsageError(`token authentication needs --agent-namespace, --agent-service-account and --authentication-audience together; missing ${missing.join(', ')}`);
  }
  for (const [flag, value] of Object.entries({ '--agent-namespace': namespace, '--agent-service-account': serviceAccount })) {
    if (value.includes(':')) throw new UsageError(`${flag} ${JSON.stringify(value)} must not contain ':'`);
  }
  return { namespace, serviceAccount, audience };
}

export interface ServerCredentials {
  agent: TlsFiles;
  frontend?: TlsFiles;
  /** Certificates outside their validity period: logged, not fatal (see credential-files.ts). */
  warnings: string[];
}

/** One listener's serving pair and client CA, each checked (a missing piece is recorded in `check`). */
function loadListenerTls(check: CredentialCheck, names: [cert: string, key: string, ca: string], files: { certFile: string; keyFile: string; caFile?: string }, policy: TlsPolicy): TlsFiles | undefined {
  const pair = check.keyPair({ flag: names[0], path: files.certFile }, { flag: names[1], path: files.keyFile }, 'server');
  const ca = files.caFile ? check.certificates({ flag: names[2], path: files.caFile }) : undefined;
  return pair && { cert: pair.cert.pem, key: pair.key.pem, ca: ca?.pem, ...policy };
}

/** Reads and checks every credential file the flags name; throws CredentialFilesError listing each problem. */
export function loadServerCredentials(config: ServerConfig): ServerCredentials {
  const check = new CredentialCheck();
  const agent = loadListenerTls(check, [config.agent.certFlag, config.agent.keyFlag, 'cluster-ca-cert'], config.agent, config.tls);
  const tcp = config.frontend.tcp;
  const frontend = tcp ? loadListenerTls(check, ['server-cert', 'server-key', 'server-ca-cert'], tcp, config.tls) : undefined;
  check.done();
  return { agent: agent!, frontend, warnings: check.warnings };
}

export async function buildServerOptions(config: ServerConfig, credentials: ServerCredentials = loadServerCredentials(config)): Promise<ServerOptions> {
  const log = createLogger(config.logLevel, 'server');
  return {
    serverID: config.serverID,
    serverCount: config.serverCount,
    agent: {
      host: config.agent.host,
      port: config.agent.port,
      tls: credentials.agent,
      allowUnauthenticated: config.agent.allowUnauthenticated,
      clientPins: config.agent.clientPins,
      maxAgentsPerCredential: config.agent.maxAgentsPerCredential,
      keepalive: config.agent.keepalive,
    },
    frontend: {
      mode: config.frontend.mode,
      headerTimeoutMs: config.frontend.headerTimeoutMs,
      uds: config.frontend.uds,
      tcp: config.frontend.tcp && credentials.frontend && {
        host: config.frontend.tcp.host,
        port: config.frontend.tcp.port,
        tls: credentials.frontend,
        clientPins: config.frontend.tcp.clientPins,
      },
    },
    health: config.health,
    backendDialTimeoutMs: config.backendDialTimeoutMs,
    proxyStrategies: config.proxyStrategies,
    allowedDestinations: config.allowedDestinations,
    destinationDialTimeoutMs: config.destinationDialTimeoutMs,
    maxReceiveMessageBytes: config.maxReceiveMessageBytes,
    limits: { maxWindowBytes: config.maxConnectionWindowBytes, peerReadTimeoutMs: config.peerReadTimeoutMs },
    agentLimits: {
      maxInboundConnections: config.perAgent.maxNodeToCpConnections,
      maxOutboundConnections: config.perAgent.maxCpToNodeConnections,
      maxPendingDials: config.perAgent.maxPendingDials,
    },
    maxNodeToCpConnections: config.maxNodeToCpConnections,
    transport: await selectTransport(config.transport),
    log,
  };
}

export function serverBuilder(y: Argv): Argv<ServerArgs> {
  return y.options(serverFlags).middleware(lastValueWins(serverFlags), true).example('$0 server --uds-name /etc/kanal/konnectivity.sock --cluster-cert agent-port.crt --cluster-key agent-port.key --cluster-ca-cert ca.crt', 'Frontend on a Unix socket, agents with mTLS');
}

export async function runServer(args: ServerArgs): Promise<void> {
  const config = validateServerArgs(args);
  if (args['dry-run']) {
    dryRun(config, () => loadServerCredentials(config));
    return;
  }
  // Before anything else: a bad file is a permanent mistake, not worth a retry (#12 finding 4).
  const credentials = loadServerCredentials(config);
  const options = await buildServerOptions(config, credentials);
  for (const w of credentials.warnings) options.log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) options.log.warn(notice);
  if (args.kubeconfig && !config.kube) options.log.warn('--kubeconfig is not used: neither token authentication nor --enable-lease-controller is on');
  const apiClients = await useKubernetesApi(config, options);
  enableGcPacing();
  const server = new KanalServer(options);
  let admin: HttpListener | undefined;
  try {
    await server.start();
    if (config.admin) admin = await startAdminPort({ ...config.admin, registry: server.metrics.registry, log: options.log }, '--admin-bind-address, --admin-port');
  } catch (err) {
    for (const c of apiClients) c.close();
    options.log.fatal({ err: (err as Error).message }, 'cannot start; released everything started so far');
    throw err;
  }
  // systemd (Type=notify): every listener is bound now.
  const notifier = new SystemdNotifier((reason) => options.log.warn({ reason }, 'cannot notify systemd'));
  notifier.ready(`serving agents on port ${server.agentPort}`);
  runUntilSignalled(options.log, async () => {
    notifier.stopping();
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
    const { TokenAuthenticator } = await import('../server/token-authenticator.js');
    options.agent.tokens = new TokenAuthenticator({ api: client(), ...tokens });
  }
  if (leases) {
    const { ServerLeaseController } = await import('../server/lease-controller.js');
    options.leases = new ServerLeaseController({ api: client(), serverId: config.serverID, namespace: leases.namespace, labels: leases.labels, log: options.log.child({ part: 'lease' }) });
  }
  return clients;
}
