// The npm form of kanal (the image and nodes use the executable, image.test.ts):
// `npm pack` makes the tarball, and the operator's guide's `npm install
// --global` installs it (here into a temporary prefix, from npm's cache when
// it has everything). The installed `bin/kanal` must run: --help, a dry run,
// install-node from the installed package files, and the native (koffi)
// netlink code.

import test from 'ava';
import { readFile, readlink } from 'node:fs/promises';
import path from 'node:path';
import { REPO, dryRunRefusal, parseEnvFile, run, tempDir } from '../helpers/packaging.js';

interface PackResult {
  filename: string;
  files: { path: string }[];
}

const tmp = await tempDir('kanal-pack-');
test.after.always('remove the pack directory', () => tmp.remove());

let packed: Promise<{ tarball: string; files: string[] }> | undefined;
function pack(): Promise<{ tarball: string; files: string[] }> {
  packed ??= (async () => {
    // --ignore-scripts: `prepare` would rebuild with tsc; the tests run on the built dist/.
    const r = await run('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', tmp.dir], { cwd: REPO, timeoutMs: 120_000 });
    if (r.code !== 0) throw new Error(`npm pack failed: ${r.stderr}`);
    const [result] = JSON.parse(r.stdout.slice(r.stdout.indexOf('['))) as PackResult[];
    return { tarball: path.join(tmp.dir, result.filename), files: result.files.map((f) => f.path) };
  })();
  return packed;
}

let installed: Promise<string> | undefined;
/** Installs the tarball as docs/operators-guide.md says (a temporary prefix for /usr/local); returns bin/kanal. */
function install(): Promise<string> {
  installed ??= (async () => {
    const { tarball } = await pack();
    const prefix = path.join(tmp.dir, 'prefix');
    // --prefer-offline: npm's cache when it holds every dependency, the registry otherwise.
    const args = ['install', '--global', '--omit=dev', '--no-audit', '--no-fund', '--prefer-offline', '--prefix', prefix, tarball];
    const r = await run('npm', args, { timeoutMs: 300_000 });
    if (r.code !== 0) throw new Error(`npm ${args.join(' ')} failed: ${r.stderr}`);
    return path.join(prefix, 'bin', 'kanal');
  })();
  return installed;
}

test('npm pack ships the program, the native boundary, the units and the static pods', async (t) => {
  const { tarball, files } = await pack();
  const pkg = JSON.parse(await readFile(path.join(REPO, 'package.json'), 'utf8')) as { name: string; version: string };
  t.is(path.basename(tarball), `${pkg.name}-${pkg.version}.tgz`);
  for (const f of [
    'dist/bundle/cli/main.js',
    'dist/src/cli/main.js',
    'dist/src/cli/install-node-command.js',
    'dist/src/agent/preflight.js',
    'dist/native/sd-notify.js',
    'dist/native/host-interface.js',
    'systemd/kanal-agent.service',
    'systemd/kanal-server.service',
    'systemd/kubelet.service.d/10-kanal.conf',
    'static-pods/kanal-agent.yaml',
    'static-pods/kanal-server.yaml',
  ]) {
    t.true(files.includes(f), `${f} is in the tarball`);
  }
  t.false(
    files.some((f) => f.startsWith('dist/test/')),
    'tests stay out',
  );
  t.false(
    files.some((f) => f.startsWith('dist/kit/')),
    'the demo and the throwaway PKI stay out',
  );
});

test('npm install --global puts a working bin/kanal in the prefix', async (t) => {
  const bin = await install();
  // The bundle (kit/release/bundle.ts, bundleNpm): a start reads ~45 files, not ~300 modules.
  t.regex(await readlink(bin), /lib\/node_modules\/kanal\/dist\/bundle\/cli\/main\.js$/);
  const help = await run(bin, ['--help']);
  t.is(help.code, 0, help.stderr);
  for (const command of ['kanal server', 'kanal agent', 'kanal install-node']) t.true(help.stdout.includes(command), command);
  const env = parseEnvFile(await readFile(path.join(REPO, 'deploy', 'agent.env.example'), 'utf8'));
  const dry = await run(bin, ['agent', ...env.get('KANAL_AGENT_FLAGS')!.split(' '), '--dry-run']);
  t.is(dryRunRefusal(dry), undefined);
});

test('the installed package installs its own unit files (install-node from the tarball)', async (t) => {
  const bin = await install();
  const root = path.join(tmp.dir, 'node-root');
  await run('mkdir', ['-p', root]);
  const r = await run(bin, [
    'install-node',
    '--root',
    root,
    '--systemd-version',
    '252',
    '--',
    '--proxy-server-host',
    'cp.example',
    '--ca-cert',
    '/etc/kanal/ca.crt',
  ]);
  t.is(r.code, 0, r.stderr);
  t.is(
    await readFile(path.join(root, 'etc/systemd/system/kanal-agent.service'), 'utf8'),
    await readFile(path.join(REPO, 'systemd', 'kanal-agent.service'), 'utf8'),
  );
});

test('the installed package loads its native code (koffi): --check reaches the netlink probe', async (t) => {
  const bin = await install();
  const r = await run(bin, ['agent', '--check', '--proxy-server-host', '127.0.0.1', '--ca-cert', '/nonexistent/ca.crt']);
  t.is(r.code, 1, 'the missing CA fails the check');
  t.regex(r.stdout, /PASS\s+netlink\s+rtnetlink works/);
});
