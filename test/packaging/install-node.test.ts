// `kanal install-node --root <tmp>`: installs the unit, its drop-ins and
// /etc/kanal/agent.env; a second run changes nothing (same bytes, same inode,
// same mtime); bad flags are refused before anything is written; --uninstall
// removes what was installed and nothing else.

import test from 'ava';
import { chmod, lstat, mkdir, readFile, readdir, readlink, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { REPO, dryRunRefusal, expandExecStart, kanal, parseEnvFile, parseUnit, run, tempDir, unitValue } from '../helpers/packaging.js';

const FLAGS = [
  '--proxy-server-host',
  'kanal.cp.example.internal',
  '--ca-cert',
  '/etc/kanal/ca.crt',
  '--agent-cert',
  '/etc/kanal/agent.crt',
  '--agent-key',
  '/etc/kanal/agent.key',
  '--bind-address',
  '10.200.0.1',
  '--target',
  '6443:127.0.0.1:6443',
  '--agent-identifiers',
  'host=node-1&ipv4=10.0.0.5',
];

const INSTALLED = [
  '/etc/systemd/system/kanal-agent.service',
  '/etc/systemd/system/kanal-agent.service.d/50-install.conf',
  '/etc/systemd/system/kubelet.service.d/10-kanal.conf',
  '/etc/systemd/system/multi-user.target.wants/kanal-agent.service',
  '/etc/kanal/agent.env',
  '/etc/modules-load.d/kanal.conf',
];

function installNode(root: string, extra: string[], flags: string[] = FLAGS): ReturnType<typeof kanal> {
  return kanal(['install-node', '--root', root, '--systemd-version', '252', ...extra, '--', ...flags]);
}

async function snapshot(root: string): Promise<Map<string, { ino: number; mtimeMs: number; mode: number; content: string }>> {
  const out = new Map<string, { ino: number; mtimeMs: number; mode: number; content: string }>();
  for (const p of INSTALLED) {
    const file = path.join(root, p);
    const st = await lstat(file);
    out.set(p, {
      ino: st.ino,
      mtimeMs: st.mtimeMs,
      mode: st.mode,
      content: st.isSymbolicLink() ? `-> ${await readlink(file)}` : await readFile(file, 'utf8'),
    });
  }
  return out;
}

async function exists(file: string): Promise<boolean> {
  return lstat(file).then(
    () => true,
    () => false,
  );
}

async function listTree(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, entry.name);
    out.push(p);
    if (entry.isDirectory()) out.push(...(await listTree(p)));
  }
  return out;
}

test('installs unit, drop-ins, env file and the enable link into --root', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  const r = await installNode(tmp.dir, []);
  t.is(r.code, 0, r.stderr);
  for (const p of INSTALLED) {
    t.true(await exists(path.join(tmp.dir, p)), p);
    t.regex(r.stdout, new RegExp(`created\\s+${p.replace(/\./g, '\\.')}`));
  }
  // The unit and the kubelet drop-in are the package's own files, byte for byte.
  t.is(await readFile(path.join(tmp.dir, INSTALLED[0]), 'utf8'), await readFile(path.join(REPO, 'systemd', 'kanal-agent.service'), 'utf8'));
  t.is(
    await readFile(path.join(tmp.dir, INSTALLED[2]), 'utf8'),
    await readFile(path.join(REPO, 'systemd', 'kubelet.service.d', '10-kanal.conf'), 'utf8'),
  );
  t.is(await readlink(path.join(tmp.dir, INSTALLED[3])), '/etc/systemd/system/kanal-agent.service');
  const env = parseEnvFile(await readFile(path.join(tmp.dir, '/etc/kanal/agent.env'), 'utf8'));
  t.deepEqual([...env.keys()], ['KANAL_AGENT_FLAGS']);
  t.is(env.get('KANAL_AGENT_FLAGS'), FLAGS.join(' '));
  t.is((await stat(path.join(tmp.dir, '/etc/kanal/agent.env'))).mode & 0o777, 0o640);
  t.is((await stat(path.join(tmp.dir, '/etc/kanal'))).mode & 0o777, 0o750);
  t.is(
    (await readFile(path.join(tmp.dir, '/etc/modules-load.d/kanal.conf'), 'utf8'))
      .split('\n')
      .filter((l) => l && !l.startsWith('#'))
      .join(),
    'dummy',
  );
  // Missing credentials and binary are pointed out, not fatal.
  t.regex(r.stdout, /--agent-key \/etc\/kanal\/agent\.key does not exist yet/);
  t.regex(r.stdout, /\/usr\/local\/bin\/kanal does not exist/);
});

test('a second run changes nothing and says so: same bytes, same inodes, same mtimes', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  t.is((await installNode(tmp.dir, [])).code, 0);
  const before = await snapshot(tmp.dir);
  await new Promise((resolve) => setTimeout(resolve, 50)); // a rewrite would show in mtime
  const r = await installNode(tmp.dir, []);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /nothing changed: already installed with these flags/);
  t.notRegex(r.stdout, /\b(created|updated|removed)\b/);
  t.deepEqual(await snapshot(tmp.dir), before);
});

test('changed flags update only what follows from them, and remove what is no longer needed', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  t.is((await installNode(tmp.dir, [])).code, 0);
  const before = await snapshot(tmp.dir);
  const r = await installNode(tmp.dir, [], [...FLAGS, '--bind-interface-type', 'bridge', '--shutdown-grace-period', '1m']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /updated\s+\/etc\/kanal\/agent\.env/);
  t.regex(r.stdout, /updated\s+\/etc\/systemd\/system\/kanal-agent\.service\.d\/50-install\.conf/);
  t.regex(r.stdout, /removed\s+\/etc\/modules-load\.d\/kanal\.conf/);
  t.regex(r.stdout, /3 path\(s\) changed/);
  t.false(await exists(path.join(tmp.dir, '/etc/modules-load.d/kanal.conf')));
  const unit = await stat(path.join(tmp.dir, INSTALLED[0]));
  t.is(unit.ino, before.get(INSTALLED[0])!.ino, 'the unit itself was not rewritten');
  const dropIn = parseUnit(await readFile(path.join(tmp.dir, INSTALLED[1]), 'utf8'));
  t.is(unitValue(dropIn, 'Service', 'TimeoutStopSec'), '75s', '--shutdown-grace-period 1m + 15s');
});

test('the installed unit and env file form a command line the CLI accepts, and the installed tree verifies', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  t.is((await installNode(tmp.dir, [])).code, 0);
  const unit = parseUnit(await readFile(path.join(tmp.dir, INSTALLED[0]), 'utf8'));
  const env = parseEnvFile(await readFile(path.join(tmp.dir, unitValue(unit, 'Service', 'EnvironmentFile')!), 'utf8'));
  const words = expandExecStart(unitValue(unit, 'Service', 'ExecStart')!, env);
  const dry = await kanal([...words.slice(1), '--dry-run']);
  t.is(dryRunRefusal(dry), undefined);
  t.is((JSON.parse(dry.stdout) as { node: { bindAddress: string } }).node.bindAddress, '10.200.0.1');

  // systemd-analyze verify over the installed unit directory, ExecStart pointed at a stub.
  const unitDir = path.join(tmp.dir, 'etc', 'systemd', 'system');
  const stub = path.join(tmp.dir, 'usr', 'local', 'bin', 'kanal');
  await mkdir(path.dirname(stub), { recursive: true });
  await writeFile(stub, '#!/bin/sh\nexit 0\n');
  await chmod(stub, 0o755);
  const unitFile = path.join(unitDir, 'kanal-agent.service');
  await writeFile(unitFile, (await readFile(unitFile, 'utf8')).replace('/usr/local/bin/kanal', stub));
  await writeFile(path.join(unitDir, 'kubelet.service'), '[Unit]\nDescription=stand-in kubelet\n[Service]\nExecStart=/bin/true\n');
  const v = await run('systemd-analyze', ['verify', '--man=no', 'kanal-agent.service', 'kubelet.service'], {
    env: { ...process.env, SYSTEMD_UNIT_PATH: `${unitDir}:` },
    timeoutMs: 30_000,
  });
  t.is(`${v.stdout}${v.stderr}`.trim(), '');
  t.is(v.code, 0);
});

const REFUSED: { name: string; flags: string[]; message: RegExp }[] = [
  { name: 'no agent flags', flags: [], message: /no agent flags/ },
  { name: 'a flag the agent rejects', flags: ['--proxy-server-host', 'cp'], message: /--ca-cert is required/ },
  { name: 'an unknown flag', flags: [...FLAGS, '--no-such-flag', 'x'], message: /Unknown argument/i },
  {
    name: 'a --target without --bind-address',
    flags: ['--proxy-server-host', 'cp', '--ca-cert', '/etc/kanal/ca.crt', '--target', '6443:a:1'],
    message: /--target needs --bind-address/,
  },
  {
    name: 'a relative credential path',
    flags: ['--proxy-server-host', 'cp', '--ca-cert', 'ca.crt'],
    message: /--ca-cert ca\.crt: use an absolute path/,
  },
  { name: 'a value systemd would split', flags: ['--proxy-server-host', 'cp', '--ca-cert', '/etc/kanal/my ca.crt'], message: /whitespace/ },
  { name: '--check in the unit', flags: [...FLAGS, '--check'], message: /--check does not belong/ },
  { name: 'a stray positional word', flags: [...FLAGS, 'oops'], message: /Unknown argument: oops/ },
];

for (const c of REFUSED) {
  test(`refuses ${c.name} before writing anything`, async (t) => {
    const tmp = await tempDir('kanal-root-');
    t.teardown(tmp.remove);
    const r = await installNode(tmp.dir, [], c.flags);
    t.is(r.code, 2, r.stdout);
    t.regex(r.stderr, c.message);
    t.deepEqual(await listTree(tmp.dir), [], 'nothing written');
  });
}

test('--dry-run reports what would change and writes nothing', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  const r = await installNode(tmp.dir, ['--dry-run']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /would be created\s+\/etc\/kanal\/agent\.env/);
  t.deepEqual(await listTree(tmp.dir), []);
});

test('--uninstall removes what install-node installed, keeps credentials, and is idempotent', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  t.is((await installNode(tmp.dir, [])).code, 0);
  await writeFile(path.join(tmp.dir, 'etc/kanal/ca.crt'), 'operator credential\n');
  const r = await kanal(['install-node', '--root', tmp.dir, '--uninstall']);
  t.is(r.code, 0, r.stderr);
  for (const p of INSTALLED) {
    t.false(await exists(path.join(tmp.dir, p)), p);
    t.regex(r.stdout, new RegExp(`removed\\s+${p.replace(/\./g, '\\.')}`));
  }
  t.false(await exists(path.join(tmp.dir, 'etc/systemd/system/kanal-agent.service.d')));
  t.false(await exists(path.join(tmp.dir, 'etc/systemd/system/kubelet.service.d')));
  t.is(await readFile(path.join(tmp.dir, 'etc/kanal/ca.crt'), 'utf8'), 'operator credential\n', 'credentials stay');
  const again = await kanal(['install-node', '--root', tmp.dir, '--uninstall']);
  t.is(again.code, 0);
  t.regex(again.stdout, /nothing to remove/);
});

test('--uninstall leaves the kubelet drop-in directory alone when it holds other drop-ins', async (t) => {
  const tmp = await tempDir('kanal-root-');
  t.teardown(tmp.remove);
  t.is((await installNode(tmp.dir, [])).code, 0);
  const other = path.join(tmp.dir, 'etc/systemd/system/kubelet.service.d/20-other.conf');
  await writeFile(other, '[Service]\nEnvironment=X=1\n');
  t.is((await kanal(['install-node', '--root', tmp.dir, '--uninstall'])).code, 0);
  t.true(await exists(other));
});

test('--root must be an existing directory', async (t) => {
  const r = await kanal(['install-node', '--root', '/nonexistent/kanal-root', '--', ...FLAGS]);
  t.is(r.code, 2);
  t.regex(r.stderr, /--root \/nonexistent\/kanal-root: not a directory/);
});
