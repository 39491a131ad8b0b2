/**
 * deploy/kubernetes/: the DaemonSet-with-token agent and the HA lease server
 * are what docs/kubernetes-api.md shows, the shared server of many tenants
 * what docs/multi-tenant.md shows; their command lines must be accepted by
 * the CLI as written (only the files they name are absent here).
 */
import test from 'ava';
import { readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parse, parseAllDocuments } from 'yaml';
import { Deployment, type IDeployment } from 'kubernetes-models/apps/v1';
import { REPO, dryRunRefusal, kanal, tempDir } from '../helpers/packaging.js';
import { parseTenants } from '../../src/server/config/tenants-file.js';

interface SecurityContext {
  runAsUser?: number;
  allowPrivilegeEscalation?: boolean;
  readOnlyRootFilesystem?: boolean;
  capabilities?: { add?: string[]; drop?: string[] };
}

interface Container {
  args: string[];
  securityContext?: SecurityContext;
}

interface Workload {
  kind: string;
  spec: { containers?: Container[]; template?: { spec: { containers: Container[] } } };
}

for (const [file, command] of [
  ['kanal-agent-daemonset.yaml', 'agent'],
  ['kanal-server-ha.yaml', 'server'],
] as const) {
  test(`deploy/kubernetes/${file}: the ${command}'s arguments pass --dry-run`, async (t) => {
    const doc = parse(await readFile(path.join(REPO, 'deploy', 'kubernetes', file), 'utf8')) as Workload;
    const containers = doc.spec.template?.spec.containers ?? doc.spec.containers ?? [];
    t.is(containers.length, 1);
    // The kubelet expands $(NODE_NAME) from the downward API.
    const args = containers[0].args.map((a) => a.replace('$(NODE_NAME)', 'cp-1'));
    t.is(args[0], command);
    const r = await kanal([...args, '--dry-run']);
    t.is(dryRunRefusal(r), undefined);
    // Neither needs a capability (no --bind-address): all dropped, nothing to escalate to, nothing written.
    const sc = containers[0].securityContext;
    t.deepEqual(sc?.capabilities, { drop: ['ALL'] });
    t.false(sc?.allowPrivilegeEscalation);
    t.true(sc?.readOnlyRootFilesystem);
  });
}

test("deploy/kubernetes/kanal-multi-tenant.yaml: the tenants file is accepted, the server's arguments pass --dry-run, the Deployment validates", async (t) => {
  const docs = parseAllDocuments(await readFile(path.join(REPO, 'deploy', 'kubernetes', 'kanal-multi-tenant.yaml'), 'utf8')).map(
    (d) => d.toJS() as { kind: string; data?: Record<string, string> },
  );
  t.deepEqual(
    docs.map((d) => d.kind),
    ['ConfigMap', 'Deployment', 'Service', 'Service'],
  );
  const tenantsYaml = docs[0].data?.['tenants.yaml'] ?? '';
  t.deepEqual(
    parseTenants(tenantsYaml, 'tenants.yaml').map((s) => s.name),
    ['alpha', 'beta'],
  );
  const deployment = docs[1] as unknown as IDeployment;
  t.notThrows(() => new Deployment(deployment).validate());
  const replicas = deployment.spec?.replicas;
  t.true(
    parseTenants(tenantsYaml, 'tenants.yaml').every((s) => s.settings['server-count'] === replicas),
    "every tenant's server-count is the replica count",
  );
  const args = (deployment.spec?.template.spec?.containers[0].args ?? []).map((a) => a.replace('$(POD_NAME)', 'kanal-0'));
  const tmp = await tempDir('kanal-multi-tenant-');
  t.teardown(() => tmp.remove());
  const file = path.join(tmp.dir, 'tenants.yaml');
  await writeFile(file, tenantsYaml);
  const r = await kanal([...args.map((a) => (a.startsWith('--tenants-config=') ? `--tenants-config=${file}` : a)), '--dry-run']);
  t.is(dryRunRefusal(r), undefined);
});
