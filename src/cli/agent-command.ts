/** `kanal agent`: flags (upstream names where the meaning matches), validation, start. */
import type { Argv, InferredOptionTypes } from 'yargs';
import { createLogger, LOG_LEVELS } from '../common/logger.js';
import type { AgentOptions } from '../agent/agent.js';
import { AssembledAgent } from '../agent/assembled-agent.js';
import { agentConfig, type AgentConfig } from '../agent/config.js';
import { maxConnectionWindowOption, peerReadTimeoutOption } from './shared-options.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import type { ClientTlsOptions } from '../transport/transport.js';
import { UsageError } from '../common/usage-error.js';
import { lastValueWins } from './last-value-wins.js';
import { runUntilSignalled } from './lifecycle.js';
import { loadTransport, TRANSPORT_NAMES } from '../transport/choice.js';
import { INTERFACE_TYPES } from '../agent/host-interface-manager.js';
import { DEFAULT_CP_TO_NODE_CONNECTIONS } from '../tunnel/limits.js';
import { runPreflight, formatPreflight, preflightPassed } from '../agent/preflight.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { agentIgnoredFlags, klogFlags, upstreamNotices } from './upstream-flags.js';
import { ServiceAccountTokenSource } from '../agent/service-account-token.js';
import { SERVER_COUNT_SOURCES } from '../agent/server-count.js';
import { DEFAULT_LEASE_LABEL } from '../kube/lease.js';
import { kubeApiContentTypeOption, kubeconfigOption, leaseNamespaceOption } from './kube-flags.js';

export const agentFlags = {
  'proxy-server-host': { type: 'string', describe: 'Host name or address of the proxy server(s) agent port' },
  'proxy-server-port': { type: 'number', default: 8091, describe: 'Agent port of the proxy server' },
  'ca-cert': { type: 'string', describe: 'CA that signed the proxy server certificate' },
  'agent-cert': { type: 'string', describe: 'Client certificate presented to the server (mTLS)' },
  'agent-key': { type: 'string', describe: 'Key for --agent-cert' },
  'service-account-token-path': { type: 'string', describe: 'File with the service account token sent to the server (read afresh on every connect; projected tokens rotate)' },
  'count-server-leases': { type: 'boolean', default: false, describe: 'Count the proxy servers by their Leases (servers run --enable-lease-controller) and hold a tunnel to each' },
  'lease-namespace': leaseNamespaceOption,
  'lease-label': { type: 'string', default: DEFAULT_LEASE_LABEL, describe: 'Label selector of the server Leases counted' },
  'server-count-source': { type: 'string', choices: SERVER_COUNT_SOURCES, default: 'default', describe: '"default": the lease count with --count-server-leases, else the servers\' serverCount; "max": the larger of the two' },
  'sync-forever': { type: 'boolean', default: false, describe: 'With every tunnel up, still connect once per --sync-interval-cap to learn of new servers' },
  kubeconfig: kubeconfigOption,
  'kube-api-content-type': kubeApiContentTypeOption,
  'tls-server-name': { type: 'string', describe: 'Name to verify the server certificate against (default: --proxy-server-host)' },
  'alpn-proto': { type: 'string', array: true, default: [] as string[], describe: 'ALPN protocol offered before h2, for a front that routes by it (repeatable or comma-separated)' },
  'agent-id': { type: 'string', describe: 'ID announced to the server (default: $PROXY_AGENT_ID, else this host name)' },
  'agent-identifiers': { type: 'string', default: '', describe: 'What this agent serves, for the server\'s --proxy-strategies: a URL query of host, ipv4, ipv6, cidr and default-route, e.g. host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24 (see docs/routing.md)' },
  'dial-timeout': { type: 'string', default: '10s', describe: 'Timeout for dials the server asks for' },
  'sync-interval': { type: 'string', default: '1s', describe: 'First reconnect delay (doubles with jitter)' },
  'sync-interval-cap': { type: 'string', default: '30s', describe: 'Longest reconnect delay' },
  'connect-timeout': { type: 'string', default: '10s', describe: 'Timeout for opening a tunnel to a server' },
  'shutdown-grace-period': { type: 'string', default: '30s', describe: 'On SIGTERM: how long open connections may finish after DRAIN' },
  'health-server-port': { type: 'number', default: 8093, describe: 'Port for /healthz, /readyz and /metrics (0 disables)' },
  'health-bind-address': { type: 'string', default: '0.0.0.0', describe: 'Address the health port listens on' },
  'health-server-host': { type: 'string', describe: 'Upstream\'s name for --health-bind-address (empty: all addresses)' },
  'admin-server-port': { type: 'number', default: 8094, describe: 'Port for /metrics and, with --enable-profiling, profiles (0 disables)' },
  'admin-bind-address': { type: 'string', default: '127.0.0.1', describe: 'Address the admin port listens on' },
  'enable-profiling': { type: 'boolean', default: false, describe: 'Serve CPU profiles and heap snapshots on the admin port (see docs/upstream-flags.md)' },
  'bind-address': { type: 'string', describe: 'Node -> control plane: the kube-apiserver advertise address to serve locally' },
  target: { type: 'string', array: true, default: [] as string[], describe: 'local_port:dst_host:dst_port forwarded to the control plane (repeatable)' },
  'bind-interface': { type: 'string', default: 'kanal0', describe: 'Host-scoped interface that carries --bind-address' },
  'bind-interface-type': { type: 'string', choices: INTERFACE_TYPES, default: 'dummy', describe: 'Kind of --bind-interface to create; "none" uses an existing address' },
  'tunnel-wait-timeout': { type: 'string', default: '10s', describe: 'How long a node connection waits for a tunnel before it is closed' },
  'max-connection-window': maxConnectionWindowOption,
  'max-cp-to-node-connections': { type: 'number', default: DEFAULT_CP_TO_NODE_CONNECTIONS, describe: 'Control plane -> node connections this agent dials or holds per server tunnel; more are refused' },
  'peer-read-timeout': peerReadTimeoutOption,
  transport: { type: 'string', choices: TRANSPORT_NAMES, default: TRANSPORT_NAMES[0], describe: 'gRPC implementation' },
  'log-level': { type: 'string', choices: LOG_LEVELS, describe: 'Log level (JSON logs on stdout; default: from --v, else info)' },
  'dry-run': { type: 'boolean', default: false, describe: 'Validate flags, print the configuration as JSON and exit' },
  check: { type: 'boolean', default: false, describe: 'Preflight: check credentials, the server (TLS + agent stream + targets) and netlink, print a pass/fail list, exit 0 or 1' },
  ...klogFlags,
  ...agentIgnoredFlags,
} as const;

export type AgentArgs = InferredOptionTypes<typeof agentFlags>;

/** The agent's configuration from its command line: the checks are in src/agent/config.ts, the notices about ignored upstream flags here. */
export function validateAgentArgs(a: AgentArgs): AgentConfig {
  return agentConfig(a, upstreamNotices(a, agentFlags));
}

export interface AgentCredentials {
  tls: ClientTlsOptions;
  /** Certificates outside their validity period: logged, not fatal (see credential-files.ts). */
  warnings: string[];
}

/** Reads and checks every credential file the flags name; throws CredentialFilesError listing each problem. */
export function loadAgentCredentials(config: AgentConfig): AgentCredentials {
  const s = config.server;
  const check = new CredentialCheck();
  const ca = check.certificates({ flag: 'ca-cert', path: s.caFile ?? '' });
  const pair = s.certFile && s.keyFile ? check.keyPair({ flag: 'agent-cert', path: s.certFile }, { flag: 'agent-key', path: s.keyFile }, 'client') : undefined;
  if (config.tokenFile) check.token({ flag: 'service-account-token-path', path: config.tokenFile });
  check.done();
  return { tls: { ca: ca!.pem, cert: pair?.cert.pem, key: pair?.key.pem, serverName: s.serverName, alpnProtocols: s.alpnProtocols }, warnings: check.warnings };
}

export async function buildAgentOptions(config: AgentConfig, credentials: AgentCredentials = loadAgentCredentials(config)): Promise<AgentOptions> {
  const log = createLogger(config.logLevel, 'agent').child({ agentID: config.agentID });
  const s = config.server;
  const token = config.tokenFile === undefined ? undefined : new ServiceAccountTokenSource(config.tokenFile);
  return {
    agentID: config.agentID,
    agentIdentifiers: config.agentIdentifiers,
    server: { host: s.host, port: s.port, tls: credentials.tls },
    token: token && (() => token.readSync()),
    serverCount: { source: config.serverCountSource },
    syncForever: config.syncForever,
    dialTimeoutMs: config.dialTimeoutMs,
    connectTimeoutMs: config.connectTimeoutMs,
    reconnect: config.reconnect,
    health: config.health,
    limits: { maxWindowBytes: config.maxConnectionWindowBytes, peerReadTimeoutMs: config.peerReadTimeoutMs, maxInboundConnections: config.maxCpToNodeConnections },
    transport: await loadTransport(config.transport),
    log,
  };
}

export function agentBuilder(y: Argv): Argv<AgentArgs> {
  return y
    .options(agentFlags)
    .middleware(lastValueWins(agentFlags), true)
    .example('$0 agent --proxy-server-host cp.example --ca-cert ca.crt --agent-cert agent.crt --agent-key agent.key', 'Control plane -> node only')
    .example('$0 agent ... --bind-address 10.200.0.1 --target 6443:10.0.0.10:6443', 'Also serve the kube-apiserver (advertise address 10.200.0.1) on the node (KEP-2025)');
}

/** `--check`: runs the preflight checks, prints the list, sets the exit code (0 all passed, 1 otherwise). */
async function runAgentCheck(config: AgentConfig): Promise<void> {
  const s = config.server;
  const results = await runPreflight({
    agentID: config.agentID,
    agentIdentifiers: config.agentIdentifiers,
    server: s,
    tokenFile: config.tokenFile,
    connectTimeoutMs: config.connectTimeoutMs,
    dialTimeoutMs: config.dialTimeoutMs,
    node: config.node,
    healthPort: config.health?.port,
    transport: await loadTransport(config.transport),
    log: createLogger('silent', 'agent-check'),
  });
  process.stdout.write(formatPreflight(results, `kanal agent --check (agent ID ${config.agentID}, server ${s.host}:${s.port})`));
  process.exitCode = preflightPassed(results) ? 0 : 1;
}

export async function runAgent(args: AgentArgs): Promise<void> {
  const config = validateAgentArgs(args);
  if (args['dry-run'] && args.check) throw new UsageError('--dry-run and --check exclude each other');
  if (args.check) {
    await runAgentCheck(config);
    return;
  }
  if (args['dry-run']) {
    dryRun(config, () => loadAgentCredentials(config));
    return;
  }
  // Before anything else: a bad file is a permanent mistake, not worth a retry (#12 finding 4).
  const credentials = loadAgentCredentials(config);
  const options = await buildAgentOptions(config, credentials);
  const log = options.log;
  for (const w of credentials.warnings) log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) log.warn(notice);
  if (args.kubeconfig && !config.leases) log.warn('--kubeconfig is not used: --count-server-leases is off');
  enableGcPacing();
  const assembled = new AssembledAgent({ agent: options, leases: config.leases, node: config.node, admin: config.admin });
  const agent = assembled.agent;
  await assembled.start();
  // systemd (Type=notify): READY=1 once the listeners are bound and the first
  // tunnel is up, or after --connect-timeout at the latest so an unreachable
  // control plane never blocks the kubelet (ordered after us) for good.
  const notifier = new SystemdNotifier((reason) => log.warn({ reason }, 'cannot notify systemd'));
  const status = (): string => agent.readiness().detail;
  agent.onTunnelChange(() => (notifier.isReady ? notifier.status(status()) : notifier.ready(status())));
  setTimeout(() => notifier.ready(status()), config.connectTimeoutMs).unref();
  const reclaimer = startMemoryReclaimer(agent.metrics, log);
  runUntilSignalled(log, async () => {
    reclaimer.stop();
    notifier.stopping('draining');
    await assembled.stop(config.shutdownGraceMs);
    // Last line: everything the agent created is gone (#12 finding 6).
    log.info('kanal agent stopped');
  });
}
