/** A command-line mistake: reported on stderr with exit code 2. */
export class UsageError extends Error {
  override name = 'UsageError';
}
