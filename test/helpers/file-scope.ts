/**
 * A cleanup scope for fixtures a whole test file shares (started in
 * `test.before`): run after the file's last test, whatever its outcome.
 */
import type { TestFn } from 'ava';
import { CleanupStack } from '../../kit/launch/cleanup-scope.js';

export function fileScope<Context>(test: TestFn<Context>): CleanupStack {
  const scope = new CleanupStack();
  test.after.always(() => scope.run());
  return scope;
}
