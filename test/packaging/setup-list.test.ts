/**
 * The README says what `npm test` installs: every Debian package that
 * scripts/setup.sh may install is named in that sentence, so a newcomer is
 * not surprised by an apt-get of something the README left out.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

/** The packages of setup.sh's `need_cmd COMMAND PACKAGE` and `need_path PATH PACKAGE` lines. */
function setupPackages(script: string): string[] {
  return [...script.matchAll(/^need_(?:cmd|path) \S+ (\S+)/gm)].map((m) => m[1]);
}

test("the README's list of what npm test installs names every package scripts/setup.sh installs", (t) => {
  const packages = setupPackages(fs.readFileSync(path.join(REPO, 'scripts', 'setup.sh'), 'utf8'));
  t.true(packages.length >= 10, `read only ${packages.join(', ')} from scripts/setup.sh`);
  const readme = fs.readFileSync(path.join(REPO, 'README.md'), 'utf8');
  const sentence = /`npm test` builds, installs[\s\S]*?runs every ava/.exec(readme)?.[0];
  if (sentence === undefined) return t.fail('README.md has no "`npm test` builds, installs … runs every ava" sentence');
  // golang-google-grpc-dev and golang-google-protobuf-dev are "grpc-go" to a reader.
  const named = (pkg: string): boolean => sentence.includes(pkg) || (pkg.startsWith('golang-google-') && sentence.includes('grpc-go'));
  t.deepEqual(
    packages.filter((pkg) => !named(pkg)),
    [],
    'README.md omits these packages of scripts/setup.sh',
  );
});

test('the package list is read from both forms of setup.sh line', (t) => {
  t.deepEqual(
    setupPackages('need_cmd ip iproute2\nneed_cmd strip binutils    # why\nneed_path /usr/share/x golang-x-dev\n# need_cmd no no'),
    ['iproute2', 'binutils', 'golang-x-dev'],
  );
});
