/**
 * A configuration mistake (a flag's value, a missing or contradicting flag):
 * `kanal` reports it on stderr with exit code 2. Thrown wherever a flag is
 * checked, beside what it configures (e.g. src/agent/config.ts).
 */
export class UsageError extends Error {
  override name = 'UsageError';
}
