/**
 * The tenants file (`kanal server --tenants-config`, docs/multi-tenant.md):
 * a versioned YAML document listing the clusters one server serves. Read
 * whole and checked whole: every mistake is reported at once, each naming
 * its tenant and setting, and a file with any mistake is refused entirely
 * (at start: exit 2; on a reload: the running tenants stay).
 */
import fs from 'node:fs';
import { createHash } from 'node:crypto';
import { parseDocument, type YAMLParseError } from 'yaml';
import { errorMessage } from '../../common/error-message.js';
import { readFileSettings } from '../../settings/table.js';
import { kubeClientConfig } from '../../kube/settings.js';
import type { KubeClientConfig } from '../../kube/kube-clients.js';
import type { RolePins } from '../identity/client-roles.js';
import { tokenAuthSettings } from './config.js';
import { TenantsRefused } from '../tenants/tenant-definition.js';
import { tenantSettings, type TenantSettings } from './tenant-settings.js';
import { keyOf } from '../../settings/flag-names.js';
import { checkClients } from './clients-config.js';
import type { ClientSpec } from '../clients/client-entry.js';

/** The key of a tenant's `clients:` list (docs/multi-tenant.md): a list of mappings, no setting of the command line. */
export const CLIENTS_KEY = 'clients';

export const TENANTS_API_VERSION = 'kanal.dev/v1alpha1';
export const TENANTS_KIND = 'TenantsConfig';

/** Tenants one file may declare: each costs a little memory and a scrape's worth of metrics (bench/RESULTS.md). */
export const MAX_TENANTS = 10_000;
/** Largest tenants file read (10,000 tenants of a few hundred bytes each fit). */
export const MAX_TENANTS_FILE_BYTES = 16 * 1024 * 1024;

/** One tenant as the file declares it, checked; no file it names has been read yet. */
export interface TenantSpec {
  name: string;
  settings: TenantSettings;
  /** The serving pair presented for its server names (`cluster-cert`, `cluster-key`). */
  serving?: { certFile: string; keyFile: string };
  agentPins: RolePins;
  frontendPins: RolePins;
  /** Token review against the tenant's own kube-apiserver. */
  tokens?: { namespace: string; serviceAccount: string; audience: string; kube: KubeClientConfig };
  uds?: { path: string; deleteExisting: boolean; mode: number; gid?: number };
  /** Its frontend clients (`clients:`), checked; their token files are read by the loader. */
  clients?: ClientSpec[];
  /** The tenant's source text, canonical: equal texts mean an unchanged tenant on a reload. */
  fingerprint: string;
}

/** The credential files one entry names (`where`: its tenant), read by tenants-loader.ts. */
export interface TenantFiles {
  where: string;
  /** `cluster-cert` and `cluster-key`, when both are given. */
  serving?: { certFile: string; keyFile: string };
  /** `cluster-ca-cert`. */
  agentCa?: string;
  /** `server-ca-cert`. */
  frontendCa?: string;
}

/**
 * A tenants file checked: each entry's credential files (also of an entry
 * with mistakes, so the loader can report unusable files together with
 * every other mistake) and, for an entry without mistakes, its spec.
 */
export interface CheckedTenants {
  entries: { files: TenantFiles; spec?: TenantSpec }[];
  mistakes: string[];
  /** SHA-256 of the text read: what a watch compares the file with later (tenants/tenants-watch.ts). */
  digest: string;
}

/** A tenants file with mistakes (exit 2 at start, like every UsageError); `mistakes` has one line each. */
export class TenantsFileError extends TenantsRefused {
  override name = 'TenantsFileError';
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Reads and checks the file; throws TenantsFileError when it cannot be read or parsed, and returns every other mistake. */
export function readTenantsFile(file: string): CheckedTenants {
  let text: string;
  try {
    const size = fs.statSync(file).size;
    if (size > MAX_TENANTS_FILE_BYTES) throw new Error(`${size} bytes; at most ${MAX_TENANTS_FILE_BYTES} are read`);
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    throw new TenantsFileError(file, [`cannot read: ${errorMessage(err)}`]);
  }
  return { ...checkTenants(text, file), digest: createHash('sha256').update(text).digest('hex') };
}

/** Checks a tenants document's text (`file` names it in messages); throws TenantsFileError listing every mistake. */
export function parseTenants(text: string, file: string): TenantSpec[] {
  const { entries, mistakes } = checkTenants(text, file);
  if (mistakes.length > 0) throw new TenantsFileError(file, mistakes);
  return entries.flatMap((e) => (e.spec ? [e.spec] : []));
}

/**
 * A text that is not YAML (JSON is YAML too): only the first error, where
 * it is and the lines around it. The parser's further errors follow from
 * that one (one missing `]` gives several), so they are not listed.
 */
function parseError(e: YAMLParseError): string {
  const [first, ...frame] = e.message.split('\n');
  const what = first.replace(/ at line \d+, column \d+:?$/, '');
  const at = e.linePos ? ` at line ${e.linePos[0].line}, column ${e.linePos[0].col}` : '';
  const excerpt = frame.filter((l) => l.trim() !== '');
  return `not YAML${at}: ${what}${excerpt.length > 0 ? `\n    ${excerpt.join('\n    ')}` : ''}`;
}

/** Checks a tenants document's text: every mistake of its entries collected; one that leaves nothing to check thrown. */
function checkTenants(text: string, file: string): Omit<CheckedTenants, 'digest'> {
  const doc = parseDocument(text, { uniqueKeys: true });
  if (doc.errors.length > 0) throw new TenantsFileError(file, [parseError(doc.errors[0])]);
  const root: unknown = doc.toJS({ maxAliasCount: 100 });
  const mistakes: string[] = [];
  if (!isRecord(root))
    throw new TenantsFileError(file, [`want a mapping with apiVersion: ${TENANTS_API_VERSION}, kind: ${TENANTS_KIND} and tenants`]);
  if (root.apiVersion !== TENANTS_API_VERSION)
    mistakes.push(`apiVersion ${JSON.stringify(root.apiVersion)}: this Kanal reads ${TENANTS_API_VERSION}`);
  if (root.kind !== TENANTS_KIND) mistakes.push(`kind ${JSON.stringify(root.kind)}: want ${TENANTS_KIND}`);
  for (const key of Object.keys(root)) {
    if (!['apiVersion', 'kind', 'tenants'].includes(key))
      mistakes.push(`unknown key ${JSON.stringify(key)} (want apiVersion, kind, tenants)`);
  }
  const list = root.tenants ?? [];
  if (!Array.isArray(list)) {
    mistakes.push('tenants: want a list of tenants');
    throw new TenantsFileError(file, mistakes);
  }
  if (list.length > MAX_TENANTS) mistakes.push(`tenants: ${list.length} declared; at most ${MAX_TENANTS}`);
  const entries: CheckedTenants['entries'] = [];
  list.slice(0, MAX_TENANTS).forEach((entry: unknown, i) => {
    const checked = checkTenant(entry, i, mistakes);
    if (checked) entries.push(checked);
  });
  checkAcrossTenants(
    entries.flatMap((e) => (e.spec ? [e.spec] : [])),
    mistakes,
  );
  return { entries, mistakes };
}

/** `tenants[3] "alpha"`, or `tenants[3]` before its name is known. */
function where(i: number, name: unknown): string {
  return typeof name === 'string' && name !== '' ? `tenant ${JSON.stringify(name)}` : `tenants[${i}]`;
}

function checkTenant(entry: unknown, i: number, mistakes: string[]): CheckedTenants['entries'][number] | undefined {
  if (!isRecord(entry)) {
    mistakes.push(`tenants[${i}]: want a mapping of settings`);
    return undefined;
  }
  const at = where(i, entry.name);
  const own: string[] = [];
  for (const key of Object.keys(entry)) {
    if (!(key in tenantSettings) && key !== CLIENTS_KEY) own.push(`unknown setting ${JSON.stringify(key)}${unknownHint(key)}`);
  }
  const { values: v, mistakes: found } = readFileSettings(tenantSettings, entry);
  own.push(...found);
  const spec = tenantSpec(v, own);
  const clients = checkClients(entry[CLIENTS_KEY], {
    tokenReview:
      v['agent-namespace'] !== undefined && v['agent-service-account'] !== undefined && v['authentication-audience'] !== undefined,
    tokenReviewHint: "the tenant's token review: agent-namespace, agent-service-account and authentication-audience (and kubeconfig)",
  });
  own.push(...clients.mistakes);
  mistakes.push(...own.map((m) => `${at}: ${m}`));
  const files = filesOf(at, v);
  if (own.length > 0 || !spec) return { files };
  return {
    files,
    spec: { ...spec, ...(clients.specs.length > 0 ? { clients: clients.specs } : {}), fingerprint: JSON.stringify(entry) },
  };
}

/** The credential files an entry names (a value with a mistake was replaced by its default, usually none). */
function filesOf(where: string, v: TenantSettings): TenantFiles {
  const [certFile, keyFile, agentCa, frontendCa] = [v['cluster-cert'], v['cluster-key'], v['cluster-ca-cert'], v['server-ca-cert']];
  return {
    where,
    ...(certFile && keyFile ? { serving: { certFile, keyFile } } : {}),
    ...(agentCa ? { agentCa } : {}),
    ...(frontendCa ? { frontendCa } : {}),
  };
}

/** The command line's settings that are not a tenant's, and why. */
function unknownHint(key: string): string {
  if (key.startsWith('--')) return ': write the setting without dashes';
  return " (a tenant takes the settings listed in docs/multi-tenant.md; ports, listeners and logging are the command line's)";
}

/** The checks that tie a tenant's settings together (as config.ts does for the command line). */
function tenantSpec(v: TenantSettings, mistakes: string[]): Omit<TenantSpec, 'fingerprint'> | undefined {
  let tokens: TenantSpec['tokens'];
  try {
    const t = tokenAuthSettings(v);
    if (t) tokens = { ...t, kube: kubeClientConfig(v) };
  } catch (err) {
    mistakes.push(errorMessage(err).replace(/--([a-z-]+)/g, '$1'));
  }
  const serverNames = v['server-name'];
  const [cert, key] = [v['cluster-cert'], v['cluster-key']];
  if ((cert === undefined) !== (key === undefined)) mistakes.push('cluster-cert and cluster-key go together');
  if (serverNames.length > 0 && (!cert || !key))
    mistakes.push('server-name needs cluster-cert and cluster-key: the certificate presented for those names');
  if (cert && serverNames.length === 0) mistakes.push("cluster-cert is presented only for the tenant's server-name: add server-name");
  if (!v['cluster-ca-cert'] && !tokens)
    mistakes.push(
      'its agents need a credential: cluster-ca-cert (client certificates), or agent-namespace, agent-service-account and authentication-audience (tokens)',
    );
  if (v['token-issuer'] !== undefined && !tokens)
    mistakes.push('token-issuer needs token review: agent-namespace, agent-service-account and authentication-audience');
  if (tokens && !v['cluster-ca-cert'] && serverNames.length === 0 && v['token-issuer'] === undefined)
    mistakes.push('agents with tokens alone are told apart by server-name or token-issuer: give one');
  if ((v['agent-client-subject'].length > 0 || v['agent-client-eku'].length > 0) && !v['cluster-ca-cert'])
    mistakes.push('agent-client-subject and agent-client-eku pin certificates of cluster-ca-cert: give it');
  const udsPath = v['uds-name'];
  if (!udsPath && !v['server-ca-cert'])
    mistakes.push(
      "its kube-apiserver needs a way in: uds-name (its own Unix socket), or server-ca-cert (its client certificate's CA on the shared TCP frontend)",
    );
  if ((v['frontend-client-subject'].length > 0 || v['frontend-client-eku'].length > 0) && !v['server-ca-cert'])
    mistakes.push('frontend-client-subject and frontend-client-eku pin certificates of server-ca-cert: give it');
  if (v['backend-dial-timeout'].notice) mistakes.push(v['backend-dial-timeout'].notice.replace(/--([a-z-]+)/g, '$1'));
  if (mistakes.length > 0) return undefined;
  const gid = v['uds-group'];
  return {
    name: v.name,
    settings: v,
    ...(cert && key ? { serving: { certFile: cert, keyFile: key } } : {}),
    agentPins: { subjects: v['agent-client-subject'], ekus: v['agent-client-eku'] },
    frontendPins: { subjects: v['frontend-client-subject'], ekus: v['frontend-client-eku'] },
    ...(tokens ? { tokens } : {}),
    ...(udsPath
      ? {
          uds: { path: udsPath, deleteExisting: v['delete-existing-uds-file'], mode: v['uds-mode'], ...(gid === undefined ? {} : { gid }) },
        }
      : {}),
  };
}

/** What no two tenants may share: a name, a server name, a socket, a token issuer. */
function checkAcrossTenants(specs: readonly TenantSpec[], mistakes: string[]): void {
  const claims = new Map<string, string>();
  const claim = (what: string, value: string, tenant: string): void => {
    const key = `${what}\n${value}`;
    const first = claims.get(key);
    if (first === undefined) claims.set(key, tenant);
    else if (what === 'name') mistakes.push(`tenant ${JSON.stringify(tenant)} is declared more than once`);
    else mistakes.push(`tenant ${JSON.stringify(tenant)}: ${what} ${JSON.stringify(value)} is already tenant ${JSON.stringify(first)}'s`);
  };
  for (const s of specs) {
    claim('name', s.name, s.name);
    for (const n of s.settings['server-name']) claim('server-name', n, s.name);
    if (s.uds) claim(keyOf(tenantSettings, 'uds-name'), s.uds.path, s.name);
    const issuer = s.settings['token-issuer'];
    if (issuer !== undefined) claim('token-issuer', issuer, s.name);
  }
}
