/**
 * The server's flags checked and turned into its configuration, beside what
 * they configure (#13). Takes the values as the command line gives them
 * (keyed by flag name, so every message names the flag to fix) and reads no
 * credential file; mistakes are UsageErrors (exit 2).
 */
import os from 'node:os';
import { randomUUID } from 'node:crypto';
import type { LevelWithSilent } from 'pino';
import { parseHostPort } from '../common/host-port.js';
import { UsageError } from '../common/usage-error.js';
import { choiceFlag, connectionWindowFlag, countFlag, durationFlag as duration, portFlag as port } from '../common/flag-values.js';
import { logLevelFrom } from '../common/log-level.js';
import { defaultNodeToCpConnections } from '../common/open-files-limit.js';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../transport/liveness.js';
import { TRANSPORT_NAMES, type TransportName } from '../transport/choice.js';
import { DEFAULT_LIMITS } from '../tunnel/limits.js';
import { kubeClientConfig, leaseLabelsFlag } from '../kube/flag-values.js';
import type { KubeClientConfig } from '../kube/kube-clients.js';
import { serverLeaseName } from '../kube/lease.js';
import type { Labels } from '../kube/labels.js';
import { FRONTEND_MODES, type FrontendMode } from './listeners.js';
import { parseEku, parseSubjectPattern, type RolePins } from './client-roles.js';
import { parseProxyStrategies, type ProxyStrategy } from './routing/proxy-strategies.js';
import { tlsPolicyFlags, type TlsPolicy } from './tls-flags.js';
import { fileModeFlag, groupFlag } from './unix-socket-flags.js';

/** `--backend-dial-timeout`'s default, also what upstream's 0 ("no timeout") becomes. */
export const DEFAULT_BACKEND_DIAL_TIMEOUT = '10s';

/** The server's flags as given (yargs' defaults applied), by flag name. */
export interface ServerFlagValues {
  'server-id'?: string | undefined;
  'server-count': number;
  'agent-port': number;
  'agent-bind-address': string;
  'cluster-cert'?: string | undefined;
  'cluster-key'?: string | undefined;
  'cluster-ca-cert'?: string | undefined;
  'allow-unauthenticated-agents': boolean;
  'agent-namespace'?: string | undefined;
  'agent-service-account'?: string | undefined;
  'authentication-audience'?: string | undefined;
  kubeconfig?: string | undefined;
  'kubeconfig-qps': number;
  'kubeconfig-burst': number;
  'kube-api-content-type': string;
  'enable-lease-controller': boolean;
  'lease-namespace': string;
  'lease-label': string;
  'max-agents-per-credential': number;
  'agent-client-subject': readonly string[];
  'agent-client-eku': readonly string[];
  'frontend-client-subject': readonly string[];
  'frontend-client-eku': readonly string[];
  'keepalive-time': string;
  'keepalive-timeout': string;
  mode: string;
  'uds-name'?: string | undefined;
  'delete-existing-uds-file': boolean;
  'uds-mode': string;
  'uds-group'?: string | undefined;
  'frontend-header-timeout': string;
  'server-port': number;
  'server-bind-address': string;
  'server-cert'?: string | undefined;
  'server-key'?: string | undefined;
  'server-ca-cert'?: string | undefined;
  'proxy-strategies': string;
  'tls-min-version': string;
  'cipher-suites': readonly string[];
  'backend-dial-timeout': string;
  'allowed-destination': readonly string[];
  'destination-dial-timeout': string;
  'health-port': number;
  'health-bind-address': string;
  'admin-port': number;
  'admin-bind-address': string;
  'enable-profiling': boolean;
  'max-message-size': number;
  'max-connection-window': number;
  'max-node-to-cp-connections-per-agent': number;
  'max-node-to-cp-connections': number;
  'max-cp-to-node-connections-per-agent': number;
  'max-pending-dials-per-agent': number;
  'peer-read-timeout': string;
  transport: string;
  'log-level'?: string | undefined;
  /** klog's verbosity (upstream's flag), used without --log-level. */
  v?: number | undefined;
}

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
  transport: TransportName;
  logLevel: LevelWithSilent;
  /** Upstream flags given that Kanal ignores, one line each (logged at start). */
  notices: string[];
}

function rolePins(subjectFlag: string, subjects: readonly string[], ekuFlag: string, ekus: readonly string[]): RolePins {
  const parse = <T>(flag: string, f: (v: string) => T) => (v: string): T => {
    try {
      return f(v);
    } catch (err) {
      throw new UsageError(`--${flag} ${(err as Error).message}`);
    }
  };
  return { subjects: subjects.map(parse(subjectFlag, parseSubjectPattern)), ekus: ekus.map(parse(ekuFlag, parseEku)) };
}

/** Checks the flags; `notices` are the command line's lines about ignored upstream flags (more may be added). */
export function serverConfig(a: ServerFlagValues, notices: string[]): ServerConfig {
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
  const frontend: ServerConfig['frontend'] = { mode: choiceFlag('mode', a.mode, FRONTEND_MODES), headerTimeoutMs: duration('frontend-header-timeout', a['frontend-header-timeout']) };
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
  let backendDialTimeout = a['backend-dial-timeout'];
  if (/^0+(\.0*)?[a-z]*$/.test(backendDialTimeout)) {
    // Upstream's 0 waits for ever; every wait in Kanal is bounded.
    notices.push(`--backend-dial-timeout ${backendDialTimeout}: upstream's "no timeout" is not offered; using ${DEFAULT_BACKEND_DIAL_TIMEOUT}`);
    backendDialTimeout = DEFAULT_BACKEND_DIAL_TIMEOUT;
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
    maxConnectionWindowBytes: connectionWindowFlag('max-connection-window', a['max-connection-window'], DEFAULT_LIMITS.windowBytes),
    perAgent: {
      maxNodeToCpConnections: countFlag('max-node-to-cp-connections-per-agent', a['max-node-to-cp-connections-per-agent']),
      maxCpToNodeConnections: countFlag('max-cp-to-node-connections-per-agent', a['max-cp-to-node-connections-per-agent']),
      maxPendingDials: countFlag('max-pending-dials-per-agent', a['max-pending-dials-per-agent']),
    },
    maxNodeToCpConnections: countFlag('max-node-to-cp-connections', a['max-node-to-cp-connections'], 0) || defaultNodeToCpConnections(),
    peerReadTimeoutMs: duration('peer-read-timeout', a['peer-read-timeout']),
    transport: choiceFlag('transport', a.transport, TRANSPORT_NAMES),
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
function tokenAuthFlags(a: ServerFlagValues): ServerConfig['agent']['tokens'] {
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
