/**
 * `kanal server` and `kanal agent` inside this process, assembled from a
 * command line exactly as the CLI assembles them: yargs with the commands'
 * own flag declarations, their validation, their credential loading and the
 * one assembly of each command (src/server/assembly/server-assembly.ts,
 * src/agent/assembly.ts). What a flag cannot say is a named override of that
 * assembly (an ephemeral health port, the logger the caller captures, and
 * for an agent the features it offers and its node side as options).
 */
import yargs, { type Argv } from 'yargs';
import { serverBuilder, validateServerArgs, loadServerCredentials, type ServerArgs } from '../../src/cli/server-command.js';
import { agentBuilder, validateAgentArgs, loadAgentCredentials, type AgentArgs } from '../../src/cli/agent-command.js';
import { PARSER_CONFIGURATION } from '../../src/cli/parser-configuration.js';
import { buildInfo } from '../../src/cli/build-info.js';
import { KanalServer, type ServerOptions } from '../../src/server/server.js';
import { assembleServer, type AssembledServer, type ServerOverrides } from '../../src/server/assembly/server-assembly.js';
import { KanalAgent, type AgentOptions } from '../../src/agent/agent.js';
import { assembleAgent, type AgentOverrides } from '../../src/agent/assembly.js';

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

/** The server's overrides a test may give: the logger is required (the CLI's goes to stdout). */
export type InProcessServerOverrides = Pick<ServerOverrides, 'ephemeralHealthHost'> & Required<Pick<ServerOverrides, 'log'>>;
export type InProcessAgentOverrides = Omit<AgentOverrides, 'log'> & Required<Pick<AgentOverrides, 'log'>>;

/** `kanal server ...argv` assembled (reading the credential files and the tenants file it names); `clients` closed by the caller. */
export async function serverFromFlags(argv: readonly string[], overrides: InProcessServerOverrides): Promise<AssembledServer> {
  const config = validateServerArgs(parseServerFlags(argv));
  return assembleServer(config, loadServerCredentials(config), overrides);
}

/** The agent's options as `kanal agent ...argv` assembles them (its tunnels, leases, node side, admin port, audit log, build). */
export async function agentOptionsFromFlags(argv: readonly string[], overrides: InProcessAgentOverrides): Promise<AgentOptions> {
  const config = validateAgentArgs(parseAgentFlags(argv));
  return assembleAgent(config, loadAgentCredentials(config), buildInfo(), overrides);
}

/** A server of this process and what releases it. */
export interface InProcessServer {
  server: KanalServer;
  options: Readonly<ServerOptions>;
  /** Stops the server and closes its Kubernetes API clients. */
  close: () => Promise<void>;
}

/** A KanalServer built from flags, not started; `close()` stops it and closes its API clients. */
export async function newServerFromFlags(argv: readonly string[], overrides: InProcessServerOverrides): Promise<InProcessServer> {
  const { options, clients } = await serverFromFlags(argv, overrides);
  const server = new KanalServer(options);
  return {
    server,
    options,
    close: async () => {
      await server.stop();
      for (const c of clients) c.close();
    },
  };
}

/** A started KanalServer built from flags; stopped by the caller with `close()` (a failed start closes its clients). */
export async function startServerInProcess(argv: readonly string[], overrides: InProcessServerOverrides): Promise<InProcessServer> {
  const built = await newServerFromFlags(argv, overrides);
  try {
    await built.server.start();
  } catch (err) {
    await built.close();
    throw err;
  }
  return built;
}

/** A started KanalAgent built from flags; stopped by the caller. */
export async function startAgentInProcess(argv: readonly string[], overrides: InProcessAgentOverrides): Promise<KanalAgent> {
  const agent = new KanalAgent(await agentOptionsFromFlags(argv, overrides));
  await agent.start();
  return agent;
}
