/**
 * `--dry-run`: prints the validated configuration, then checks the files it
 * names: their problems make the command exit 1 (after the configuration, so
 * a command line can be checked where the files do not exist), their
 * warnings go to stderr.
 */
export function dryRun(config: unknown, loadCredentials: () => { warnings: readonly string[] }): void {
  process.stdout.write(`${JSON.stringify(config, null, 2)}\n`);
  for (const w of loadCredentials().warnings) process.stderr.write(`kanal: warning: ${w}\n`);
}
