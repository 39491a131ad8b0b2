/** What the Kanal CLI of this run offers: flags named by its --help (a build may predate a feature). */
import { execFile } from 'node:child_process';
import { kanalProgram } from './cluster.js';

/** `kanal <args>` of `cli` (--kanal-cli's, or this checkout's when undefined): its stdout and stderr together. */
export function cliOutput(cli: string | undefined, args: string[]): Promise<string> {
  const program = kanalProgram(cli);
  const [file, argv] =
    'script' in program ? [process.execPath, [...program.nodeArgs, program.script, ...args]] : [program.executable, args];
  return new Promise((resolve) => {
    execFile(file, argv, { timeout: 30_000 }, (_err, stdout, stderr) => resolve(`${stdout}\n${stderr}`));
  });
}

/** The subset of `flags` that `kanal <command> --help` names. */
export async function cliFlags(cli: string | undefined, command: 'server' | 'agent', flags: readonly string[]): Promise<Set<string>> {
  const help = await cliOutput(cli, [command, '--help']);
  // A flag is named as a word of its own: --socks5-port must not match --socks5-port-range.
  return new Set(flags.filter((f) => new RegExp(`(^|\\s)${f.replace(/[-]/g, '\\-')}(\\s|$|=)`, 'm').test(help)));
}
