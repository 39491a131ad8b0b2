import test from 'ava';

/**
 * Stands in for tests that cannot run on this machine: one test whose title
 * and log say what was skipped and why. It passes (ava fails a test that
 * asserts nothing), so a run without ../shared or netns stays green.
 */
export function skippedBecause(what: string, reason: string): void {
  test(`${what} skipped: ${reason}`, (t) => {
    t.log(`skipped: ${reason}`);
    t.pass();
  });
}
