// install-node and the kanal executable: run from the executable, it plans a
// copy of itself to /usr/local/bin/kanal (the path the unit's ExecStart runs),
// writes it atomically with mode 0755, leaves it alone when it is already
// there, and --uninstall keeps it. The npm form plans no copy. Everything goes
// into a temporary --root.

import test from 'ava';
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, mkdir, readFile, readdir, stat, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseAgentFlags } from '../../src/cli/install/agent-flags.js';
import { applyPlan, uninstall } from '../../src/cli/install/apply.js';
import { PATHS, planNodeInstall } from '../../src/cli/install/node-plan.js';
import { KANAL_BINARY } from '../../src/cli/install/program.js';
import { UNIT_TEMPLATES } from '../../src/cli/install/unit-templates.js';
import { kanalExecutable } from '../helpers/executable.js';
import { REPO, parseUnit, run, tempDir, unitValue } from '../helpers/packaging.js';

const FLAGS = [
  '--proxy-server-host',
  'cp.example',
  '--ca-cert',
  '/etc/kanal/ca.crt',
  '--bind-address',
  '10.200.0.1',
  '--target',
  '6443:127.0.0.1:6443',
];
const flags = parseAgentFlags(FLAGS);

async function sha256(file: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
  return hash.digest('hex');
}

async function fixture(): Promise<{ root: string; source: string; remove: () => Promise<void> }> {
  const tmp = await tempDir('kanal-install-exe-');
  const root = path.join(tmp.dir, 'root');
  await mkdir(root);
  const source = path.join(tmp.dir, 'kanal');
  await writeFile(source, 'stand-in for the executable\n', { mode: 0o700 });
  return { root, source, remove: tmp.remove };
}

test('the units the program carries are the files in systemd/, byte for byte', async (t) => {
  for (const [name, text] of Object.entries(UNIT_TEMPLATES)) {
    const file = await readFile(path.join(REPO, 'systemd', name), 'utf8');
    t.true(text === file, `src/cli/install/unit-templates.ts is stale for systemd/${name}: run node scripts/unit-templates.mjs`);
  }
});

test('the executable form plans its own copy first, and the unit runs that path', (t) => {
  const plan = planNodeInstall({ flags, systemdVersion: 252, executable: '/tmp/download/kanal' });
  t.deepEqual(plan[0], { path: KANAL_BINARY, kind: 'copy', source: '/tmp/download/kanal', mode: 0o755 });
  const unit = plan.find((e) => e.path === PATHS.unit);
  t.is(unit?.kind, 'file');
  const execStart = unitValue(parseUnit(unit?.kind === 'file' ? unit.content.toString('utf8') : ''), 'Service', 'ExecStart');
  t.is(execStart?.split(' ')[0], KANAL_BINARY);
  t.false(
    planNodeInstall({ flags, systemdVersion: 252 }).some((e) => e.kind === 'copy'),
    'the npm form: npm installed the program',
  );
});

test('copies the program atomically, mode 0755, then leaves it be; a new one replaces it', async (t) => {
  const { root, source, remove } = await fixture();
  t.teardown(remove);
  const plan = planNodeInstall({ flags, systemdVersion: 252, executable: source });
  const target = path.join(root, KANAL_BINARY);

  t.deepEqual(applyPlan(root, plan, true)[0], { path: KANAL_BINARY, kind: 'created', source });
  t.deepEqual(await readdir(root), [], '--dry-run writes nothing');

  t.is(applyPlan(root, plan)[0].kind, 'created');
  const first = await stat(target);
  t.is(first.mode & 0o7777, 0o755);
  if (process.getuid?.() === 0) t.is(first.uid, 0, "root's, so only root can change what the unit runs");
  t.is(await readFile(target, 'utf8'), await readFile(source, 'utf8'));
  t.deepEqual(await readdir(path.dirname(target)), ['kanal'], 'no temporary file left beside it');

  await new Promise((resolve) => setTimeout(resolve, 20)); // a rewrite would show in mtime
  t.is(applyPlan(root, plan)[0].kind, 'unchanged');
  const again = await stat(target);
  t.deepEqual([again.ino, again.mtimeMs], [first.ino, first.mtimeMs]);

  await writeFile(source, 'a newer executable\n');
  t.is(applyPlan(root, plan)[0].kind, 'updated');
  t.not((await stat(target)).ino, first.ino, 'renamed over, never rewritten in place (a running agent keeps its file)');
  t.is(await readFile(target, 'utf8'), 'a newer executable\n');
});

test('running from /usr/local/bin/kanal already: nothing to copy', async (t) => {
  const { root, remove } = await fixture();
  t.teardown(remove);
  const target = path.join(root, KANAL_BINARY);
  await mkdir(path.dirname(target), { recursive: true });
  await writeFile(target, 'installed\n', { mode: 0o755 });
  const plan = planNodeInstall({ flags, systemdVersion: 252, executable: target });
  t.is(applyPlan(root, plan)[0].kind, 'unchanged');
});

test("replaces an npm install's symbolic link; --uninstall and the npm form leave the program in place", async (t) => {
  const { root, source, remove } = await fixture();
  t.teardown(remove);
  const target = path.join(root, KANAL_BINARY);
  await mkdir(path.dirname(target), { recursive: true });
  await symlink('../lib/node_modules/kanal/dist/bundle/cli/main.js', target);
  t.is(applyPlan(root, planNodeInstall({ flags, systemdVersion: 252, executable: source }))[0].kind, 'updated');
  t.true((await lstat(target)).isFile());

  const npmForm = applyPlan(root, planNodeInstall({ flags, systemdVersion: 252 }));
  t.false(
    npmForm.some((c) => c.path === KANAL_BINARY),
    'not a managed path: the npm form neither copies nor removes it',
  );
  uninstall(root);
  t.true((await lstat(target)).isFile(), 'it may also run kanal-server.service');
});

test('kanal install-node from the executable: --dry-run plans the copy, then installs a program that runs', async (t) => {
  const executable = await kanalExecutable();
  const { root, remove } = await fixture();
  t.teardown(remove);
  const args = ['install-node', '--root', root, '--systemd-version', '252', '--', ...FLAGS];

  const dry = await run(executable, [...args.slice(0, 5), '--dry-run', ...args.slice(5)]);
  t.is(dry.code, 0, dry.stderr);
  t.true(dry.stdout.includes(`would be created   ${KANAL_BINARY} (copy of ${executable})`), dry.stdout);
  t.regex(dry.stdout, /would be created\s+\/etc\/systemd\/system\/kanal-agent\.service/);
  t.deepEqual(await readdir(root), [], '--dry-run writes nothing');

  const installed = await run(executable, args);
  t.is(installed.code, 0, installed.stderr);
  const target = path.join(root, KANAL_BINARY);
  t.is((await stat(target)).mode & 0o7777, 0o755);
  t.is(await sha256(target), await sha256(executable));
  const unit = parseUnit(await readFile(path.join(root, PATHS.unit), 'utf8'));
  t.is(unitValue(unit, 'Service', 'ExecStart')?.split(' ')[0], KANAL_BINARY);

  // The installed copy, run from there, finds everything in place.
  const rerun = await run(target, args);
  t.is(rerun.code, 0, rerun.stderr);
  t.regex(rerun.stdout, /nothing changed/);
});
