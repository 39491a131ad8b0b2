/**
 * The npm form's bundle (dist/bundle/cli/, kit/release/bundle.ts) behaves as
 * the compiled CLI it is made from: the same help text, laid out by the
 * string-width copies the bundle makes lazy, and the same refusals.
 * test/packaging/npm-pack.test.ts installs it and runs it from the tarball.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { run } from '../../kit/launch/run-to-end.js';

const DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const COMPILED = path.join(DIST, 'src', 'cli', 'main.js');
const BUNDLE = path.join(DIST, 'bundle', 'cli', 'main.js');

async function both(args: readonly string[]): Promise<[string, string]> {
  // A narrow terminal width: yargs wraps, so string-width measures every cell.
  const env = { ...process.env, COLUMNS: '60' };
  const [a, b] = await Promise.all([COMPILED, BUNDLE].map((cli) => run(process.execPath, [cli, ...args], { env, timeoutMs: 60_000 })));
  return [`${a.code} ${a.stdout}${a.stderr}`, `${b.code} ${b.stdout}${b.stderr}`];
}

test('npm run build writes the bundle', (t) => {
  t.true(fs.existsSync(BUNDLE), `${BUNDLE}: npm run build makes it (kit/release/write-npm-bundle.ts)`);
});

for (const args of [['--help'], ['server', '--help'], ['agent', '--help'], ['server', '--no-such-flag'], ['version']]) {
  test(`kanal ${args.join(' ')}: the bundle says what the compiled CLI says`, async (t) => {
    const [compiled, bundled] = await both(args);
    t.is(bundled, compiled);
  });
}
