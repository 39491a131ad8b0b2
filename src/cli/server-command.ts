/** `kanal server`: flags (upstream names where the meaning matches), validation, start. */
import type { Argv, InferredOptionTypes } from 'yargs';
import { createLogger, LOG_LEVELS } from '../common/logger.js';
import { KanalServer, DEFAULT_AGENT_KEEPALIVE, type ServerOptions } from '../server/server.js';
import { FRONTEND_MODES, type TlsFiles } from '../server/listeners.js';
import { DEFAULT_BACKEND_DIAL_TIMEOUT, serverConfig, type ServerConfig } from '../server/config.js';
import type { TlsPolicy } from '../server/tls-flags.js';
import { maxConnectionWindowOption, peerReadTimeoutOption } from './shared-options.js';
import { DEFAULT_CP_TO_NODE_CONNECTIONS, DEFAULT_LIMITS, DEFAULT_NODE_TO_CP_CONNECTIONS } from '../tunnel/limits.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import { lastValueWins } from './last-value-wins.js';
import { runUntilSignalled } from './lifecycle.js';
import { loadTransport, TRANSPORT_NAMES } from '../transport/choice.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { PROXY_STRATEGIES } from '../server/routing/proxy-strategies.js';
import { klogFlags, serverIgnoredFlags, upstreamNotices } from './upstream-flags.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpListener } from '../common/http-listener.js';
import { kubeApiContentTypeOption, kubeconfigOption, leaseNamespaceOption } from './kube-flags.js';
import { kubeClients } from '../kube/kube-clients.js';
import { DEFAULT_LEASE_LABEL } from '../kube/lease.js';
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
  mode: { type: 'string', choices: FRONTEND_MODES, default: FRONTEND_MODES[0], describe: 'Frontend protocol(s) for the kube-apiserver; "both" tells them apart per connection' },
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
  'backend-dial-timeout': { type: 'string', default: DEFAULT_BACKEND_DIAL_TIMEOUT, describe: 'How long a dial through an agent may take (then HTTP 504); 0 (upstream: no timeout) keeps 10s' },
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

/** The server's configuration from its command line: the checks are in src/server/config.ts, the notices about ignored upstream flags here. */
export function validateServerArgs(a: ServerArgs): ServerConfig {
  return serverConfig(a, upstreamNotices(a, serverFlags));
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
    transport: await loadTransport(config.transport),
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
  const reclaimer = startMemoryReclaimer(server.metrics, options.log);
  runUntilSignalled(options.log, async () => {
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
    const { TokenAuthenticator } = await import('../server/token-authenticator.js');
    options.agent.tokens = new TokenAuthenticator({ api: client(), ...tokens });
  }
  if (leases) {
    const { ServerLeaseController } = await import('../server/lease-controller.js');
    options.leases = new ServerLeaseController({ api: client(), serverId: config.serverID, namespace: leases.namespace, labels: leases.labels, log: options.log.child({ part: 'lease' }) });
  }
  return clients;
}
