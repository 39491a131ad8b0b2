/**
 * RBAC for the Kubernetes API stand-in, evaluated from the same YAML an
 * operator applies (Role, ClusterRole, RoleBinding, ClusterRoleBinding), so
 * the tests prove that the manifests in deploy/rbac/ grant exactly what
 * Kanal needs. The bootstrap ClusterRoles the manifests refer to
 * (system:auth-delegator, cluster-admin) are built in, with the rules a
 * kube-apiserver bootstraps them with.
 */
import { parseAllDocuments } from 'yaml';

export interface PolicyRule {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
  resourceNames?: string[];
}

interface Subject {
  kind: 'User' | 'Group' | 'ServiceAccount';
  name: string;
  namespace?: string;
}

interface Binding {
  /** Undefined for a ClusterRoleBinding. */
  namespace?: string;
  roleRef: { kind: 'Role' | 'ClusterRole'; name: string };
  subjects: Subject[];
}

export interface RequestAttributes {
  user: { username: string; groups: readonly string[] };
  verb: string;
  apiGroup: string;
  resource: string;
  namespace?: string;
  name?: string;
}

const BOOTSTRAP_CLUSTER_ROLES: Record<string, PolicyRule[]> = {
  'cluster-admin': [{ apiGroups: ['*'], resources: ['*'], verbs: ['*'] }],
  // plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go
  'system:auth-delegator': [
    { apiGroups: ['authentication.k8s.io'], resources: ['tokenreviews'], verbs: ['create'] },
    { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
  ],
};

export class Rbac {
  private readonly clusterRoles = new Map<string, PolicyRule[]>(Object.entries(BOOTSTRAP_CLUSTER_ROLES));
  private readonly roles = new Map<string, PolicyRule[]>();
  private readonly bindings: Binding[] = [];

  /** Loads every RBAC object in the YAML documents; other kinds are skipped. */
  static fromYaml(...texts: string[]): Rbac {
    const rbac = new Rbac();
    for (const text of texts) {
      for (const doc of parseAllDocuments(text)) {
        const obj: unknown = doc.toJS();
        if (obj && typeof obj === 'object') rbac.add(obj as Record<string, unknown>);
      }
    }
    return rbac;
  }

  add(obj: Record<string, unknown>): void {
    const meta = (obj.metadata ?? {}) as { name?: string; namespace?: string };
    switch (obj.kind) {
      case 'ClusterRole':
        this.clusterRoles.set(String(meta.name), (obj.rules ?? []) as PolicyRule[]);
        break;
      case 'Role':
        this.roles.set(`${meta.namespace ?? 'default'}/${meta.name}`, (obj.rules ?? []) as PolicyRule[]);
        break;
      case 'ClusterRoleBinding':
      case 'RoleBinding':
        this.bindings.push({
          ...(obj.kind === 'RoleBinding' ? { namespace: meta.namespace ?? 'default' } : {}),
          roleRef: obj.roleRef as Binding['roleRef'],
          subjects: (obj.subjects ?? []) as Subject[],
        });
        break;
    }
  }

  allows(a: RequestAttributes): boolean {
    return this.bindings.some((b) => {
      if (b.namespace !== undefined && b.namespace !== a.namespace) return false;
      if (!b.subjects.some((s) => subjectMatches(s, a.user, b.namespace))) return false;
      const rules =
        b.roleRef.kind === 'ClusterRole' ? this.clusterRoles.get(b.roleRef.name) : this.roles.get(`${b.namespace}/${b.roleRef.name}`);
      return (rules ?? []).some((r) => ruleAllows(r, a));
    });
  }
}

function subjectMatches(s: Subject, user: RequestAttributes['user'], bindingNamespace: string | undefined): boolean {
  switch (s.kind) {
    case 'User':
      return s.name === user.username;
    case 'Group':
      return user.groups.includes(s.name);
    case 'ServiceAccount':
      return user.username === `system:serviceaccount:${s.namespace ?? bindingNamespace}:${s.name}`;
  }
}

function ruleAllows(r: PolicyRule, a: RequestAttributes): boolean {
  const has = (list: string[] | undefined, v: string): boolean => (list ?? []).includes('*') || (list ?? []).includes(v);
  if (!has(r.verbs, a.verb) || !has(r.apiGroups, a.apiGroup) || !has(r.resources, a.resource)) return false;
  // resourceNames cannot restrict create, list, watch or deletecollection (no name in the request).
  return !r.resourceNames?.length || (a.name !== undefined && r.resourceNames.includes(a.name));
}

/** The kube-apiserver's wording for a denied request. */
export function forbiddenMessage(a: RequestAttributes): string {
  const what = `${a.resource}.${a.apiGroup}${a.name ? ` ${JSON.stringify(a.name)}` : ''}`;
  const scope = a.namespace ? `in the namespace ${JSON.stringify(a.namespace)}` : 'at the cluster scope';
  return `${what} is forbidden: User ${JSON.stringify(a.user.username)} cannot ${a.verb} resource ${JSON.stringify(a.resource)} in API group ${JSON.stringify(a.apiGroup)} ${scope}`;
}
