// deploy/image/Dockerfile without a container engine: what it builds from,
// which files it adds and where, as which user it runs, its labels; then the
// same root file system laid out here (the base's libraries from this
// machine's Debian 12, the executable where COPY puts it, nothing else) and
// the ENTRYPOINT run from it as USER: `kanal version` and the server pod's
// own command line with --dry-run.

import test from 'ava';
import { access, chown, mkdir, readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { copies, execForm, labels, last, stages, type Stage } from '../helpers/dockerfile.js';
import { kanalExecutable } from '../helpers/executable.js';
import { assembleImageRoot, hostUnfitReason, runInRoot } from '../helpers/image-root.js';
import { REPO, dryRunRefusal, tempDir } from '../helpers/packaging.js';

const DOCKERFILE = path.join(REPO, 'deploy', 'image', 'Dockerfile');
const pkg = JSON.parse(await readFile(path.join(REPO, 'package.json'), 'utf8')) as { name: string; version: string; license: string };
const all = stages(await readFile(DOCKERFILE, 'utf8'));
const final = all[all.length - 1];
const isRoot = process.getuid?.() === 0;
const hostUnfit = await hostUnfitReason();

/** The USER instruction as uid and gid (numeric: a name would need the image's /etc/passwd to mean anything to the kubelet). */
function imageUser(stage: Stage): { uid: number; gid: number } {
  const user = last(stage, 'USER')?.args.trim() ?? '';
  const m = /^(\d+)(?::(\d+))?$/.exec(user);
  if (!m) throw new Error(`Dockerfile: USER ${JSON.stringify(user)} is not a numeric uid[:gid]`);
  return { uid: Number(m[1]), gid: Number(m[2] ?? m[1]) };
}

test('Dockerfile: distroless cc-debian12 base, libatomic from Debian 12, no shell steps in the image', (t) => {
  t.is(all.length, 2, 'two stages: libatomic, then the image');
  t.regex(final.from, /^gcr\.io\/distroless\/cc-debian12:[\w.-]+(@sha256:[0-9a-f]{64})?$/, 'a tag (and a digest once pinned)');
  t.deepEqual(
    final.instructions.filter((i) => i.keyword === 'RUN'),
    [],
    'distroless has no shell: the final stage only copies',
  );
  const libs = all[0];
  t.is(libs.name, 'libatomic');
  t.regex(libs.from, /^debian:12(-slim)?(@sha256:[0-9a-f]{64})?$/, 'the same Debian release as the base, so the same glibc');
  const install = libs.instructions.find((i) => i.keyword === 'RUN')?.args ?? '';
  t.regex(install, /apt-get install --yes --no-install-recommends libatomic1\b/);
});

test('Dockerfile: adds exactly the executable, its SBOM and libatomic, runs as 65532, ENTRYPOINT the executable', (t) => {
  t.deepEqual(copies(final), [
    {
      from: 'libatomic',
      sources: ['/usr/lib/x86_64-linux-gnu/libatomic.so.1.2.0'],
      destination: '/usr/lib/x86_64-linux-gnu/libatomic.so.1',
    },
    { sources: ['dist/release/kanal'], destination: '/usr/local/bin/kanal' },
    { sources: ['dist/release/kanal.cdx.json'], destination: '/usr/share/doc/kanal/kanal.cdx.json' },
  ]);
  t.deepEqual(imageUser(final), { uid: 65532, gid: 65532 }, "distroless's nonroot user");
  const entrypoint = last(final, 'ENTRYPOINT');
  t.truthy(entrypoint, 'an ENTRYPOINT');
  t.deepEqual(execForm(entrypoint!), ['/usr/local/bin/kanal']);
  t.is(last(final, 'CMD'), undefined, 'no CMD: a pod without args gets the CLI usage, not a guess');
});

test('Dockerfile: OCI labels name this version, its licence and its source', (t) => {
  const l = labels(final);
  t.is(l.get('org.opencontainers.image.version'), pkg.version, 'ARG VERSION defaults to package.json version');
  t.is(l.get('org.opencontainers.image.licenses'), pkg.license);
  t.is(l.get('org.opencontainers.image.title'), pkg.name);
  t.regex(l.get('org.opencontainers.image.source') ?? '', /^https:\/\//);
  t.truthy(l.get('org.opencontainers.image.revision'));
  t.is(l.get('org.opencontainers.image.base.name'), final.from);
});

interface PodSpec {
  containers: {
    image: string;
    securityContext?: { readOnlyRootFilesystem?: boolean };
    volumeMounts?: { name: string; mountPath: string; readOnly?: boolean }[];
  }[];
  volumes?: { name: string; emptyDir?: object }[];
}

/** The pod specs of static-pods/ and deploy/kubernetes/ (a Pod's spec, or a workload's template). */
async function podSpecs(): Promise<{ file: string; spec: PodSpec }[]> {
  const files = [
    ...(await readdir(path.join(REPO, 'static-pods'))).map((f) => path.join('static-pods', f)),
    ...(await readdir(path.join(REPO, 'deploy', 'kubernetes'))).map((f) => path.join('deploy', 'kubernetes', f)),
  ].filter((f) => f.endsWith('.yaml'));
  const out: { file: string; spec: PodSpec }[] = [];
  for (const file of files) {
    // A file may hold several documents (a Deployment beside its Services and ConfigMap): every workload's pod.
    for (const d of parseAllDocuments(await readFile(path.join(REPO, file), 'utf8'))) {
      const doc = d.toJS() as { kind: string; spec?: PodSpec & { template?: { spec: PodSpec } } };
      const spec = doc.spec?.template?.spec ?? (doc.kind === 'Pod' ? doc.spec : undefined);
      if (spec) out.push({ file, spec });
    }
  }
  return out;
}

test('every manifest runs the image of this version', async (t) => {
  const specs = await podSpecs();
  t.true(specs.length >= 4);
  for (const { file, spec } of specs) for (const c of spec.containers) t.is(c.image, `localhost/kanal:${pkg.version}`, file);
});

test('every read-only root file system has a writable /tmp: the executable loads koffi from there', async (t) => {
  for (const { file, spec } of await podSpecs()) {
    for (const c of spec.containers) {
      t.true(c.securityContext?.readOnlyRootFilesystem, `${file}: a read-only root file system`);
      const mount = c.volumeMounts?.find((m) => m.mountPath === '/tmp');
      t.truthy(mount, `${file}: mount an emptyDir at /tmp (native/embedded-koffi.ts writes koffi's module there)`);
      t.not(mount?.readOnly, true, file);
      t.truthy(spec.volumes?.find((v) => v.name === mount?.name)?.emptyDir, `${file}: /tmp is an emptyDir`);
    }
  }
});

const rootTest = !isRoot || hostUnfit ? test.skip : test.serial;
if (!isRoot) console.error('packaging-image: the root file system test skipped: chroot needs root');
else if (hostUnfit) console.error(`packaging-image: the root file system test skipped: ${hostUnfit}`);

rootTest('the ENTRYPOINT runs from the image root file system as USER, with nothing else installed', async (t) => {
  const executable = await kanalExecutable();
  const tmp = await tempDir('kanal-image-root-');
  t.teardown(tmp.remove);
  const root = path.join(tmp.dir, 'root');
  const user = imageUser(final);
  const entrypoint = execForm(last(final, 'ENTRYPOINT')!);
  const image = await assembleImageRoot({
    root,
    copies: copies(final),
    // The build context is the repository; dist/release/ is where npm run package writes.
    contextFile: (source) => (source === 'dist/release/kanal' ? executable : path.join(path.dirname(executable), path.basename(source))),
    entrypoint: entrypoint[0],
    user,
  });
  t.deepEqual(
    image.missing,
    [],
    'libraries the executable needs that gcr.io/distroless/cc-debian12 does not provide: add them to the Dockerfile',
  );
  t.true(image.files.includes(entrypoint[0]));
  await t.throwsAsync(access(path.join(root, 'bin/sh')), undefined, 'no shell in the root');

  const version = await runInRoot(root, user, [...entrypoint, 'version']);
  t.is(version.code, 0, version.stderr);
  t.true(version.stdout.includes(pkg.version), version.stdout);

  // The server pod's command line, its credentials where it names them, readable by USER (docs/operators-guide.md, 3.2).
  const pod = parse(await readFile(path.join(REPO, 'static-pods', 'kanal-server.yaml'), 'utf8')) as {
    spec: { containers: { args: string[] }[] };
  };
  const args = pod.spec.containers[0].args;
  const pki = await writeThrowawayPki(path.join(root, 'etc', 'kanal'));
  for (const file of [pki.caCert, pki.serverCert, pki.serverKey]) await chown(file, user.uid, user.gid);
  const socketDir = path.join(root, 'etc', 'kubernetes', 'konnectivity-server');
  await mkdir(socketDir, { recursive: true });
  await chown(socketDir, user.uid, user.gid);
  const dry = await runInRoot(root, user, [...entrypoint, ...args, '--dry-run']);
  t.is(dryRunRefusal(dry), undefined);
  t.is(dry.code, 0, dry.stderr);

  // koffi's module, embedded in the executable, is written to /tmp and loaded (its libraries: the base's).
  const check = await runInRoot(root, user, [
    ...entrypoint,
    'agent',
    '--check',
    '--proxy-server-host',
    '127.0.0.1',
    '--ca-cert',
    '/nonexistent',
  ]);
  t.is(check.code, 1, 'the missing CA fails the check');
  t.regex(check.stdout, /PASS\s+netlink\s+rtnetlink works/, `${check.stdout}${check.stderr}`);
});
