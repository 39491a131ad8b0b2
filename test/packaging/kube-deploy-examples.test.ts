/**
 * deploy/kubernetes/: the DaemonSet-with-token agent and the HA lease server
 * are what docs/kubernetes-api.md shows; their command lines must be
 * accepted by the CLI as written (only the files they name are absent here).
 */
import test from 'ava';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { parse } from 'yaml';
import { REPO, dryRunRefusal, kanal } from '../helpers/packaging.js';

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
