/**
 * The agent's configuration from its parsed settings (settings.ts): the
 * checks that tie several settings together, and the shape the agent is
 * assembled from. Reads no file; mistakes are UsageErrors (exit 2).
 */
import type { LevelWithSilent } from 'pino';
import type { LogFormat } from '../common/logger.js';
import { UsageError } from '../common/usage-error.js';
import { logLevelFrom } from '../settings/process-settings.js';
import { kubeClientConfig } from '../kube/settings.js';
import type { AgentOptions } from './agent.js';
import { nodeSideFromSettings, type NodeSideOptions } from './node-side-config.js';
import { FLAG, type AgentSettings } from './settings.js';
import { withPorts } from './server-addresses.js';
import type { HostPort } from '../common/host-port.js';
import type { HealthPortOptions } from '../common/health-server.js';
import { httpPortLimits } from '../settings/http-port-settings.js';

/**
 * Every setting as its entry parsed it (`settings`, by flag name: what the
 * code reads), and what several settings make together. A setting is never
 * restated here under a second name.
 */
export interface AgentConfig {
  settings: AgentSettings;
  /**
   * The servers the agent dials and how it verifies them (--proxy-server-host
   * each with its port or --proxy-server-port, --ca-cert, --agent-cert/-key,
   * --tls-server-name, --alpn-proto).
   */
  server: { addresses: HostPort[]; caFile: string; certFile?: string; keyFile?: string; serverName?: string; alpnProtocols: string[] };
  /** `--count-server-leases`: the API client and the leases counted. */
  leases?: AgentOptions['leases'];
  /** --sync-interval .. --sync-interval-cap. */
  reconnect: { initialMs: number; maxMs: number };
  health?: HealthPortOptions;
  admin?: AgentOptions['admin'];
  node?: NodeSideOptions;
  /** --log-level, else klog's --v. */
  logLevel: LevelWithSilent;
  logFormat: LogFormat;
  /** Upstream flags given that Kanal ignores, one line each (logged at start). */
  notices: string[];
}

/** Checks what ties the settings together; `notices` are the command line's lines about ignored upstream flags. */
export function agentConfig(v: AgentSettings, notices: string[]): AgentConfig {
  if (!!v['agent-cert'] !== !!v['agent-key']) throw new UsageError(`${FLAG['agent-cert']} and ${FLAG['agent-key']} go together`);
  const nodeSide = nodeSideFromSettings({
    bindAddress: v['bind-address'],
    targets: v.target,
    interfaceName: v['bind-interface'],
    interfaceType: v['bind-interface-type'],
  });
  const node = nodeSide && { ...nodeSide, tunnelWaitMs: v['tunnel-wait-timeout'] };
  // Upstream's --health-server-host: empty means every address.
  const healthHost = v['health-server-host'] === undefined ? v['health-bind-address'] : v['health-server-host'] || '0.0.0.0';
  const initialMs = v['sync-interval'];
  const maxMs = v['sync-interval-cap'];
  if (maxMs < initialMs) throw new UsageError(`${FLAG['sync-interval-cap']} must not be shorter than ${FLAG['sync-interval']}`);
  const leases = v['count-server-leases']
    ? { kube: kubeClientConfig(v), namespace: v['lease-namespace'], selector: v['lease-label'] }
    : undefined;
  const healthPort = v['health-server-port'];
  const adminPort = v['admin-server-port'];
  return {
    settings: v,
    server: {
      addresses: withPorts(v['proxy-server-host'], v['proxy-server-port']),
      caFile: v['ca-cert'],
      certFile: v['agent-cert'],
      keyFile: v['agent-key'],
      serverName: v['tls-server-name'],
      alpnProtocols: v['alpn-proto'],
    },
    ...(leases ? { leases } : {}),
    reconnect: { initialMs, maxMs },
    health: healthPort > 0 ? { host: healthHost, port: healthPort, limits: httpPortLimits(v) } : undefined,
    admin:
      adminPort > 0
        ? { host: v['admin-bind-address'], port: adminPort, profiling: v['enable-profiling'], limits: httpPortLimits(v) }
        : undefined,
    node,
    logLevel: logLevelFrom(v['log-level'], v.v),
    logFormat: v['logging-format'],
    notices,
  };
}
