/**
 * `--dry-run`: prints the validated configuration, then runs the checks a
 * start makes before it serves (the credential files, then start-checks.ts):
 * a problem makes the command exit 1 (after the configuration, so a command
 * line can be checked where the files do not exist), warnings go to stderr.
 */
export async function dryRun(config: unknown, check: () => Promise<{ warnings: readonly string[] }>): Promise<void> {
  process.stdout.write(`${JSON.stringify(config, null, 2)}\n`);
  for (const w of (await check()).warnings) process.stderr.write(`kanal: warning: ${w}\n`);
}
