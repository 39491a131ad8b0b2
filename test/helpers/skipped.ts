import test from 'ava';

/**
 * Stands in for tests that cannot run on this machine: one skipped test whose
 * title says what was skipped and why. ava reports it as skipped (TAP
 * `# SKIP`), so the summary line counts it as skipped, not as passed.
 */
export function skippedBecause(what: string, reason: string): void {
  test.skip(`${what} skipped: ${reason}`, () => undefined);
}
