/** `kanal agent`: its settings (src/agent/settings.ts) on the command line, validation, start. */
import { auditLogFileOptions } from '../audit/settings.js';
import type { Argv } from 'yargs';
import { createLogger } from '../common/logger.js';
import type { ServerTunnelsOptions } from '../agent/server-tunnels.js';
import { KanalAgent } from '../agent/agent.js';
import { agentConfig, type AgentConfig } from '../agent/config.js';
import { agentSettings, FLAG, type AgentGiven } from '../agent/settings.js';
import { keyOf } from '../settings/flag-names.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { agentStartChecks } from './start-checks.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import type { ClientTlsOptions } from '../transport/transport.js';
import { UsageError } from '../common/usage-error.js';
import { withSettings } from './with-settings.js';
import { withExamples } from './help-examples.js';
import { readSettings, upstreamNotices } from '../settings/table.js';
import { runUntilSignalled } from './lifecycle.js';
import { loadTransport } from '../transport/choice.js';
import { runPreflight, formatPreflight, preflightPassed } from '../agent/preflight.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { ServiceAccountTokenSource } from '../agent/service-account-token.js';
import { buildInfo } from './build-info.js';

/** What yargs hands `kanal agent`, typed by its settings. */
export type AgentArgs = AgentGiven;

/** The agent's configuration from its command line: each setting parsed by its entry (src/agent/settings.ts), then the checks that tie them together (src/agent/config.ts). */
export function validateAgentArgs(a: AgentArgs): AgentConfig {
  return agentConfig(readSettings(agentSettings, a), upstreamNotices(a, agentSettings));
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
  const ca = check.certificates({ flag: keyOf(agentSettings, 'ca-cert'), path: s.caFile });
  const pair =
    s.certFile && s.keyFile
      ? check.keyPair(
          { flag: keyOf(agentSettings, 'agent-cert'), path: s.certFile },
          { flag: keyOf(agentSettings, 'agent-key'), path: s.keyFile },
          'client',
        )
      : undefined;
  const tokenFile = config.settings['service-account-token-path'];
  if (tokenFile) check.token({ flag: keyOf(agentSettings, 'service-account-token-path'), path: tokenFile });
  check.done();
  return {
    tls: { ca: ca!.pem, cert: pair?.cert.pem, key: pair?.key.pem, serverName: s.serverName, alpnProtocols: s.alpnProtocols },
    warnings: check.warnings,
  };
}

export async function buildAgentOptions(
  config: AgentConfig,
  credentials: AgentCredentials = loadAgentCredentials(config),
): Promise<ServerTunnelsOptions> {
  const v = config.settings;
  const log = createLogger(config.logLevel, 'agent', config.logFormat).child({ agentID: v['agent-id'] });
  const s = config.server;
  const tokenFile = v['service-account-token-path'];
  const token = tokenFile === undefined ? undefined : new ServiceAccountTokenSource(tokenFile);
  return {
    agentID: v['agent-id'],
    agentIdentifiers: v['agent-identifiers'],
    server: { hosts: s.addresses, tls: credentials.tls },
    token: token && (() => token.readSync()),
    serverCount: { source: v['server-count-source'] },
    ...(config.node ? { targets: config.node.targets } : {}),
    syncForever: v['sync-forever'],
    dialTimeoutMs: v['dial-timeout'],
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

/** `forHelp`: whether --help was asked for (withSettings). */
export function agentBuilder(y: Argv, forHelp = true): Argv<AgentArgs> {
  return withExamples(withSettings(y, agentSettings, forHelp), [
    {
      what: 'Control plane -> node only, mTLS',
      lines: ['$0 agent --proxy-server-host cp.example --ca-cert ca.crt', '--agent-cert agent.crt --agent-key agent.key'],
    },
    {
      what: 'Also serve the kube-apiserver (advertise address 10.200.0.1) on the node',
      lines: ['$0 agent ... --bind-address 10.200.0.1 --target 6443:10.0.0.10:6443'],
    },
    {
      what: 'Check the credentials, the server and the node before the first start',
      lines: ['$0 agent ... --check'],
    },
  ]);
}

/** `--check`: runs the preflight checks (against the first server address given), prints the list, sets the exit code (0 all passed, 1 otherwise). */
async function runAgentCheck(config: AgentConfig): Promise<void> {
  const { addresses, ...verification } = config.server;
  const s = { ...verification, ...addresses[0] };
  const v = config.settings;
  const results = await runPreflight({
    agentID: v['agent-id'],
    agentIdentifiers: v['agent-identifiers'],
    server: s,
    tokenFile: v['service-account-token-path'],
    connectTimeoutMs: v['connect-timeout'],
    dialTimeoutMs: v['dial-timeout'],
    node: config.node,
    healthPort: config.health?.port,
    transport: await loadTransport(v.transport),
    log: createLogger('silent', 'agent-check'),
  });
  process.stdout.write(formatPreflight(results, `kanal agent --check (agent ID ${v['agent-id']}, server ${s.host}:${s.port})`));
  process.exitCode = preflightPassed(results) ? 0 : 1;
}

export async function runAgent(args: AgentArgs): Promise<void> {
  const config = validateAgentArgs(args);
  if (args['dry-run'] && args.check) throw new UsageError(`${FLAG['dry-run']} and --check exclude each other`);
  if (args.check) {
    await runAgentCheck(config);
    return;
  }
  if (args['dry-run']) {
    await dryRun(config, async () => {
      const credentials = loadAgentCredentials(config);
      await agentStartChecks(config);
      return credentials;
    });
    return;
  }
  // Before anything else: a bad file is a permanent mistake, not worth a retry.
  const credentials = loadAgentCredentials(config);
  // The same checks as --dry-run, before anything is created.
  await agentStartChecks(config);
  const options = await buildAgentOptions(config, credentials);
  const log = options.log;
  for (const w of credentials.warnings) log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) log.warn(notice);
  if (args.kubeconfig && !config.leases) log.warn(`--kubeconfig is not used: ${FLAG['count-server-leases']} is off`);
  enableGcPacing();
  const auditLog = auditLogFileOptions(config.settings);
  const kanalAgent = new KanalAgent({
    tunnels: options,
    leases: config.leases,
    node: config.node,
    admin: config.admin,
    build: buildInfo(),
    ...(auditLog ? { auditLog } : {}),
  });
  const agent = kanalAgent.tunnels;
  await kanalAgent.start();
  // systemd (Type=notify): READY=1 once the listeners are bound and the first
  // tunnel is up, or after --connect-timeout at the latest so an unreachable
  // control plane never blocks the kubelet (ordered after us) for good.
  const notifier = new SystemdNotifier((reason) => log.warn({ reason }, 'cannot notify systemd'));
  const status = (): string => agent.readiness().detail;
  agent.onTunnelChange(() => (notifier.isReady ? notifier.status(status()) : notifier.ready(status())));
  setTimeout(() => notifier.ready(status()), config.settings['connect-timeout']).unref();
  const reclaimer = startMemoryReclaimer(agent.metrics, log);
  runUntilSignalled(log, async () => {
    reclaimer.stop();
    notifier.stopping('draining');
    await kanalAgent.stop(config.settings['shutdown-grace-period']);
    // Last line: everything the agent created is gone.
    log.info('kanal agent stopped');
  });
}
