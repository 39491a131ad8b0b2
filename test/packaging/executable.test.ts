/**
 * The single executable (npm run package, docs/executable.md): it runs every
 * command with nothing but itself, says what it is (`kanal version`), carries
 * koffi's native module (netlink from the executable, in network namespaces)
 * without leaving it on disk, and ships with a matching checksum and an SBOM
 * of what is inside.
 */
import { RUNTIME_FLAGS } from '../../src/cli/runtime-flags.js';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { levelAtLeast } from '../../kit/launch/log-reader.js';
import { kanalExecutable } from '../helpers/executable.js';
import { makeWorkspace } from '../helpers/workspace.js';
import { skippedBecause } from '../helpers/skipped.js';
import { KAS_GIT_VERSION } from '../helpers/kas-stand-in.js';
import {
  ADVERTISE_IP,
  KAS_PORT,
  createTopology,
  destroyAllTopologies,
  findAddress,
  startAgent,
  startServer,
} from '../helpers/node-topology.js';
import { run } from '../../kit/launch/run-to-end.js';
import { freePort, kanalCommand, KANAL_CLI, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import { spawnChild } from '../../kit/launch/child.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { netnsUnavailableReason } from '../../kit/launch/netns.js';
import { bundleCli } from '../../kit/release/bundle.js';
import { gitCommit } from '../../kit/release/build-info.js';
import { sha256File } from '../../kit/release/checksum.js';
import { bundledPackages, type Component } from '../../kit/release/sbom.js';
import { parseBuildInfo } from '../../src/cli/build-info.js';
import type { VersionReport } from '../../src/cli/version-command.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const DEMO = path.join(REPO, 'dist', 'kit', 'demo', 'main.js');
const KOFFI_NODE = path.join(REPO, 'node_modules', '@koromix', 'koffi-linux-x64', 'linux_x64', 'koffi.node');
// Asked before any test is declared: ava takes declarations only synchronously after the module's top-level awaits.
const unavailable = await netnsUnavailableReason();
const PACKAGE_VERSION = (JSON.parse(fs.readFileSync(path.join(REPO, 'package.json'), 'utf8')) as { version: string }).version;

/** `kanal ...args` with the executable; NODE_OPTIONS cleared so the test runner's own options do not leak in. */
async function exe(args: readonly string[], env: NodeJS.ProcessEnv = {}): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return run(await kanalExecutable(), args, { env: { ...process.env, NODE_OPTIONS: '', ...env }, timeoutMs: 60_000 });
}

test('the executable is one self-contained file, and kanal.sha256 is its checksum in sha256sum format', async (t) => {
  const file = await kanalExecutable();
  t.true(path.isAbsolute(file));
  t.true((fs.statSync(file).mode & 0o111) !== 0, 'executable bits set');
  const line = fs.readFileSync(path.join(path.dirname(file), 'kanal.sha256'), 'utf8');
  t.is(line, `${sha256File(file)}  kanal\n`);
  const check = await run('sha256sum', ['-c', 'kanal.sha256'], { cwd: path.dirname(file) });
  t.is(check.code, 0, check.stderr);
  // Only the C library and the loader from the system; no libnode, no node_modules.
  const ldd = await run('ldd', [file]);
  t.notRegex(ldd.stdout, /libnode|not found/);
});

test('kanal version names the version, the commit, the executable form and its runtime', async (t) => {
  const json = await exe(['version', '-o', 'json']);
  t.is(json.code, 0, json.stderr);
  const r = JSON.parse(json.stdout) as VersionReport;
  t.is(r.version, PACKAGE_VERSION);
  t.regex(r.commit, /^[0-9a-f]{40}(-dirty)?$/);
  t.is(r.commit.slice(0, 40), gitCommit(REPO).slice(0, 40), 'built from this checkout');
  t.is(r.form, 'executable');
  // The executable starts with the V8 flags every form runs with (its execArgv).
  t.deepEqual(r.runtime, { node: process.versions.node, v8: process.versions.v8, openssl: process.versions.openssl, flags: RUNTIME_FLAGS });

  const text = await exe(['version']);
  t.is(text.code, 0);
  t.true(text.stdout.startsWith(`kanal ${PACKAGE_VERSION}\ncommit:  ${r.commit}\nform:    single executable\n`), text.stdout);
  t.is((await exe(['--version'])).stdout.trim(), PACKAGE_VERSION);

  const bad = await exe(['version', '-o', 'yaml']);
  t.is(bad.code, 2);
  t.regex(bad.stderr, /Invalid values:[\s\S]*output/);
});

test('the npm form reports itself as such, with the commit npm run build wrote', async (t) => {
  const r = await run(process.execPath, [KANAL_CLI, 'version', '-o', 'json'], { env: { ...process.env, NODE_OPTIONS: '' } });
  t.is(r.code, 0, r.stderr);
  const report = JSON.parse(r.stdout) as VersionReport;
  const file = path.join(REPO, 'dist', 'build-info.json');
  // npm run build writes it; a bare tsc does not, and the commit then reads as unknown.
  const written = parseBuildInfo(fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : undefined);
  t.like(report, { version: PACKAGE_VERSION, commit: written.commit, form: 'npm' });
  t.deepEqual(report.runtime.flags, [], 'started without the launchers, no flags');
});

test('build info that is missing or malformed reads as unknown', (t) => {
  t.deepEqual(parseBuildInfo(undefined), { version: 'unknown', commit: 'unknown' });
  t.deepEqual(parseBuildInfo('{not json'), { version: 'unknown', commit: 'unknown' });
  t.deepEqual(parseBuildInfo('{"version": 3, "commit": ""}'), { version: 'unknown', commit: 'unknown' });
  t.deepEqual(parseBuildInfo('{"version": "1.2.3", "commit": "abc"}'), { version: '1.2.3', commit: 'abc' });
});

test('kanal --help lists every command; an unknown command is a usage error', async (t) => {
  const help = await exe(['--help']);
  t.is(help.code, 0, help.stderr);
  for (const command of ['server', 'agent', 'install-node', 'version']) t.regex(help.stdout, new RegExp(`kanal ${command}\\b`));
  const unknown = await exe(['frobnicate']);
  t.is(unknown.code, 2);
  t.regex(unknown.stderr, /Unknown argument: frobnicate/);
});

test('kanal server --dry-run validates and prints the configuration; a bad flag is named', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-exe-');
  const { pki } = ws;
  const flags = ['--uds-name', path.join(ws.dir, 'k.sock'), '--cluster-cert', pki.serverCert, '--cluster-key', pki.serverKey];
  const ok = await exe(['server', '--dry-run', ...flags, '--cluster-ca-cert', pki.caCert]);
  t.is(ok.code, 0, ok.stderr);
  t.true(JSON.stringify(JSON.parse(ok.stdout)).includes(path.join(ws.dir, 'k.sock')), ok.stdout);
  const bad = await exe(['server', '--dry-run', ...flags, '--cluster-ca-cert', pki.caCert, '--agent-port', '70000']);
  t.is(bad.code, 2);
  t.regex(bad.stderr, /--agent-port/);
});

test('koffi loads from the embedded copy and leaves nothing in TMPDIR; an unusable TMPDIR is named', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-exe-');
  const tmp = scopedTempDir(t, 'kanal-exe-tmp-');
  const args = [
    'server',
    '--uds-name',
    path.join(ws.dir, 'k.sock'),
    '--cluster-cert',
    ws.pki.serverCert,
    '--cluster-key',
    ws.pki.serverKey,
  ];
  // freePort() races other test files: a start that dies of EADDRINUSE is retried with fresh ports.
  const server = await withPortRetry(async () => {
    const health = await freePort();
    const server = spawnChild(t, {
      name: 'server',
      argv: [
        await kanalExecutable(),
        ...args,
        '--cluster-ca-cert',
        ws.pki.caCert,
        '--agent-port',
        String(await freePort()),
        '--health-port',
        String(health),
      ],
      logFile: path.join(ws.dir, 'server.log'),
      env: { ...process.env, NODE_OPTIONS: '', TMPDIR: tmp },
    });
    await waitHealthy(server, `http://127.0.0.1:${health}/healthz`, 30_000);
    return server;
  });
  t.deepEqual(fs.readdirSync(tmp), [], 'the private directory and the module in it are gone');
  await server.stop();

  const missing = await exe(['server', '--dry-run', ...args], { TMPDIR: path.join(tmp, 'absent') });
  t.is(missing.code, 1);
  t.regex(missing.stderr, /cannot create a private directory for koffi\.node under .*absent \(set TMPDIR/);
});

test('KANAL_EXECUTABLE picks the command the kit runs, and must be absolute', (t) => {
  t.deepEqual(kanalCommand({}), [process.execPath, ...RUNTIME_FLAGS, KANAL_CLI]);
  t.deepEqual(kanalCommand({ KANAL_EXECUTABLE: '/opt/kanal' }), ['/opt/kanal']);
  t.throws(() => kanalCommand({ KANAL_EXECUTABLE: 'kanal' }), { message: /KANAL_EXECUTABLE=kanal: give the executable's absolute path/ });
});

test('the demo runs end to end with the executable', async (t) => {
  t.timeout(120_000);
  const file = await kanalExecutable();
  const r = await run(process.execPath, [DEMO], { env: { ...process.env, NODE_OPTIONS: '', KANAL_EXECUTABLE: file }, timeoutMs: 110_000 });
  t.is(r.code, 0, `${r.stdout}\n${r.stderr}`);
  t.true(r.stdout.includes(`kanal demo: running ${file}\n`), r.stdout);
  t.regex(r.stdout, /all demo steps behaved as expected/);
});

test('the SBOM lists Kanal, the runtime, koffi native module and every bundled npm package with its version', async (t) => {
  const file = await kanalExecutable();
  const doc = JSON.parse(fs.readFileSync(path.join(path.dirname(file), 'kanal.cdx.json'), 'utf8')) as {
    bomFormat: string;
    specVersion: string;
    metadata: { component: Component };
    components: Component[];
  };
  t.is(doc.bomFormat, 'CycloneDX');
  t.is(doc.specVersion, '1.5');
  t.like(doc.metadata.component, { name: 'kanal', version: PACKAGE_VERSION, hashes: [{ alg: 'SHA-256', content: sha256File(file) }] });

  const node = doc.components.find((c) => c.name === 'node');
  t.like(node, { type: 'platform', version: process.versions.node });
  t.deepEqual(
    node?.components?.map((c) => [c.name, c.version]),
    [
      ['v8', process.versions.v8],
      ['openssl', process.versions.openssl],
    ],
  );
  const native = doc.components.find((c) => c.type === 'file' && c.name === 'koffi.node');
  t.deepEqual(native?.hashes, [{ alg: 'SHA-256', content: sha256File(KOFFI_NODE) }]);

  // What esbuild bundles today, independently of the build that wrote the SBOM.
  const dir = scopedTempDir(t, 'kanal-exe-bundle-');
  const bundled = bundledPackages((await bundleCli(path.join(REPO, 'dist'), path.join(dir, 'kanal.mjs'))).metafile, REPO);
  t.true(bundled.length > 10, `bundled: ${bundled.map((p) => p.name).join(' ')}`);
  const listed = new Set(doc.components.filter((c) => c.type === 'library').map((c) => `${c.name}@${c.version ?? ''}`));
  t.deepEqual(
    bundled.filter((p) => !listed.has(`${p.name}@${p.version}`)),
    [],
    'every bundled package is in the SBOM',
  );
  for (const name of ['koffi', 'yargs', '@grpc/grpc-js', '@koromix/koffi-linux-x64'])
    t.true(
      [...listed].some((l) => l.startsWith(`${name}@`)),
      name,
    );
  // Every npm package carries a hash of what was installed: npm sbom's, or package-lock.json's integrity.
  const unhashed = doc.components.filter((c) => c.type === 'library' && c.purl?.startsWith('pkg:npm/') && !(c.hashes?.length ?? 0));
  t.deepEqual(
    unhashed.map((c) => `${c.name}@${c.version ?? ''}`),
    [],
    'npm packages without a hash',
  );
});

// ------------------------------------------------------------ network namespaces (root)

test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) skippedBecause('the executable in network namespaces', unavailable);
const kernelTest = unavailable ? test.skip : test.serial;

kernelTest(
  'node side round trip with the executable: netlink makes kanal0, the tunnel carries /version, a clean stop removes it',
  async (t) => {
    t.timeout(120_000);
    const topo = await createTopology({ kanal: [await kanalExecutable()] });
    t.teardown(() => topo.destroy());
    await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
    await startServer(topo);
    const agent = await startAgent(topo);
    t.deepEqual(
      (await findAddress(topo.node, ADVERTISE_IP)).map((a) => [a.ifname, a.addr.prefixlen, a.addr.scope]),
      [['kanal0', 32, 'host']],
    );
    const r = await topo.curl(topo.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', topo.pki.caCert], 10_000);
    t.is(r.status, 200, r.result.stderr);
    t.is((JSON.parse(r.body) as { gitVersion: string }).gitVersion, KAS_GIT_VERSION);
    t.deepEqual(await agent.stop('SIGTERM').then(() => agent.exited), { code: 0, signal: null });
    t.deepEqual(await findAddress(topo.node, ADVERTISE_IP), [], 'kanal0 removed');
    t.deepEqual(
      agent.jsonLines().filter((l) => levelAtLeast(l.level, 'error')),
      [],
    );
  },
);
