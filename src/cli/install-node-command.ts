/**
 * `kanal install-node [--root DIR] [--uninstall] -- <agent flags>`: installs
 * the kanal-agent unit, its drop-in, the kubelet drop-in and
 * /etc/kanal/agent.env, idempotently; run from the kanal executable, also the
 * executable itself as /usr/local/bin/kanal (program.ts). The agent flags are
 * validated exactly as `kanal agent` validates them before anything is written.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Argv, InferredOptionTypes } from 'yargs';
import { withExamples } from './help-examples.js';
import { parseAgentFlags, FILE_FLAGS } from './install/agent-flags.js';
import { planNodeInstall, PATHS, RESTART_BACKOFF_SYSTEMD } from './install/node-plan.js';
import { applyPlan, uninstall, underRoot, type Change } from './install/apply.js';
import { detectSystemdVersion, systemctl, systemdRunning } from './install/systemd.js';
import { KANAL_BINARY, programForm } from './install/program.js';
import { UsageError } from '../common/usage-error.js';

export const installNodeFlags = {
  root: { type: 'string', default: '/', describe: 'Install into this directory as if it were / (image builds, tests)' },
  uninstall: { type: 'boolean', default: false, describe: 'Remove everything install-node installed (credentials in /etc/kanal stay)' },
  'systemd-version': {
    type: 'number',
    describe: `systemd major version of the node (default: from systemctl --version); >= ${RESTART_BACKOFF_SYSTEMD} enables the restart back-off`,
  },
  'dry-run': { type: 'boolean', default: false, describe: 'Validate and show what would change, write nothing' },
} as const;

export type InstallNodeArgs = InferredOptionTypes<typeof installNodeFlags> & { '--'?: (string | number)[] };

export function installNodeBuilder(y: Argv): Argv<InstallNodeArgs> {
  const y2 = y.options(installNodeFlags).parserConfiguration({ 'camel-case-expansion': false, 'strip-aliased': true, 'populate--': true });
  return withExamples(y2, [
    {
      what: 'Install the agent unit with these flags',
      lines: [
        '$0 install-node -- --proxy-server-host cp.example',
        '--ca-cert /etc/kanal/ca.crt --agent-cert /etc/kanal/agent.crt',
        '--agent-key /etc/kanal/agent.key',
        '--bind-address 10.200.0.1 --target 6443:127.0.0.1:6443',
      ],
    },
    { what: 'Remove it again', lines: ['$0 install-node --uninstall'] },
  ]);
}

function report(out: string[], changes: readonly Change[], dryRun: boolean): number {
  const changed = changes.filter((c) => c.kind !== 'unchanged');
  for (const c of changes) {
    const from = c.source === undefined ? '' : ` (copy of ${c.source})`;
    out.push(`  ${(dryRun && c.kind !== 'unchanged' ? `would be ${c.kind}` : c.kind).padEnd(18)} ${c.path}${from}`);
  }
  return changed.length;
}

/** Synchronous: every step is a file or a systemctl call; a mistake throws (UsageError: exit 2). */
export function runInstallNode(args: InstallNodeArgs): void {
  const root = path.resolve(args.root);
  if (!fs.existsSync(root) || !fs.statSync(root).isDirectory()) throw new UsageError(`--root ${args.root}: not a directory`);
  const words = (args['--'] ?? []).map(String);
  const dryRun = args['dry-run'];
  const realRoot = root === '/';
  const manageSystemd = realRoot && !dryRun && systemdRunning();
  const out: string[] = [];

  if (args.uninstall) {
    if (words.length > 0) throw new UsageError('--uninstall takes no agent flags');
    if (manageSystemd) systemctl(['stop', 'kanal-agent.service']); // tears the interface down before the files go
    out.push(`kanal install-node --uninstall: ${dryRun ? 'would remove' : 'removing'} from ${root}`);
    const changes = uninstall(root, dryRun);
    const n = report(out, changes, dryRun);
    out.push(
      n === 0
        ? 'nothing to remove: kanal-agent is not installed here'
        : `${n} path(s) ${dryRun ? 'would be ' : ''}removed; anything else under /etc/kanal (credentials) is left in place`,
    );
    // The program may also run kanal-server.service or an operator's checks: removing it is the operator's call.
    if (fs.existsSync(underRoot(root, KANAL_BINARY))) out.push(`${KANAL_BINARY} stays: rm it once nothing else runs it`);
    if (manageSystemd && n > 0) {
      const err = systemctl(['daemon-reload']);
      out.push(err ? `warning: systemctl daemon-reload failed: ${err}` : 'systemd reloaded');
    }
    process.stdout.write(`${out.join('\n')}\n`);
    return;
  }

  // Everything is validated before the first write.
  const flags = parseAgentFlags(words);
  if (args['systemd-version'] !== undefined && (!Number.isInteger(args['systemd-version']) || args['systemd-version'] < 1)) {
    throw new UsageError(`--systemd-version must be a positive integer, got ${args['systemd-version']}`);
  }
  const detected = args['systemd-version'] ?? detectSystemdVersion();
  const systemdVersion = detected ?? 0;
  const form = programForm();
  const plan = planNodeInstall({ flags, systemdVersion, ...(form.kind === 'executable' ? { executable: form.path } : {}) });

  out.push(
    `kanal install-node: ${dryRun ? 'checking' : 'installing into'} ${root} (systemd ${detected ?? 'unknown: assuming no restart back-off support'})`,
  );
  const changes = applyPlan(root, plan, dryRun);
  const n = report(out, changes, dryRun);

  for (const flag of FILE_FLAGS) {
    const file = flags.args[flag];
    if (file && !fs.existsSync(underRoot(root, file)))
      out.push(`  note: --${flag} ${file} does not exist yet; put it there before starting the agent`);
  }
  if (form.kind === 'npm' && !fs.existsSync(underRoot(root, KANAL_BINARY)))
    out.push(
      `  note: ${KANAL_BINARY} does not exist; the unit runs it: run install-node from the kanal executable (it installs itself), or npm install --global --prefix /usr/local kanal-<version>.tgz`,
    );

  if (n === 0) {
    out.push('nothing changed: already installed with these flags');
  } else {
    out.push(`${n} path(s) ${dryRun ? 'would change' : 'changed'}`);
    if (manageSystemd) {
      const err = systemctl(['daemon-reload']);
      out.push(
        err ? `warning: systemctl daemon-reload failed: ${err}` : 'systemd reloaded; apply with: systemctl restart kanal-agent.service',
      );
    } else if (realRoot && !dryRun) {
      out.push('systemd is not running here; the unit is enabled and starts at the next boot');
    }
  }
  if (!dryRun) out.push(`check the node with: . ${PATHS.envFile} && kanal agent --check $KANAL_AGENT_FLAGS`);
  process.stdout.write(`${out.join('\n')}\n`);
}
