/**
 * The agent flags `kanal install-node` stores in /etc/kanal/agent.env: parsed
 * and validated exactly as `kanal agent` will parse them (same yargs options,
 * same validateAgentArgs), and restricted to words that survive systemd's
 * `$VAR` word splitting and a shell's `. agent.env` unchanged.
 */
import path from 'node:path';
import yargs from 'yargs';
import { agentBuilder, validateAgentArgs, type AgentArgs } from '../agent-command.js';
import type { AgentConfig } from '../../agent/config.js';
import { UsageError } from '../../common/usage-error.js';
import { errorMessage } from '../../common/error-message.js';
import { agentSettings, FLAG } from '../../agent/settings.js';
import { keyOf } from '../../settings/flag-names.js';

/** Flags that make no sense in a unit's command line. */
const FORBIDDEN = new Set([keyOf(agentSettings, 'dry-run'), 'check', 'help', 'version']);

/** Flags naming files the agent reads at run time (relative paths would depend on the cwd). */
export const FILE_FLAGS = [
  keyOf(agentSettings, 'ca-cert'),
  keyOf(agentSettings, 'agent-cert'),
  keyOf(agentSettings, 'agent-key'),
  keyOf(agentSettings, 'service-account-token-path'),
] as const;

export interface AgentFlagSet {
  /** The words as given (stored verbatim in KANAL_AGENT_FLAGS). */
  words: string[];
  args: AgentArgs;
  config: AgentConfig;
}

function flagName(word: string): string | undefined {
  const m = /^--?(no-)?([^=]+)/.exec(word);
  return m ? m[2] : undefined;
}

/** Parses words with the agent's own option table; throws UsageError with the agent's message. */
export function parseAgentFlags(words: readonly string[]): AgentFlagSet {
  if (words.length === 0)
    throw new UsageError(
      `no agent flags: pass them after "--", e.g. kanal install-node -- ${FLAG['proxy-server-host']} cp.example ${FLAG['ca-cert']} /etc/kanal/ca.crt ...`,
    );
  for (const word of words) {
    if (word === '' || /[\s"'\\$`]/.test(word)) {
      throw new UsageError(
        `agent flag ${JSON.stringify(word)}: values in /etc/kanal/agent.env cannot be empty or contain whitespace, quotes, backslashes, '$' or backticks`,
      );
    }
    const name = word.startsWith('-') ? flagName(word) : undefined;
    if (name && FORBIDDEN.has(name)) throw new UsageError(`agent flag --${name} does not belong in the unit's command line`);
  }
  let parsed: AgentArgs & { _: (string | number)[] };
  try {
    // agentBuilder: the very options (and middleware) `kanal agent` parses with.
    parsed = agentBuilder(yargs([...words]))
      .strict()
      .parserConfiguration({ 'camel-case-expansion': false, 'strip-aliased': true })
      .version(false)
      .help(false)
      .exitProcess(false)
      .fail((message, err) => {
        throw err ?? new UsageError(message);
      })
      .parseSync();
  } catch (err) {
    throw new UsageError(`agent flags: ${errorMessage(err)}`);
  }
  const positional = parsed._;
  if (positional.length > 0)
    throw new UsageError(`agent flags: unexpected argument(s) ${positional.map((p) => JSON.stringify(String(p))).join(', ')}`);
  let config: AgentConfig;
  try {
    config = validateAgentArgs(parsed);
  } catch (err) {
    throw new UsageError(`agent flags: ${errorMessage(err)}`);
  }
  for (const flag of FILE_FLAGS) {
    const value = parsed[flag];
    if (value && !path.isAbsolute(value))
      throw new UsageError(`agent flag --${flag} ${value}: use an absolute path (the unit runs with / as its working directory)`);
  }
  return { words: [...words], args: parsed, config };
}
