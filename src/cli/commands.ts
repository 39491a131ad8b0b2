/** The `kanal` command: yargs parses, the command modules validate and run. */
import type { Argv } from 'yargs';
import { errorMessage } from '../common/error-message.js';
import { escapeForTerminal } from '../common/terminal-text.js';
import { UsageError } from '../common/usage-error.js';
import { buildInfo } from './build-info.js';
import { skipHelpLayout } from './help-layout.js';
import { exitAfterLogs } from './lifecycle.js';
import { PARSER_CONFIGURATION } from './parser-configuration.js';
import { unknownFlagsMessage } from './unknown-flags.js';

const EXIT_USAGE = 2;

/** A command's last words; its message may quote a peer (a server's answer), so it is escaped (terminal-text.ts). */
function report(err: unknown): number {
  process.stderr.write(`kanal: ${escapeForTerminal(errorMessage(err), { keepNewlines: true })}\n`);
  return err instanceof UsageError ? EXIT_USAGE : 1;
}

/** A command failed: the log lines it wrote go out first (bounded wait). */
function fail(err: unknown): void {
  exitAfterLogs(report(err));
}

/** The flags of the command being run, for "did you mean" (unknown-flags.ts); filled by its add(). */
const knownFlags: string[] = ['help', 'version'];

/**
 * Each command with its flags and handler, imported only when it is the one
 * run: one command's module graph is memory another never uses (docs/memory.md).
 * `forHelp`: whether --help was asked for (src/cli/with-settings.ts).
 */
const COMMANDS = {
  server: {
    describe: 'Run the proxy server beside the kube-apiserver',
    async add(y: Argv, forHelp: boolean): Promise<Argv> {
      const [{ serverBuilder, runServer }, { serverSettings }] = await Promise.all([
        import('./server-command.js'),
        import('../server/config/settings.js'),
      ]);
      knownFlags.push(...Object.keys(serverSettings));
      return y.command(
        'server',
        this.describe,
        (c) => serverBuilder(c, forHelp),
        (args) => runServer(args).catch(fail),
      );
    },
  },
  agent: {
    describe: 'Run the proxy agent on a node',
    async add(y: Argv, forHelp: boolean): Promise<Argv> {
      const [{ agentBuilder, runAgent }, { agentSettings }] = await Promise.all([
        import('./agent-command.js'),
        import('../agent/settings.js'),
      ]);
      knownFlags.push(...Object.keys(agentSettings));
      return y.command(
        'agent',
        this.describe,
        (c) => agentBuilder(c, forHelp),
        (args) => runAgent(args).catch(fail),
      );
    },
  },
  'install-node': {
    describe: 'Install the agent as a systemd unit that starts before the kubelet',
    async add(y: Argv): Promise<Argv> {
      const { installNodeBuilder, runInstallNode, installNodeFlags } = await import('./install-node-command.js');
      knownFlags.push(...Object.keys(installNodeFlags));
      return y.command('install-node', this.describe, installNodeBuilder, (args) =>
        Promise.resolve()
          .then(() => runInstallNode(args))
          .catch(fail),
      );
    },
  },
  status: {
    describe: 'Show what the server or agent on this host holds now (agents, tunnels, connections) from its admin port',
    async add(y: Argv): Promise<Argv> {
      const { statusBuilder, runStatus } = await import('./status-command.js');
      return y.command('status', this.describe, statusBuilder, (args) => runStatus(args).catch(fail));
    },
  },
  version: {
    describe: "Print Kanal's version, commit, form and runtime",
    async add(y: Argv): Promise<Argv> {
      const { versionBuilder, runVersion, versionFlags } = await import('./version-command.js');
      knownFlags.push(...Object.keys(versionFlags));
      return y.command('version', this.describe, versionBuilder, (args) =>
        Promise.resolve()
          .then(() => runVersion(args))
          .catch(fail),
      );
    },
  },
};
type CommandName = keyof typeof COMMANDS;

function isCommandName(s: string): s is CommandName {
  return Object.hasOwn(COMMANDS, s);
}

export async function main(): Promise<void> {
  const [{ default: yargs }, { hideBin }] = await Promise.all([import('yargs'), import('yargs/helpers')]);
  const argv = hideBin(process.argv);
  let y = yargs(argv)
    .scriptName('kanal')
    .usage('$0 <command> [flags]\n\nBidirectional Kubernetes apiserver network proxy (Konnectivity-compatible).');
  // The first word naming a command is the command yargs will run; the others are listed by name only.
  const chosen = argv.find(isCommandName);
  const forHelp = argv.some((a) => a === '--help' || a.startsWith('--help='));
  for (const [name, command] of Object.entries(COMMANDS)) {
    y = name === chosen ? await command.add(y, forHelp) : y.command(name, command.describe);
  }
  if (!forHelp) skipHelpLayout(y);
  await y
    .demandCommand(1, 'name a command: server, agent, install-node, status or version')
    .strict()
    .parserConfiguration(PARSER_CONFIGURATION)
    .wrap(Math.min(110, process.stdout.columns || 110))
    .fail((message, err) => {
      if (err) process.exit(report(err));
      const said = (message.startsWith('Unknown argument') && unknownFlagsMessage(argv, knownFlags)) || message;
      process.stderr.write(`kanal: ${said}\nRun "kanal --help" or "kanal <command> --help" for usage.\n`);
      process.exit(EXIT_USAGE);
    })
    .help()
    .version(buildInfo().version)
    .parseAsync();
}

/** Runs the command line; a failure is reported and sets the exit status. */
export function run(): void {
  main().catch(fail);
}
