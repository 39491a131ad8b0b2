/**
 * The server's configuration from its parsed settings (settings.ts): the
 * checks that tie several settings together, and the shape the server is
 * assembled from. Reads no credential file; mistakes are UsageErrors (exit 2).
 */
import type { LevelWithSilent } from 'pino';
import { UsageError } from '../../common/usage-error.js';
import { errorMessage } from '../../common/error-message.js';
import { defaultNodeToCpConnections } from '../../common/open-files-limit.js';
import { logLevelFrom } from '../../settings/process-settings.js';
import type { TransportName } from '../../transport/choice.js';
import { kubeClientConfig } from '../../kube/settings.js';
import type { KubeClientConfig } from '../../kube/kube-clients.js';
import { serverLeaseName } from '../../kube/lease.js';
import type { Labels } from '../../kube/labels.js';
import type { FrontendMode } from '../listeners.js';
import type { RolePins } from '../identity/client-roles.js';
import type { ProxyStrategy } from '../routing/proxy-strategies.js';
import type { TlsPolicy } from './tls-flags.js';
import type { ServerSettings } from './settings.js';

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

/** Checks what ties the settings together; `notices` are the command line's lines about ignored upstream flags (more may be added). */
export function serverConfig(v: ServerSettings, notices: string[]): ServerConfig {
  const certFile = v['cluster-cert'] ?? v['server-cert'];
  const keyFile = v['cluster-key'] ?? v['server-key'];
  if (!certFile || !keyFile)
    throw new UsageError('the agent port needs a certificate: pass --cluster-cert and --cluster-key (or --server-cert and --server-key)');
  const tokens = tokenAuthSettings(v);
  if (tokens && v['allow-unauthenticated-agents']) {
    throw new UsageError(
      '--allow-unauthenticated-agents contradicts token authentication (--agent-namespace, --agent-service-account, --authentication-audience): every agent needs a token',
    );
  }
  if (!v['cluster-ca-cert'] && !tokens && !v['allow-unauthenticated-agents']) {
    throw new UsageError(
      '--cluster-ca-cert is required to authenticate agents by client certificate (or --agent-namespace, --agent-service-account and --authentication-audience to authenticate them by service account token, or --allow-unauthenticated-agents to accept any agent, which is insecure)',
    );
  }
  const frontend: ServerConfig['frontend'] = { mode: v.mode, headerTimeoutMs: v['frontend-header-timeout'] };
  const udsPath = v['uds-name'];
  if (udsPath) {
    const gid = v['uds-group'];
    frontend.uds = {
      path: udsPath,
      deleteExisting: v['delete-existing-uds-file'],
      mode: v['uds-mode'],
      ...(gid === undefined ? {} : { gid }),
    };
  } else {
    const [cert, key, ca] = [v['server-cert'], v['server-key'], v['server-ca-cert']];
    if (!cert || !key) throw new UsageError('the frontend needs --uds-name, or --server-cert and --server-key for mTLS TCP');
    if (!ca) throw new UsageError('--server-ca-cert is required for the TCP frontend so only the kube-apiserver can use it');
    frontend.tcp = {
      host: v['server-bind-address'],
      port: v['server-port'],
      certFile: cert,
      keyFile: key,
      caFile: ca,
      clientPins: { subjects: v['frontend-client-subject'], ekus: v['frontend-client-eku'] },
    };
  }
  const backendDialTimeout = v['backend-dial-timeout'];
  if (backendDialTimeout.notice) notices.push(backendDialTimeout.notice);
  const serverID = v['server-id'];
  const leases = v['enable-lease-controller'] ? { namespace: v['lease-namespace'], labels: v['lease-label'] } : undefined;
  if (leases) {
    try {
      serverLeaseName(serverID);
    } catch (err) {
      throw new UsageError(`--enable-lease-controller: ${errorMessage(err)}`);
    }
  }
  const kube = tokens || leases ? kubeClientConfig(v) : undefined;
  const [minVersion, ciphers] = [v['tls-min-version'], v['cipher-suites']];
  const healthPort = v['health-port'];
  const adminPort = v['admin-port'];
  return {
    serverID,
    serverCount: v['server-count'],
    agent: {
      host: v['agent-bind-address'],
      port: v['agent-port'],
      certFile,
      keyFile,
      certFlag: v['cluster-cert'] ? 'cluster-cert' : 'server-cert',
      keyFlag: v['cluster-key'] ? 'cluster-key' : 'server-key',
      caFile: v['cluster-ca-cert'],
      allowUnauthenticated: v['allow-unauthenticated-agents'],
      clientPins: { subjects: v['agent-client-subject'], ekus: v['agent-client-eku'] },
      maxAgentsPerCredential: v['max-agents-per-credential'],
      keepalive: { intervalMs: v['keepalive-time'], timeoutMs: v['keepalive-timeout'] },
      ...(tokens ? { tokens } : {}),
    },
    ...(kube ? { kube } : {}),
    ...(leases ? { leases } : {}),
    frontend,
    health: healthPort > 0 ? { host: v['health-bind-address'], port: healthPort } : undefined,
    tls: { ...(minVersion ? { minVersion } : {}), ...(ciphers ? { ciphers } : {}) },
    admin: adminPort > 0 ? { host: v['admin-bind-address'], port: adminPort, profiling: v['enable-profiling'] } : undefined,
    backendDialTimeoutMs: backendDialTimeout.ms,
    proxyStrategies: v['proxy-strategies'],
    allowedDestinations: v['allowed-destination'],
    destinationDialTimeoutMs: v['destination-dial-timeout'],
    maxReceiveMessageBytes: v['max-message-size'],
    maxConnectionWindowBytes: v['max-connection-window'],
    perAgent: {
      maxNodeToCpConnections: v['max-node-to-cp-connections-per-agent'],
      maxCpToNodeConnections: v['max-cp-to-node-connections-per-agent'],
      maxPendingDials: v['max-pending-dials-per-agent'],
    },
    maxNodeToCpConnections: v['max-node-to-cp-connections'] || defaultNodeToCpConnections(),
    peerReadTimeoutMs: v['peer-read-timeout'],
    transport: v.transport,
    logLevel: logLevelFrom(v['log-level'], v.v),
    notices,
  };
}

/** `--agent-namespace`, `--agent-service-account`, `--authentication-audience`: all three or none (upstream). */
function tokenAuthSettings(v: ServerSettings): ServerConfig['agent']['tokens'] {
  const [namespace, serviceAccount, audience] = [v['agent-namespace'], v['agent-service-account'], v['authentication-audience']];
  if (!namespace && !serviceAccount && !audience) return undefined;
  if (!namespace || !serviceAccount || !audience) {
    const missing = [
      ['--agent-namespace', namespace],
      ['--agent-service-account', serviceAccount],
      ['--authentication-audience', audience],
    ]
      .filter(([, x]) => !x)
      .map(([f]) => f);
    throw new UsageError(
      `token authentication needs --agent-namespace, --agent-service-account and --authentication-audience together; missing ${missing.join(', ')}`,
    );
  }
  for (const [flag, value] of Object.entries({ '--agent-namespace': namespace, '--agent-service-account': serviceAccount })) {
    if (value.includes(':')) throw new UsageError(`${flag} ${JSON.stringify(value)} must not contain ':'`);
  }
  return { namespace, serviceAccount, audience };
}
