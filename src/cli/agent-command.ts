/** `kanal agent`: its settings (src/agent/settings.ts) on the command line, validation, start. */
import type { Argv } from 'yargs';
import { createLogger } from '../common/logger.js';
import { KanalAgent } from '../agent/agent.js';
import { agentConfig, type AgentConfig } from '../agent/config.js';
import { agentSettings, FLAG, type AgentGiven } from '../agent/settings.js';
import { keyOf } from '../settings/flag-names.js';
import { CredentialCheck } from '../common/credential-files.js';
import { dryRun } from './dry-run.js';
import { agentStartChecks } from './start-checks.js';
import { enableGcPacing } from '../tunnel/gc-pacer.js';
import { startMemoryReclaimer } from '../common/memory-reclaimer.js';
import { UsageError } from '../common/usage-error.js';
import { withSettings } from './with-settings.js';
import { withExamples } from './help-examples.js';
import { readSettings, upstreamNotices } from '../settings/table.js';
import { runUntilSignalled } from './lifecycle.js';
import { loadTransport } from '../transport/choice.js';
import { runPreflight, formatPreflight, preflightPassed } from '../agent/preflight.js';
import { SystemdNotifier } from '../../native/sd-notify.js';
import { buildInfo } from './build-info.js';
import { assembleAgent, type AgentCredentials } from '../agent/assembly.js';

export type { AgentCredentials } from '../agent/assembly.js';

/** What yargs hands `kanal agent`, typed by its settings. */
export type AgentArgs = AgentGiven;

/** The agent's configuration from its command line: each setting parsed by its entry (src/agent/settings.ts), then the checks that tie them together (src/agent/config.ts). */
export function validateAgentArgs(a: AgentArgs): AgentConfig {
  return agentConfig(readSettings(agentSettings, a), upstreamNotices(a, agentSettings));
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

/** `forHelp`: whether --help was asked for (withSettings). */
export function agentBuilder(y: Argv, forHelp = true): Argv<AgentArgs> {
  return withExamples(
    withSettings(y, agentSettings, forHelp),
    [
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
    ],
    forHelp,
  );
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
    ...(v['cluster-dns'] ? { names: { clusterDns: v['cluster-dns'], clusterDomain: v['cluster-domain'] } } : {}),
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
  const options = await assembleAgent(config, credentials, buildInfo());
  const log = options.tunnels.log;
  for (const w of credentials.warnings) log.warn({ problem: w }, 'certificate outside its validity period');
  for (const notice of config.notices) log.warn(notice);
  if (args.kubeconfig && !config.leases) log.warn(`--kubeconfig is not used: ${FLAG['count-server-leases']} is off`);
  enableGcPacing();
  const kanalAgent = new KanalAgent(options);
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
