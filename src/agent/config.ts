/**
 * The agent's flags checked and turned into its configuration, beside what
 * they configure (#13). Takes the values as the command line gives them
 * (keyed by flag name, so every message names the flag to fix) and reads no
 * file; mistakes are UsageErrors (exit 2).
 */
import os from 'node:os';
import type { LevelWithSilent } from 'pino';
import { parseAgentIdentifiers } from '../wire/agent-identifiers.js';
import { UsageError } from '../common/usage-error.js';
import { choiceFlag, connectionWindowFlag, countFlag, durationFlag as duration, portFlag as port } from '../common/flag-values.js';
import { logLevelFrom } from '../common/log-level.js';
import { DEFAULT_LIMITS } from '../tunnel/limits.js';
import { TRANSPORT_NAMES, type TransportName } from '../transport/choice.js';
import { kubeClientConfig, leaseSelectorFlag } from '../kube/flag-values.js';
import type { AssembledAgentOptions } from './assembled-agent.js';
import { nodeSideFromFlags, type NodeSideOptions } from './node-side-config.js';
import { parseServerCountSource, type ServerCountSource } from './server-count.js';

/** The agent's flags as given (yargs' defaults applied), by flag name. */
export interface AgentFlagValues {
  'proxy-server-host'?: string | undefined;
  'proxy-server-port': number;
  'ca-cert'?: string | undefined;
  'agent-cert'?: string | undefined;
  'agent-key'?: string | undefined;
  'service-account-token-path'?: string | undefined;
  'count-server-leases': boolean;
  'lease-namespace': string;
  'lease-label': string;
  'server-count-source': string;
  'sync-forever': boolean;
  kubeconfig?: string | undefined;
  'kube-api-content-type': string;
  'tls-server-name'?: string | undefined;
  'alpn-proto': readonly string[];
  'agent-id'?: string | undefined;
  'agent-identifiers': string;
  'dial-timeout': string;
  'sync-interval': string;
  'sync-interval-cap': string;
  'connect-timeout': string;
  'shutdown-grace-period': string;
  'health-server-port': number;
  'health-bind-address': string;
  'health-server-host'?: string | undefined;
  'admin-server-port': number;
  'admin-bind-address': string;
  'enable-profiling': boolean;
  'bind-address'?: string | undefined;
  target: readonly string[];
  'bind-interface': string;
  'bind-interface-type': string;
  'tunnel-wait-timeout': string;
  'max-connection-window': number;
  'max-cp-to-node-connections': number;
  'peer-read-timeout': string;
  transport: string;
  'log-level'?: string | undefined;
  /** klog's verbosity (upstream's flag), used without --log-level. */
  v?: number | undefined;
}

export interface AgentConfig {
  agentID: string;
  agentIdentifiers: string;
  server: { host: string; port: number; caFile?: string; certFile?: string; keyFile?: string; serverName?: string; alpnProtocols: string[] };
  tokenFile?: string;
  /** `--count-server-leases`: the API client and the leases counted. */
  leases?: AssembledAgentOptions['leases'];
  serverCountSource: ServerCountSource;
  syncForever: boolean;
  dialTimeoutMs: number;
  connectTimeoutMs: number;
  reconnect: { initialMs: number; maxMs: number };
  shutdownGraceMs: number;
  health?: { host: string; port: number };
  admin?: AssembledAgentOptions['admin'];
  node?: NodeSideOptions;
  maxConnectionWindowBytes: number;
  /** Control plane -> node connections per server tunnel, dialling or open. */
  maxCpToNodeConnections: number;
  peerReadTimeoutMs: number;
  transport: TransportName;
  logLevel: LevelWithSilent;
  /** Upstream flags given that Kanal ignores, one line each (logged at start). */
  notices: string[];
}

/** Default agent ID: the host name, which is stable across restarts and readable in server logs. */
export function defaultAgentID(): string {
  return os.hostname().toLowerCase();
}

/** Checks the flags; `notices` are the command line's lines about ignored upstream flags. */
export function agentConfig(a: AgentFlagValues, notices: string[]): AgentConfig {
  const host = a['proxy-server-host'];
  if (!host) throw new UsageError('--proxy-server-host is required');
  if (!a['ca-cert']) throw new UsageError('--ca-cert is required: the agent always verifies the proxy server');
  if (!!a['agent-cert'] !== !!a['agent-key']) throw new UsageError('--agent-cert and --agent-key go together');
  try {
    parseAgentIdentifiers(a['agent-identifiers']);
  } catch (err) {
    throw new UsageError(`--agent-identifiers: ${(err as Error).message}`);
  }
  const agentID = a['agent-id'] ?? (process.env.PROXY_AGENT_ID || defaultAgentID());
  if (!agentID || /\s/.test(agentID)) throw new UsageError(`--agent-id must be non-empty without spaces, got ${JSON.stringify(agentID)}`);
  const nodeSide = nodeSideFromFlags({ bindAddress: a['bind-address'], targets: a.target, interfaceName: a['bind-interface'], interfaceType: a['bind-interface-type'] });
  const node = nodeSide && { ...nodeSide, tunnelWaitMs: duration('tunnel-wait-timeout', a['tunnel-wait-timeout']) };
  const healthPort = port('health-server-port', a['health-server-port'], true);
  const adminPort = port('admin-server-port', a['admin-server-port'], true);
  // Upstream's --health-server-host: empty means every address.
  const healthHost = a['health-server-host'] === undefined ? a['health-bind-address'] : a['health-server-host'] || '0.0.0.0';
  const alpnProtocols = a['alpn-proto'].flatMap((p) => p.split(',')).filter((p) => p !== '');
  for (const p of alpnProtocols) {
    if (p.length > 255 || !/^[\x21-\x7e]+$/.test(p)) throw new UsageError(`--alpn-proto ${JSON.stringify(p.slice(0, 40))}: 1-255 printable characters without spaces`);
  }
  const initialMs = duration('sync-interval', a['sync-interval']);
  const maxMs = duration('sync-interval-cap', a['sync-interval-cap']);
  if (maxMs < initialMs) throw new UsageError('--sync-interval-cap must not be shorter than --sync-interval');
  const leases = a['count-server-leases']
    ? { kube: kubeClientConfig(a), namespace: a['lease-namespace'], selector: leaseSelectorFlag(a['lease-label']) }
    : undefined;
  if (a['service-account-token-path'] === '') throw new UsageError('--service-account-token-path must not be empty');
  return {
    agentID,
    agentIdentifiers: a['agent-identifiers'],
    server: {
      host,
      port: port('proxy-server-port', a['proxy-server-port'], false),
      caFile: a['ca-cert'],
      certFile: a['agent-cert'],
      keyFile: a['agent-key'],
      serverName: a['tls-server-name'],
      alpnProtocols,
    },
    tokenFile: a['service-account-token-path'],
    ...(leases ? { leases } : {}),
    serverCountSource: parseServerCountSource(a['server-count-source']),
    syncForever: a['sync-forever'],
    dialTimeoutMs: duration('dial-timeout', a['dial-timeout']),
    connectTimeoutMs: duration('connect-timeout', a['connect-timeout']),
    reconnect: { initialMs, maxMs },
    shutdownGraceMs: duration('shutdown-grace-period', a['shutdown-grace-period']),
    health: healthPort > 0 ? { host: healthHost, port: healthPort } : undefined,
    admin: adminPort > 0 ? { host: a['admin-bind-address'], port: adminPort, profiling: a['enable-profiling'] } : undefined,
    node,
    maxConnectionWindowBytes: connectionWindowFlag('max-connection-window', a['max-connection-window'], DEFAULT_LIMITS.windowBytes),
    maxCpToNodeConnections: countFlag('max-cp-to-node-connections', a['max-cp-to-node-connections']),
    peerReadTimeoutMs: duration('peer-read-timeout', a['peer-read-timeout']),
    transport: choiceFlag('transport', a.transport, TRANSPORT_NAMES),
    logLevel: logLevelFrom(a['log-level'], a.v),
    notices,
  };
}
