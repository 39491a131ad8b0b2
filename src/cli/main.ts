#!/usr/bin/env node
/** The `kanal` command: yargs parses, the command modules validate and run. */
import fs from 'node:fs';
import yargs from 'yargs';
import { hideBin } from 'yargs/helpers';
import { serverBuilder, runServer, type ServerArgs } from './server-command.js';
import { agentBuilder, runAgent, type AgentArgs } from './agent-command.js';
import { installNodeBuilder, runInstallNode, type InstallNodeArgs } from './install-node-command.js';
import { UsageError } from './usage-error.js';
import { exitAfterLogs } from './lifecycle.js';
import { PARSER_CONFIGURATION } from './parser-configuration.js';

const EXIT_USAGE = 2;

/**
 * The version from our own package.json (dist/src/cli/ is three levels down).
 * yargs' own lookup walks up from guesses that fail under some install paths.
 */
function packageVersion(): string {
  try {
    const pkg = JSON.parse(fs.readFileSync(new URL('../../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
    return typeof pkg.version === 'string' ? pkg.version : 'unknown';
  } catch {
    return 'unknown';
  }
}

function report(err: unknown): number {
  const message = err instanceof Error ? err.message : String(err);
  process.stderr.write(`kanal: ${message}\n`);
  return err instanceof UsageError ? EXIT_USAGE : 1;
}

/** A command failed: the log lines it wrote go out first (bounded wait). */
function fail(err: unknown): void {
  exitAfterLogs(report(err));
}

async function main(argv: string[]): Promise<void> {
  await yargs(argv)
    .scriptName('kanal')
    .usage('$0 <command> [flags]\n\nBidirectional Kubernetes apiserver network proxy (Konnectivity-compatible).')
    .command<ServerArgs>('server', 'Run the proxy server beside the kube-apiserver', serverBuilder, (args) => runServer(args).catch(fail))
    .command<AgentArgs>('agent', 'Run the proxy agent on a node', agentBuilder, (args) => runAgent(args).catch(fail))
    .command<InstallNodeArgs>('install-node', 'Install the agent as a systemd unit that starts before the kubelet', installNodeBuilder, (args) => runInstallNode(args).catch(fail))
    .demandCommand(1, 'name a command: server, agent or install-node')
    .strict()
    .parserConfiguration(PARSER_CONFIGURATION)
    .wrap(Math.min(110, process.stdout.columns || 110))
    .fail((message, err) => {
      if (err) process.exit(report(err));
      process.stderr.write(`kanal: ${message}\nRun "kanal --help" or "kanal <command> --help" for usage.\n`);
      process.exit(EXIT_USAGE);
    })
    .help()
    .version(packageVersion())
    .parseAsync();
}

main(hideBin(process.argv)).catch(fail);
