/**
 * `kanal server` and `kanal agent` inside this process, assembled from a
 * command line exactly as the CLI assembles them: yargs with the commands'
 * own flag declarations, their validation, their credential loading and their
 * option builders (src/cli/server-command.ts, agent-command.ts). What a flag
 * cannot say is a named override: an ephemeral health port (the flag's 0 means
 * off) and the logger the caller captures.
 */
import yargs, { type Argv } from 'yargs';
import type { Logger } from 'pino';
import {
  serverBuilder,
  validateServerArgs,
  loadServerCredentials,
  buildServerOptions,
  type ServerArgs,
} from '../../src/cli/server-command.js';
import { agentBuilder, validateAgentArgs, loadAgentCredentials, buildAgentOptions, type AgentArgs } from '../../src/cli/agent-command.js';
import { PARSER_CONFIGURATION } from '../../src/cli/parser-configuration.js';
import { KanalServer, type ServerOptions } from '../../src/server/server.js';
import { KanalAgent, type AgentOptions } from '../../src/agent/agent.js';

/** Parses `argv` (flags after the command name) as `kanal` does; a usage error throws. */
function parseFlags<T>(builder: (y: Argv) => Argv<T>, argv: readonly string[]): T {
  return builder(yargs([...argv]))
    .strict()
    .exitProcess(false)
    .parserConfiguration(PARSER_CONFIGURATION)
    .fail((message, err) => {
      throw err ?? new Error(message);
    })
    .parseSync() as unknown as T;
}

export const parseServerFlags = (argv: readonly string[]): ServerArgs => parseFlags<ServerArgs>(serverBuilder, argv);
export const parseAgentFlags = (argv: readonly string[]): AgentArgs => parseFlags<AgentArgs>(agentBuilder, argv);

export interface InProcessOverrides {
  /** Replaces the logger the CLI would create (stdout). */
  log: Logger;
  /** Health port on this host with a port the kernel picks (the flags can only name a port or 0 = off). */
  ephemeralHealthHost?: string;
}

/** ServerOptions as `kanal server ...argv` builds them (reading the credential files it names). */
export async function serverOptionsFromFlags(argv: readonly string[], overrides: InProcessOverrides): Promise<ServerOptions> {
  const config = validateServerArgs(parseServerFlags(argv));
  const options = await buildServerOptions(config, loadServerCredentials(config));
  options.log = overrides.log;
  if (overrides.ephemeralHealthHost !== undefined) options.health = { host: overrides.ephemeralHealthHost, port: 0 };
  return options;
}

/** The agent's assembly as `kanal agent ...argv` builds it (its tunnels, leases, node side and admin port). */
export async function agentAssemblyFromFlags(argv: readonly string[], overrides: InProcessOverrides): Promise<AgentOptions> {
  const config = validateAgentArgs(parseAgentFlags(argv));
  const agent = await buildAgentOptions(config, loadAgentCredentials(config));
  agent.log = overrides.log;
  if (overrides.ephemeralHealthHost !== undefined) agent.health = { host: overrides.ephemeralHealthHost, port: 0 };
  // As runAgent() composes it (src/cli/agent-command.ts).
  return { tunnels: agent, leases: config.leases, node: config.node, admin: config.admin };
}

/** A started KanalServer built from flags; stopped by the caller. */
export async function startServerInProcess(
  argv: readonly string[],
  overrides: InProcessOverrides,
): Promise<{ server: KanalServer; options: ServerOptions }> {
  const options = await serverOptionsFromFlags(argv, overrides);
  const server = new KanalServer(options);
  await server.start();
  return { server, options };
}

/** A started KanalAgent built from flags (plus `adjust` for what no flag sets); stopped by the caller. */
export async function startAgentInProcess(
  argv: readonly string[],
  overrides: InProcessOverrides,
  adjust: (assembly: AgentOptions) => void = () => undefined,
): Promise<KanalAgent> {
  const assembly = await agentAssemblyFromFlags(argv, overrides);
  adjust(assembly);
  const assembled = new KanalAgent(assembly);
  await assembled.start();
  return assembled;
}
