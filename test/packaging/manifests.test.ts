// Static pods, EgressSelectorConfiguration examples and the bootstrap
// kubeconfig: each parses, passes a schema check that works offline, agrees
// with the other files it must match, and every command line in them is
// accepted by the CLI.
//
// Pod schema: kubernetes-models (OpenAPI of Kubernetes 1.27, compiled to
// validators) for types and required fields, plus TypeScript's excess-property
// check against the same package's types for unknown or misspelt fields,
// which the OpenAPI validators let through.

import test from 'ava';
import { readFile, readdir, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { Pod, type IPod } from 'kubernetes-models/v1';
import { parseDuration } from '../../src/common/duration.js';
import { execForm, last, stages } from '../helpers/dockerfile.js';
import { REPO, dryRunRefusal, kanal, parseEnvFile, run, tempDir } from '../helpers/packaging.js';

const STATIC_PODS = path.join(REPO, 'static-pods');
const DEPLOY = path.join(REPO, 'deploy');
const EGRESS = path.join(DEPLOY, 'egress-selector');

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
type JsonObject = { [key: string]: Json };

function isObject(v: Json | undefined): v is JsonObject {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A value as text for a message: scalars as String() shows them, mappings and lists as JSON. */
function shown(v: Json | undefined): string {
  return isObject(v) || Array.isArray(v) ? JSON.stringify(v) : String(v);
}

/** Parses a YAML file that must hold exactly one document, with no YAML errors or warnings. */
async function loadYaml(file: string): Promise<JsonObject> {
  const docs = parseAllDocuments(await readFile(file, 'utf8'), { strict: true, uniqueKeys: true, prettyErrors: true });
  if (!Array.isArray(docs)) throw new Error(`${file}: not a YAML stream`);
  if (docs.length !== 1) throw new Error(`${file}: expected one YAML document, found ${docs.length}`);
  const doc = docs[0];
  const problems = [...doc.errors, ...doc.warnings].map((e) => e.message);
  if (problems.length > 0) throw new Error(`${file}: ${problems.join('; ')}`);
  const value = doc.toJS() as Json;
  if (!isObject(value)) throw new Error(`${file}: top level is not a mapping`);
  return value;
}

/** Flag value from "--name=value" / "--name value" words (last one wins). */
function flag(words: readonly string[], name: string): string | undefined {
  let value: string | undefined;
  words.forEach((w, i) => {
    if (w === `--${name}`) value = words[i + 1];
    else if (w.startsWith(`--${name}=`)) value = w.slice(name.length + 3);
  });
  return value;
}

function flags(words: readonly string[], name: string): string[] {
  const out: string[] = [];
  words.forEach((w, i) => {
    if (w === `--${name}`) out.push(words[i + 1]);
    else if (w.startsWith(`--${name}=`)) out.push(w.slice(name.length + 3));
  });
  return out;
}

/** The image's ENTRYPOINT (deploy/image/Dockerfile's last stage): what runs when a container has no `command`. */
const imageEntrypoint = execForm(last(stages(await readFile(path.join(DEPLOY, 'image', 'Dockerfile'), 'utf8')).pop()!, 'ENTRYPOINT')!);

const egressFiles = (await readdir(EGRESS)).filter((f) => f.endsWith('.yaml')).sort();
const podFiles = (await readdir(STATIC_PODS)).filter((f) => f.endsWith('.yaml')).sort();
const pods = new Map<string, IPod>();
for (const f of podFiles) pods.set(f, (await loadYaml(path.join(STATIC_PODS, f))) as unknown as IPod);

function container(file: string): NonNullable<IPod['spec']>['containers'][number] {
  const c = pods.get(file)?.spec?.containers[0];
  if (!c) throw new Error(`${file}: no container`);
  return c;
}

test('static-pods/ holds the agent and the server', (t) => {
  t.deepEqual(podFiles, ['kanal-agent.yaml', 'kanal-server.yaml']);
});

for (const file of podFiles) {
  test(`${file} passes the Kubernetes 1.27 OpenAPI validation (kubernetes-models)`, (t) => {
    const pod = pods.get(file)!;
    t.is(pod.apiVersion, 'v1');
    t.is(pod.kind, 'Pod');
    t.notThrows(() => new Pod(pod).validate());
    for (const c of pod.spec!.containers) t.truthy(c.image, `${c.name} names an image`);
  });

  test(`${file} uses container command lines the CLI accepts`, async (t) => {
    for (const c of pods.get(file)!.spec!.containers) {
      const argv = [...(c.command ?? imageEntrypoint), ...(c.args ?? [])];
      t.is(path.posix.basename(argv[0]), 'kanal', `${c.name} runs kanal`);
      const r = await kanal([...argv.slice(1), '--dry-run']);
      t.is(dryRunRefusal(r), undefined, `kanal ${argv.slice(1).join(' ')} --dry-run`);
    }
  });

  test(`${file}: every file a flag names is inside a mounted host path`, (t) => {
    const pod = pods.get(file)!;
    const c = pod.spec!.containers[0];
    const mounts = (c.volumeMounts ?? []).flatMap((m) => {
      const hostPath = pod.spec!.volumes?.find((v) => v.name === m.name)?.hostPath?.path;
      return hostPath === undefined ? [] : [{ mountPath: m.mountPath, hostPath }];
    });
    for (const m of mounts)
      t.is(m.hostPath, m.mountPath, 'host paths are mounted at the same path, so flags read the same on the host and in the pod');
    const fileFlags = (c.args ?? []).filter((a) => /^--[a-z-]+=\//.test(a));
    t.true(fileFlags.length > 0);
    for (const a of fileFlags) {
      const value = a.slice(a.indexOf('=') + 1);
      t.true(
        mounts.some((m) => value.startsWith(`${m.mountPath}/`)),
        `${a} is under a mounted host path (${mounts.map((m) => m.mountPath).join(', ')})`,
      );
    }
  });
}

test('no unknown or misspelt fields in the static pods (TypeScript excess-property check against kubernetes-models types)', async (t) => {
  const tmp = await tempDir('kanal-podtypes-');
  t.teardown(tmp.remove);
  await symlink(path.join(REPO, 'node_modules'), path.join(tmp.dir, 'node_modules'));
  const body = [...pods.entries()].map(([f, pod], i) => `// ${f}\nexport const pod${i}: IPod = ${JSON.stringify(pod)};`).join('\n');
  await writeFile(path.join(tmp.dir, 'check.ts'), `import type { IPod } from 'kubernetes-models/v1';\n${body}\n`);
  const tsconfig = {
    compilerOptions: {
      strict: true,
      noEmit: true,
      module: 'NodeNext',
      moduleResolution: 'NodeNext',
      target: 'ES2022',
      skipLibCheck: true,
      types: [],
    },
    files: ['check.ts'],
  };
  await writeFile(path.join(tmp.dir, 'tsconfig.json'), JSON.stringify(tsconfig));
  const tsc = path.join(REPO, 'node_modules', 'typescript', 'bin', 'tsc');
  const ok = await run(process.execPath, [tsc, '-p', tmp.dir], { timeoutMs: 60_000 });
  t.is(ok.code, 0, ok.stdout + ok.stderr);
  // The check is real: a misspelt field fails it.
  const bad = { ...pods.get('kanal-agent.yaml')!, spec: { ...pods.get('kanal-agent.yaml')!.spec!, hostNetwrok: true } };
  await writeFile(
    path.join(tmp.dir, 'check.ts'),
    `import type { IPod } from 'kubernetes-models/v1';\nexport const bad: IPod = ${JSON.stringify(bad)};\n`,
  );
  const failed = await run(process.execPath, [tsc, '-p', tmp.dir], { timeoutMs: 60_000 });
  t.not(failed.code, 0);
  t.regex(failed.stdout, /hostNetwrok/);
});

test('agent static pod: host network, NET_ADMIN only, node-critical, credentials from /etc/kanal, probes on the health port', (t) => {
  const pod = pods.get('kanal-agent.yaml')!;
  const spec = pod.spec!;
  const c = container('kanal-agent.yaml');
  const args = c.args ?? [];
  t.is(pod.metadata?.namespace, 'kube-system');
  t.true(spec.hostNetwork);
  t.is(spec.priorityClassName, 'system-node-critical');
  t.deepEqual(c.securityContext?.capabilities?.add, ['NET_ADMIN']);
  t.deepEqual(c.securityContext?.capabilities?.drop, ['ALL']);
  t.is(c.securityContext?.runAsUser, 0, 'added capabilities reach only uid 0 in a pod');
  t.false(c.securityContext?.allowPrivilegeEscalation);
  t.true(c.securityContext?.readOnlyRootFilesystem);
  const volume = spec.volumes?.find((v) => v.hostPath?.path === '/etc/kanal');
  t.truthy(volume);
  t.true(c.volumeMounts?.find((m) => m.name === volume?.name)?.readOnly);
  const healthPort = Number(flag(args, 'health-server-port') ?? 8093);
  t.is(healthPort, 8093);
  for (const [probe, urlPath] of [
    [c.livenessProbe, '/healthz'],
    [c.readinessProbe, '/readyz'],
  ] as const) {
    t.is(probe?.httpGet?.port, healthPort);
    t.is(probe?.httpGet?.path, urlPath);
    const bind = flag(args, 'health-bind-address') ?? '0.0.0.0';
    if (bind !== '0.0.0.0') t.is(probe?.httpGet?.host, bind, 'the probe goes where the health port listens');
  }
  const grace = parseDuration(flag(args, 'shutdown-grace-period') ?? '30s') / 1000;
  t.true((spec.terminationGracePeriodSeconds ?? 30) > grace, 'the kubelet waits longer than the agent drains');
  t.truthy(flag(args, 'bind-address'), 'serves the kube-apiserver address on the node (KEP-2025)');
});

test('server static pod: beside the kube-apiserver, frontend socket in a shared host directory', (t) => {
  const spec = pods.get('kanal-server.yaml')!.spec!;
  const c = container('kanal-server.yaml');
  const args = c.args ?? [];
  t.true(spec.hostNetwork, 'agents reach port 8091 on the control-plane host');
  const uds = flag(args, 'uds-name');
  t.truthy(uds);
  const dir = path.posix.dirname(uds!);
  const volume = spec.volumes?.find((v) => v.hostPath?.path === dir);
  t.truthy(volume, `a hostPath volume for ${dir}`);
  t.is(volume?.hostPath?.type, 'Directory', 'prepared for the non-root server; one the kubelet created would be root-owned');
  const mount = c.volumeMounts?.find((m) => m.name === volume?.name);
  t.is(mount?.mountPath, dir);
  t.not(mount?.readOnly, true, 'the server creates the socket there');
  t.true(args.includes('--delete-existing-uds-file'), 'a restart replaces the stale socket');
  t.truthy(flag(args, 'cluster-ca-cert'), 'agents are authenticated');
  t.true(flags(args, 'allowed-destination').length > 0, 'node -> control plane has an explicit allow-list');
  t.deepEqual(c.securityContext?.capabilities?.drop, ['ALL']);
  t.is(c.securityContext?.capabilities?.add, undefined);
  t.is(c.securityContext?.runAsUser, 65532, "the image's nonroot user");
  t.true(c.securityContext?.runAsNonRoot);
  t.false(c.securityContext?.allowPrivilegeEscalation);
  t.true(c.securityContext?.readOnlyRootFilesystem);
  t.is(c.livenessProbe?.httpGet?.port, Number(flag(args, 'health-port') ?? 8092));
});

// ---------------------------------------------------------------- EgressSelectorConfiguration

/**
 * apiserver.k8s.io/v1beta1 EgressSelectorConfiguration, checked as the
 * kube-apiserver reads it: strict decoding (unknown fields are errors) and
 * k8s.io/apiserver's ValidateEgressSelectorConfiguration rules.
 */
function validateEgressSelector(doc: JsonObject): string[] {
  const errors: string[] = [];
  const only = (obj: JsonObject, where: string, allowed: string[]): void => {
    for (const key of Object.keys(obj)) if (!allowed.includes(key)) errors.push(`${where}: unknown field "${key}"`);
  };
  only(doc, '', ['apiVersion', 'kind', 'egressSelections']);
  if (doc.apiVersion !== 'apiserver.k8s.io/v1beta1') errors.push(`apiVersion ${shown(doc.apiVersion)}`);
  if (doc.kind !== 'EgressSelectorConfiguration') errors.push(`kind ${shown(doc.kind)}`);
  const selections = doc.egressSelections;
  if (!Array.isArray(selections) || selections.length === 0) return [...errors, 'egressSelections must be a non-empty list'];
  const seen = new Set<string>();
  selections.forEach((sel, i) => {
    const where = `egressSelections[${i}]`;
    if (!isObject(sel)) return void errors.push(`${where}: not a mapping`);
    only(sel, where, ['name', 'connection']);
    const name = shown(sel.name ?? '').toLowerCase();
    if (!['cluster', 'controlplane', 'etcd'].includes(name))
      errors.push(`${where}.name "${name}" is not one of cluster, controlplane, etcd`);
    if (seen.has(name)) errors.push(`${where}.name "${name}" is duplicated`);
    seen.add(name);
    const conn = sel.connection;
    if (!isObject(conn)) return void errors.push(`${where}.connection missing`);
    only(conn, `${where}.connection`, ['proxyProtocol', 'transport']);
    const transport = conn.transport;
    if (transport !== undefined && !isObject(transport)) return void errors.push(`${where}.connection.transport: not a mapping`);
    if (transport) only(transport, `${where}.connection.transport`, ['tcp', 'uds']);
    const uds = transport?.uds;
    const tcp = transport?.tcp;
    if (isObject(uds)) {
      only(uds, `${where}.transport.uds`, ['udsName']);
      if (!uds.udsName) errors.push(`${where}: udsName must be present for UDS connections`);
    }
    if (isObject(tcp)) {
      only(tcp, `${where}.transport.tcp`, ['url', 'tlsConfig']);
      const url = shown(tcp.url ?? '');
      const tls = tcp.tlsConfig;
      if (url.startsWith('https://')) {
        if (!isObject(tls)) errors.push(`${where}: TLSConfig must be present when using HTTPS`);
        else {
          only(tls, `${where}.transport.tcp.tlsConfig`, ['caBundle', 'clientKey', 'clientCert']);
          if (!tls.clientCert) errors.push(`${where}: using TLS requires clientCert`);
          if (!tls.clientKey) errors.push(`${where}: using TLS requires clientKey`);
        }
      } else if (url.startsWith('http://')) {
        if (tls !== undefined) errors.push(`${where}: tlsConfig must not be present when using HTTP`);
      } else errors.push(`${where}: url ${url}: supported connection protocols are http:// and https://`);
    }
    switch (conn.proxyProtocol) {
      case 'Direct':
        if (transport !== undefined) errors.push(`${where}: transport must be absent for Direct`);
        break;
      case 'HTTPConnect':
        if (!transport) errors.push(`${where}: transport must be set for HTTPConnect`);
        else if (uds && tcp) errors.push(`${where}: TCP and UDS cannot both be set`);
        else if (!uds && !tcp) errors.push(`${where}: one of TCP or UDS must be set`);
        break;
      case 'GRPC':
        if (!uds) errors.push(`${where}: UDS must be set with GRPC`);
        break;
      default:
        errors.push(`${where}: proxyProtocol ${shown(conn.proxyProtocol)} is not Direct, HTTPConnect or GRPC`);
    }
  });
  return errors;
}

test('the three EgressSelectorConfiguration examples are there', (t) => {
  t.deepEqual(egressFiles, ['tcp-mtls-http-connect.yaml', 'uds-grpc.yaml', 'uds-http-connect.yaml']);
});

for (const file of egressFiles) {
  test(`egress-selector/${file} is a valid EgressSelectorConfiguration with a "cluster" selection`, async (t) => {
    const doc = await loadYaml(path.join(EGRESS, file));
    t.deepEqual(validateEgressSelector(doc), []);
    const selections = doc.egressSelections as JsonObject[];
    t.true(selections.some((s) => s.name === 'cluster'));
  });
}

test('the egress selector validation is real: it refuses GRPC over TCP, unknown fields and other names', (t) => {
  const bad: JsonObject = {
    apiVersion: 'apiserver.k8s.io/v1beta1',
    kind: 'EgressSelectorConfiguration',
    egressSelections: [
      {
        name: 'nodes',
        connection: { proxyProtocol: 'GRPC', transport: { tcp: { url: 'https://x:1', tlsConfig: { caBundle: 'a' } } }, extra: 1 },
      },
    ],
  };
  const errors = validateEgressSelector(bad).join('\n');
  t.regex(errors, /not one of cluster/);
  t.regex(errors, /UDS must be set with GRPC/);
  t.regex(errors, /unknown field "extra"/);
  t.regex(errors, /requires clientCert/);
});

test('egress examples match the servers: same socket as the server pod, TCP port and mode of the TCP server', async (t) => {
  const serverArgs = container('kanal-server.yaml').args ?? [];
  const uds = flag(serverArgs, 'uds-name');
  const mode = flag(serverArgs, 'mode') ?? 'both';
  for (const [file, protocol] of [
    ['uds-grpc.yaml', 'grpc'],
    ['uds-http-connect.yaml', 'http-connect'],
  ] as const) {
    const doc = await loadYaml(path.join(EGRESS, file));
    const conn = (doc.egressSelections as JsonObject[])[0].connection as JsonObject;
    t.is(((conn.transport as JsonObject).uds as JsonObject).udsName, uds ?? null, file);
    t.true(mode === 'both' || mode === protocol, `${file}: the server pod serves ${protocol}`);
  }
  const tcpDoc = await loadYaml(path.join(EGRESS, 'tcp-mtls-http-connect.yaml'));
  const tcp = (((tcpDoc.egressSelections as JsonObject[])[0].connection as JsonObject).transport as JsonObject).tcp as JsonObject;
  const server = parseEnvFile(await readFile(path.join(DEPLOY, 'server-tcp.env.example'), 'utf8'))
    .get('KANAL_SERVER_FLAGS')!
    .split(' ');
  t.is(new URL(shown(tcp.url)).port, flag(server, 'server-port') ?? '');
  t.true(['both', 'http-connect'].includes(flag(server, 'mode') ?? 'both'));
  t.truthy(flag(server, 'server-ca-cert'), 'the TCP frontend requires the kube-apiserver client certificate');
  // The systemd server puts its socket in its RuntimeDirectory.
  const sysServer = parseEnvFile(await readFile(path.join(DEPLOY, 'server.env.example'), 'utf8'))
    .get('KANAL_SERVER_FLAGS')!
    .split(' ');
  t.is(path.posix.dirname(flag(sysServer, 'uds-name')!), '/run/kanal-server');
});

// ---------------------------------------------------------------- bootstrap kubeconfig

test('bootstrap kubeconfig template: placeholders, and kubectl reads it once filled in with the agent example', async (t) => {
  const templatePath = path.join(DEPLOY, 'bootstrap-kubeconfig.template.yaml');
  const template = await readFile(templatePath, 'utf8');
  const doc = await loadYaml(templatePath);
  t.is(doc.apiVersion, 'v1');
  t.is(doc.kind, 'Config');
  const clusters = doc.clusters as JsonObject[];
  t.is(clusters.length, 1);
  t.is((clusters[0].cluster as JsonObject).server, 'https://ADVERTISE_IP:PORT');
  for (const placeholder of ['ADVERTISE_IP', 'PORT', 'BOOTSTRAP_TOKEN']) t.true(template.includes(placeholder), placeholder);

  // Fill in from the agent's own flags: the address it serves and the port of its --target.
  const agentArgs = container('kanal-agent.yaml').args ?? [];
  const advertise = flag(agentArgs, 'bind-address')!;
  const port = flag(agentArgs, 'target')!.split(':')[0];
  const filled = template
    .replace(/ADVERTISE_IP/g, advertise)
    .replace(/:PORT\b/g, `:${port}`)
    .replace(/BOOTSTRAP_TOKEN/g, 'abcdef.0123456789abcdef');
  const tmp = await tempDir('kanal-kubeconfig-');
  t.teardown(tmp.remove);
  const file = path.join(tmp.dir, 'bootstrap-kubelet.conf');
  await writeFile(file, filled);
  const view = await run('kubectl', ['config', 'view', '--kubeconfig', file, '--raw', '-o', 'json'], { timeoutMs: 30_000 });
  t.is(view.code, 0, view.stderr);
  const parsed = JSON.parse(view.stdout) as JsonObject;
  const cluster = ((parsed.clusters as JsonObject[])[0].cluster as JsonObject).server;
  t.is(cluster, `https://${advertise}:${port}`);
  t.is(parsed['current-context'], 'tls-bootstrap-token-user@kubernetes');
  const user = ((parsed.users as JsonObject[])[0].user as JsonObject).token;
  t.is(user, 'abcdef.0123456789abcdef');
  const url = await run('kubectl', ['config', 'view', '--kubeconfig', file, '--minify', '-o', 'jsonpath={.clusters[0].cluster.server}'], {
    timeoutMs: 30_000,
  });
  t.is(url.stdout, `https://${advertise}:${port}`, url.stderr);
});

test('the agent example env file and the agent pod serve the same address and port as the kubeconfig expects', async (t) => {
  const podArgs = container('kanal-agent.yaml').args ?? [];
  const envArgs = parseEnvFile(await readFile(path.join(DEPLOY, 'agent.env.example'), 'utf8'))
    .get('KANAL_AGENT_FLAGS')!
    .split(' ');
  t.is(flag(envArgs, 'bind-address'), flag(podArgs, 'bind-address'));
  t.is(flag(envArgs, 'target'), flag(podArgs, 'target'));
  // The server pod allows what the agent's target dials.
  const destination = flag(podArgs, 'target')!.split(':').slice(1).join(':');
  t.true(flags(container('kanal-server.yaml').args ?? [], 'allowed-destination').includes(destination));
});
