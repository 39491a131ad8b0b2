/**
 * What `kanal install-node` puts on a node, as data: every path it manages,
 * with the exact bytes and mode each should have. Applying the plan (and
 * removing it) is apply.ts; nothing here touches the file system (the unit
 * templates are in the program: unit-templates.ts).
 */
import type { AgentFlagSet } from './agent-flags.js';
import { KANAL_BINARY } from './program.js';
import { UNIT_TEMPLATES } from './unit-templates.js';
import { FLAG } from '../../agent/settings.js';

export const UNIT_DIR = '/etc/systemd/system';
export const AGENT_UNIT = 'kanal-agent.service';
export const PATHS = {
  unit: `${UNIT_DIR}/${AGENT_UNIT}`,
  unitDropIn: `${UNIT_DIR}/${AGENT_UNIT}.d/50-install.conf`,
  kubeletDropIn: `${UNIT_DIR}/kubelet.service.d/10-kanal.conf`,
  wantsLink: `${UNIT_DIR}/multi-user.target.wants/${AGENT_UNIT}`,
  envFile: '/etc/kanal/agent.env',
  modulesLoad: '/etc/modules-load.d/kanal.conf',
} as const;

/** Every path install-node may create, in removal order (links and drop-ins first). */
export const MANAGED_PATHS: readonly string[] = [
  PATHS.wantsLink,
  PATHS.kubeletDropIn,
  PATHS.unitDropIn,
  PATHS.unit,
  PATHS.envFile,
  PATHS.modulesLoad,
];

/**
 * Directories removed on uninstall when they are empty afterwards. System
 * directories (multi-user.target.wants, modules-load.d) stay; /etc/kanal stays
 * while credentials are in it.
 */
export const MANAGED_DIRS: readonly string[] = [`${UNIT_DIR}/${AGENT_UNIT}.d`, `${UNIT_DIR}/kubelet.service.d`, '/etc/kanal'];

/** Directory modes for directories install-node has to create. */
export const DIR_MODES: Readonly<Record<string, number>> = { '/etc/kanal': 0o750 };

/** systemd gained RestartSteps= and RestartMaxDelaySec= (restart back-off) in v254. */
export const RESTART_BACKOFF_SYSTEMD = 254;

/**
 * A file with these bytes, a symbolic link, or a copy of a file on this
 * machine (the kanal executable, too big to hold as bytes). A copy is never a
 * managed path: a re-install in the npm form or --uninstall leaves the program
 * alone, since the same file may run kanal-server.service.
 */
export type PlannedEntry =
  | { path: string; kind: 'file'; content: Buffer; mode: number }
  | { path: string; kind: 'symlink'; target: string }
  | { path: string; kind: 'copy'; source: string; mode: number };

export interface PlanOptions {
  flags: AgentFlagSet;
  /** Major version of the node's systemd; decides whether the restart back-off keys are written. */
  systemdVersion: number;
  /** The kanal executable to install as /usr/local/bin/kanal (absent in the npm form: npm installed it). */
  executable?: string;
}

const HEADER = '# Managed by `kanal install-node`: re-run it to change this file (manual edits are overwritten).\n';

function seconds(ms: number): number {
  return Math.ceil(ms / 1000);
}

/** Ports the agent will bind below the host's unprivileged port start (1024 unless lowered). */
export function privilegedPorts(flags: AgentFlagSet): number[] {
  const ports = flags.config.node?.targets.map((t) => t.localPort) ?? [];
  const health = flags.config.health?.port;
  if (health) ports.push(health);
  return ports.filter((p) => p > 0 && p < 1024);
}

/** The capabilities the agent needs with these flags (least privilege). */
export function neededCapabilities(flags: AgentFlagSet): string[] {
  const caps: string[] = [];
  const node = flags.config.node;
  if (node && node.interfaceType !== 'none') caps.push('CAP_NET_ADMIN');
  if (privilegedPorts(flags).length > 0) caps.push('CAP_NET_BIND_SERVICE');
  return caps;
}

/** 50-install.conf: the unit settings that follow from the flags. */
export function unitDropIn(flags: AgentFlagSet, systemdVersion: number): string {
  const c = flags.config;
  const caps = neededCapabilities(flags);
  const lines = [
    HEADER.trimEnd(),
    '# Values derived from the flags in /etc/kanal/agent.env.',
    '[Service]',
    `# ${FLAG['connect-timeout']} ${seconds(c.settings['connect-timeout'])}s: READY=1 comes at the latest then, plus start-up time.`,
    `TimeoutStartSec=${seconds(c.settings['connect-timeout']) + 30}s`,
    `# ${FLAG['shutdown-grace-period']} ${seconds(c.settings['shutdown-grace-period'])}s plus time to close connections and remove the interface.`,
    `TimeoutStopSec=${seconds(c.settings['shutdown-grace-period']) + 15}s`,
    `# Capabilities these flags need: ${caps.length > 0 ? caps.join(', ') : 'none'}${privilegedPorts(flags).length > 0 ? ` (ports ${privilegedPorts(flags).join(', ')} < 1024)` : ''}.`,
    'CapabilityBoundingSet=',
    'AmbientCapabilities=',
  ];
  if (caps.length > 0) lines.push(`CapabilityBoundingSet=${caps.join(' ')}`, `AmbientCapabilities=${caps.join(' ')}`);
  if (systemdVersion >= RESTART_BACKOFF_SYSTEMD) {
    lines.push(
      `# systemd ${systemdVersion} >= ${RESTART_BACKOFF_SYSTEMD}: back off from RestartSec=2s to 1 minute over 10 restarts.`,
      'RestartSteps=10',
      'RestartMaxDelaySec=60s',
    );
  } else {
    lines.push(
      `# systemd ${systemdVersion} < ${RESTART_BACKOFF_SYSTEMD} has no RestartSteps=: restarts stay RestartSec=2s apart (the agent backs off reconnects itself).`,
    );
  }
  return `${lines.join('\n')}\n`;
}

/** /etc/kanal/agent.env: one variable, the words as given. */
export function envFile(flags: AgentFlagSet): string {
  return (
    HEADER +
    '# kanal-agent.service runs: kanal agent $KANAL_AGENT_FLAGS\n' +
    '# Check them with: . /etc/kanal/agent.env && kanal agent --check $KANAL_AGENT_FLAGS\n' +
    `KANAL_AGENT_FLAGS="${flags.words.join(' ')}"\n`
  );
}

export function planNodeInstall(opts: PlanOptions): PlannedEntry[] {
  const read = (name: keyof typeof UNIT_TEMPLATES): Buffer => Buffer.from(UNIT_TEMPLATES[name]);
  const entries: PlannedEntry[] = [
    // The program first: the unit that runs it comes after it in the report.
    ...(opts.executable === undefined ? [] : [{ path: KANAL_BINARY, kind: 'copy', source: opts.executable, mode: 0o755 } as const]),
    { path: PATHS.unit, kind: 'file', content: read(AGENT_UNIT), mode: 0o644 },
    { path: PATHS.unitDropIn, kind: 'file', content: Buffer.from(unitDropIn(opts.flags, opts.systemdVersion)), mode: 0o644 },
    { path: PATHS.kubeletDropIn, kind: 'file', content: read('kubelet.service.d/10-kanal.conf'), mode: 0o644 },
    { path: PATHS.envFile, kind: 'file', content: Buffer.from(envFile(opts.flags)), mode: 0o640 },
    // What `systemctl enable` does for WantedBy=multi-user.target.
    { path: PATHS.wantsLink, kind: 'symlink', target: PATHS.unit },
  ];
  const node = opts.flags.config.node;
  if (node && node.interfaceType === 'dummy') {
    // Load the dummy module at boot rather than rely on autoloading from the hardened unit.
    entries.push({
      path: PATHS.modulesLoad,
      kind: 'file',
      content: Buffer.from(`${HEADER}# kanal-agent creates a dummy interface (${FLAG['bind-interface-type']} dummy).\ndummy\n`),
      mode: 0o644,
    });
  }
  return entries;
}
