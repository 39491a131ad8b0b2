/**
 * `kanal agent`'s one assembly: from the validated configuration and the
 * credentials read for it to complete AgentOptions (the tunnels, the lease
 * counter's API client settings, the node side, the admin port, the audit
 * log, the build). The CLI and the in-process kit both build an agent here,
 * so a test that starts one in process runs what users run. Nothing edits
 * the options after this.
 */
import type { Logger } from 'pino';
import { auditLogFileOptions } from '../audit/settings.js';
import { createLogger } from '../common/logger.js';
import type { ClientTlsOptions } from '../transport/transport.js';
import { loadTransport } from '../transport/choice.js';
import type { FeatureSet } from '../wire/features.js';
import type { AgentOptions } from './agent.js';
import type { AgentConfig } from './config.js';
import type { NodeSideOptions } from './node-side-config.js';
import type { ServerTunnelsOptions } from './server-tunnels.js';
import { ServiceAccountTokenSource } from './service-account-token.js';
import { NameResolver } from './name-resolver.js';

/** The credential files' contents (src/cli/agent-command.ts loadAgentCredentials). */
export interface AgentCredentials {
  tls: ClientTlsOptions;
  /** Certificates outside their validity period: logged, not fatal (see credential-files.ts). */
  warnings: string[];
}

/** What a caller sets that no flag can say; each is named so the few test-only differences stay visible. */
export interface AgentOverrides {
  /** Replaces the logger the configuration names (a test's captured one). */
  log?: Logger;
  /** Health port on this host with a port the kernel picks (the flag can only name a port, or 0 = off). */
  ephemeralHealthHost?: string;
  /** What the agent offers (no flag: a test stands for an agent without Kanal's extensions). */
  features?: FeatureSet;
  /** Node -> control plane listeners as options (a test's loopback address with interfaceType 'none'). */
  node?: NodeSideOptions;
}

/** The tunnels' options of the settings alone. */
export async function buildAgentOptions(config: AgentConfig, credentials: AgentCredentials): Promise<ServerTunnelsOptions> {
  const v = config.settings;
  const log = createLogger(config.logLevel, 'agent', config.logFormat).child({ agentID: v['agent-id'] });
  const s = config.server;
  const tokenFile = v['service-account-token-path'];
  const token = tokenFile === undefined ? undefined : new ServiceAccountTokenSource(tokenFile);
  const clusterDns = v['cluster-dns'];
  const names = new NameResolver({ ...(clusterDns ? { clusterDns } : {}), clusterDomain: v['cluster-domain'] });
  return {
    agentID: v['agent-id'],
    agentIdentifiers: v['agent-identifiers'],
    server: { hosts: s.addresses, tls: credentials.tls },
    token: token && (() => token.readSync()),
    serverCount: { source: v['server-count-source'] },
    ...(config.node ? { targets: config.node.targets } : {}),
    syncForever: v['sync-forever'],
    dialTimeoutMs: v['dial-timeout'],
    resolveHandler: names.resolve,
    connectTimeoutMs: v['connect-timeout'],
    keepalive: { intervalMs: v['keepalive-time'], timeoutMs: v['keepalive-timeout'] },
    resumeTimeoutMs: v['resume-timeout'],
    reconnect: config.reconnect,
    health: config.health,
    limits: {
      maxWindowBytes: v['max-connection-window'],
      peerReadTimeoutMs: v['peer-read-timeout'],
      maxInboundConnections: v['max-cp-to-node-connections'],
      maxOutboundConnections: v['max-node-to-cp-connections'],
      maxPendingDials: v['max-pending-dials'],
      dialRate: v['dial-rate'],
      dialBurst: v['dial-burst'],
    },
    transport: await loadTransport(v.transport),
    log,
  };
}

/** The complete options of a KanalAgent for `config`; `build`: Kanal's version and commit, for its /status. */
export async function assembleAgent(
  config: AgentConfig,
  credentials: AgentCredentials,
  build: { version: string; commit: string },
  overrides: AgentOverrides = {},
): Promise<AgentOptions> {
  const base = await buildAgentOptions(config, credentials);
  const health =
    overrides.ephemeralHealthHost !== undefined ? { ...base.health, host: overrides.ephemeralHealthHost, port: 0 } : base.health;
  const tunnels: ServerTunnelsOptions = {
    ...base,
    health,
    ...(overrides.log ? { log: overrides.log } : {}),
    ...(overrides.features ? { features: overrides.features } : {}),
  };
  const node = overrides.node ?? config.node;
  const auditLog = auditLogFileOptions(config.settings);
  return {
    tunnels,
    leases: config.leases,
    ...(node ? { node } : {}),
    admin: config.admin,
    build,
    ...(auditLog ? { auditLog } : {}),
  };
}
