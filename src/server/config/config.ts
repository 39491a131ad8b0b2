/**
 * The server's configuration from its parsed settings (settings.ts): the
 * checks that tie several settings together, and the shape the server is
 * assembled from. Reads no credential file; mistakes are UsageErrors (exit 2).
 */
import type { LevelWithSilent } from 'pino';
import type { LogFormat } from '../../common/logger.js';
import { UsageError } from '../../common/usage-error.js';
import { isLoopbackHost } from '../../common/loopback.js';
import { errorMessage } from '../../common/error-message.js';
import { defaultNodeToCpConnections } from '../../common/open-files-limit.js';
import { cpuQuota } from '../../common/cpu-quota.js';
import { logLevelFrom } from '../../settings/process-settings.js';
import { kubeClientConfig } from '../../kube/settings.js';
import type { KubeClientConfig } from '../../kube/kube-clients.js';
import { serverLeaseName } from '../../kube/lease.js';
import type { Labels } from '../../kube/labels.js';
import type { RolePins } from '../identity/client-roles.js';
import type { TlsPolicy } from './tls-flags.js';
import { FLAG, serverSettings, type ServerSettings } from './settings.js';
import { keyOf } from '../../settings/flag-names.js';
import type { HealthPortOptions } from '../../common/health-server.js';
import type { HttpPortLimits } from '../../common/http-listener.js';
import { httpPortLimits } from '../../settings/http-port-settings.js';
import type { ExtraFrontendListener } from '../server-options.js';

/**
 * Every setting as its entry parsed it (`settings`, by flag name: what the
 * code reads), and what several settings make together. A setting is never
 * restated here under a second name. Read before any file is.
 */
export interface ServerConfig {
  settings: ServerSettings;
  /** The agent port's serving pair (--cluster-cert/--cluster-key, else --server-cert/--server-key: certFlag/keyFlag name the ones used), its client pins, and token authentication (all three flags given). */
  agent: {
    certFile: string;
    keyFile: string;
    certFlag: string;
    keyFlag: string;
    clientPins: RolePins;
    tokens?: { namespace: string; serviceAccount: string; audience: string };
  };
  /** Set when token authentication or the lease controller uses the API. */
  kube?: KubeClientConfig;
  /** `--enable-lease-controller`. */
  leases?: { namespace: string; labels: Labels };
  /** The frontend: a Unix socket (--uds-name and its mode, group, stale-socket rule) or mTLS TCP. */
  frontend: {
    uds?: { path: string; deleteExisting: boolean; mode: number; gid?: number };
    tcp?: { host: string; port: number; certFile: string; keyFile: string; caFile?: string; clientPins: RolePins };
    /** --http-proxy-port on --http-proxy-bind-address: the HTTP door on plain TCP. */
    httpProxy?: { host: string; port: number };
    /** Listeners of one door beside it (--socks5-port, --socks5-uds-name). */
    extra?: ExtraFrontendListener[];
  };
  health?: HealthPortOptions;
  /** --tls-min-version and --cipher-suites, for both TLS listeners. */
  tls: TlsPolicy;
  admin?: { host: string; port: number; profiling: boolean; limits: HttpPortLimits };
  /** --max-node-to-cp-connections, its 0 made half the open-files limit. */
  maxNodeToCpConnections: number;
  /** --log-level, else klog's --v. */
  logLevel: LevelWithSilent;
  logFormat: LogFormat;
  /** Upstream flags given that Kanal ignores, one line each (logged at start). */
  notices: string[];
  /** `--tenants-config`: the file declaring the tenants (tenants-command-line.ts); the settings above are then what they share. */
  tenants?: { file: string; workers: number };
  /**
   * `--workers` of a server of one cluster, when above 1: worker processes
   * that are each a server of their own to the agents (docs/multi-tenant.md,
   * "Workers of one cluster").
   */
  workers?: number;
}

/** Checks what ties the settings together; `notices` are the command line's lines about ignored upstream flags (more may be added). */
export function serverConfig(v: ServerSettings, notices: string[]): ServerConfig {
  const workers = v.workers || cpuQuota();
  const certFile = v['cluster-cert'] ?? v['server-cert'];
  const keyFile = v['cluster-key'] ?? v['server-key'];
  if (!certFile || !keyFile)
    throw new UsageError(
      `the agent port needs a certificate: pass ${FLAG['cluster-cert']} and ${FLAG['cluster-key']} (or ${FLAG['server-cert']} and ${FLAG['server-key']})`,
    );
  const tokens = tokenAuthSettings(v);
  if (tokens && v['allow-unauthenticated-agents']) {
    throw new UsageError(
      `${FLAG['allow-unauthenticated-agents']} contradicts token authentication (${FLAG['agent-namespace']}, ${FLAG['agent-service-account']}, ${FLAG['authentication-audience']}): every agent needs a token`,
    );
  }
  if (!v['cluster-ca-cert'] && !tokens && !v['allow-unauthenticated-agents']) {
    throw new UsageError(
      `${FLAG['cluster-ca-cert']} is required to authenticate agents by client certificate (or ${FLAG['agent-namespace']}, ${FLAG['agent-service-account']} and ${FLAG['authentication-audience']} to authenticate them by service account token, or ${FLAG['allow-unauthenticated-agents']} to accept any agent, which is insecure)`,
    );
  }
  const frontend: ServerConfig['frontend'] = {};
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
    if (!cert || !key)
      throw new UsageError(`the frontend needs ${FLAG['uds-name']}, or ${FLAG['server-cert']} and ${FLAG['server-key']} for mTLS TCP`);
    if (!ca) throw new UsageError(`${FLAG['server-ca-cert']} is required for the TCP frontend so only the kube-apiserver can use it`);
    frontend.tcp = {
      host: v['server-bind-address'],
      port: v['server-port'],
      certFile: cert,
      keyFile: key,
      caFile: ca,
      clientPins: { subjects: v['frontend-client-subject'], ekus: v['frontend-client-eku'] },
    };
  }
  if (v['http-proxy-port'] !== 0) frontend.httpProxy = { host: v['http-proxy-bind-address'], port: v['http-proxy-port'] };
  const extra = socks5Listeners(v);
  if (extra.length > 0) frontend.extra = extra;
  requireClientsOffLoopback(v, [
    ...(frontend.httpProxy ? [{ flag: FLAG['http-proxy-bind-address'], host: frontend.httpProxy.host }] : []),
    ...(v['socks5-port'] > 0 ? [{ flag: FLAG['socks5-bind-address'], host: v['socks5-bind-address'] }] : []),
  ]);
  const backendDialTimeout = v['backend-dial-timeout'];
  if (backendDialTimeout.notice) notices.push(backendDialTimeout.notice);
  const serverID = v['server-id'];
  const leases = v['enable-lease-controller'] ? { namespace: v['lease-namespace'], labels: v['lease-label'] } : undefined;
  if (leases) {
    try {
      serverLeaseName(serverID);
    } catch (err) {
      throw new UsageError(`${FLAG['enable-lease-controller']}: ${errorMessage(err)}`);
    }
  }
  const kube = tokens || leases ? kubeClientConfig(v) : undefined;
  const shared = processConfig(v, notices, { certFile, keyFile });
  return {
    ...shared,
    agent: {
      ...shared.agent,
      clientPins: { subjects: v['agent-client-subject'], ekus: v['agent-client-eku'] },
      ...(tokens ? { tokens } : {}),
    },
    ...(kube ? { kube } : {}),
    ...(leases ? { leases } : {}),
    frontend,
    ...(workers > 1 ? { workers } : {}),
  };
}

/**
 * What every server's configuration has, one cluster or many: the agent
 * port's certificate (`files`, as the caller found it), health and admin
 * ports, the TLS policy, the node -> control plane budget and logging.
 */
export function processConfig(
  v: ServerSettings,
  notices: string[],
  files: { certFile: string; keyFile: string },
): Omit<ServerConfig, 'frontend' | 'kube' | 'leases' | 'tenants'> {
  const [minVersion, ciphers] = [v['tls-min-version'], v['cipher-suites']];
  const healthPort = v['health-port'];
  const adminPort = v['admin-port'];
  return {
    settings: v,
    agent: {
      ...files,
      certFlag: v['cluster-cert'] ? keyOf(serverSettings, 'cluster-cert') : keyOf(serverSettings, 'server-cert'),
      keyFlag: v['cluster-key'] ? keyOf(serverSettings, 'cluster-key') : keyOf(serverSettings, 'server-key'),
      clientPins: { subjects: [], ekus: [] },
    },
    health:
      healthPort > 0
        ? {
            host: v['health-bind-address'],
            port: healthPort,
            limits: httpPortLimits(v),
            // A tenants file's series are labelled with every tenant (docs/metrics.md, "Who may scrape the health port").
            metrics: v['health-metrics'] === 'auto' ? (v['tenants-config'] ? 'loopback' : 'any') : v['health-metrics'],
          }
        : undefined,
    tls: { ...(minVersion ? { minVersion } : {}), ...(ciphers ? { ciphers } : {}) },
    admin:
      adminPort > 0
        ? { host: v['admin-bind-address'], port: adminPort, profiling: v['enable-profiling'], limits: httpPortLimits(v) }
        : undefined,
    maxNodeToCpConnections: v['max-node-to-cp-connections'] || defaultNodeToCpConnections(),
    logLevel: logLevelFrom(v['log-level'], v.v),
    logFormat: v['logging-format'],
    notices,
  };
}

/** `--agent-namespace`, `--agent-service-account`, `--authentication-audience`: all three or none (upstream); a tenant's too. */
export function tokenAuthSettings(
  v: Pick<ServerSettings, 'agent-namespace' | 'agent-service-account' | 'authentication-audience'>,
): ServerConfig['agent']['tokens'] {
  const [namespace, serviceAccount, audience] = [v['agent-namespace'], v['agent-service-account'], v['authentication-audience']];
  if (!namespace && !serviceAccount && !audience) return undefined;
  if (!namespace || !serviceAccount || !audience) {
    const missing = [
      [FLAG['agent-namespace'], namespace],
      [FLAG['agent-service-account'], serviceAccount],
      [FLAG['authentication-audience'], audience],
    ]
      .filter(([, x]) => !x)
      .map(([f]) => f);
    throw new UsageError(
      `token authentication needs ${FLAG['agent-namespace']}, ${FLAG['agent-service-account']} and ${FLAG['authentication-audience']} together; missing ${missing.join(', ')}`,
    );
  }
  for (const [flag, value] of Object.entries({ [FLAG['agent-namespace']]: namespace, [FLAG['agent-service-account']]: serviceAccount })) {
    if (value.includes(':')) throw new UsageError(`${flag} ${JSON.stringify(value)} must not contain ':'`);
  }
  return { namespace, serviceAccount, audience };
}

/**
 * A plain TCP listener (no certificate, no Unix socket permissions) off
 * loopback needs a clients: list: without one, whoever reaches it is the
 * kube-apiserver and may dial every destination (docs/frontends.md,
 * "Security model"). On loopback the server warns at start instead.
 */
function requireClientsOffLoopback(v: ServerSettings, listeners: readonly { flag: string; host: string }[]): void {
  if (v['frontend-clients-config'] !== undefined) return;
  for (const { flag, host } of listeners) {
    if (!isLoopbackHost(host))
      throw new UsageError(
        `${flag} ${host || '(every address)'}: a plain TCP listener beyond loopback needs ${FLAG['frontend-clients-config']}: without a clients: list, whoever reaches it is the kube-apiserver and may dial every destination`,
      );
  }
}

/**
 * SOCKS5's own listeners: plain TCP (--socks5-port, on --socks5-bind-address) and a Unix
 * socket (--socks5-uds-name with its mode and group, the frontend's --delete-existing-uds-file), either or both.
 */
export function socks5Listeners(v: ServerSettings): ExtraFrontendListener[] {
  const out: ExtraFrontendListener[] = [];
  const port = v['socks5-port'];
  if (port > 0)
    out.push({
      mode: 'socks5',
      flags: `${FLAG['socks5-bind-address']}, ${FLAG['socks5-port']}`,
      plain: { host: v['socks5-bind-address'], port },
    });
  const path = v['socks5-uds-name'];
  if (path) {
    if (path === v['uds-name'])
      throw new UsageError(`${FLAG['socks5-uds-name']} ${path} is the frontend's ${FLAG['uds-name']}: give SOCKS5 a socket of its own`);
    const gid = v['socks5-uds-group'];
    out.push({
      mode: 'socks5',
      flags: FLAG['socks5-uds-name'],
      uds: { path, deleteExisting: v['delete-existing-uds-file'], mode: v['socks5-uds-mode'], ...(gid === undefined ? {} : { gid }) },
    });
  }
  return out;
}
