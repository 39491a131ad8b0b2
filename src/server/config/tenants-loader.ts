/**
 * The tenants of the file made ready to serve (tenants/tenant-definition.ts):
 * each entry (tenants-file.ts) with its credential files read and checked. Loading reads every file of every tenant and
 * reports every problem at once; nothing of it is applied until all is well.
 */
import { createHash } from 'node:crypto';
import { CredentialCheck, CredentialFilesError } from '../../common/credential-files.js';
import { errorMessage } from '../../common/error-message.js';
import { assertRolesSeparated, ClientRoles, isPinned, parseBundle, sharedTrust } from '../identity/client-roles.js';
import type { TenantCredentials } from '../tenants/tenant-directory.js';
import type { TenantDefinition } from '../tenants/tenant-definition.js';
import { readTenantsFile, TenantsFileError, type TenantFiles, type TenantSpec } from './tenants-file.js';
import { keyOf } from '../../settings/flag-names.js';
import { tenantSettings } from './tenant-settings.js';
import { FLAG } from './settings.js';
import { tenantOptionsOf } from './tenant-options.js';
import { loadClients } from './clients-config.js';
import type { ClientEntry } from '../clients/client-entry.js';

/** One entry's credential files, read. */
interface LoadedFiles {
  serving?: { cert: Buffer; key: Buffer };
  agentCa?: Buffer;
  frontendCa?: Buffer;
}

/** One entry's files read and checked into `check` (each problem recorded, named with the tenant); undefined when one is unusable. */
function loadFiles(f: TenantFiles, check: CredentialCheck): LoadedFiles | undefined {
  const where = f.where;
  const serving =
    f.serving &&
    check.keyPair(
      { flag: keyOf(tenantSettings, 'cluster-cert'), path: f.serving.certFile, where },
      { flag: keyOf(tenantSettings, 'cluster-key'), path: f.serving.keyFile, where },
      'server',
    );
  const agentCa = f.agentCa && check.certificates({ flag: keyOf(tenantSettings, 'cluster-ca-cert'), path: f.agentCa, where });
  const frontendCa = f.frontendCa && check.certificates({ flag: keyOf(tenantSettings, 'server-ca-cert'), path: f.frontendCa, where });
  if ((f.serving && !serving) || (f.agentCa && !agentCa) || (f.frontendCa && !frontendCa)) return undefined;
  return {
    ...(serving ? { serving: { cert: serving.cert.pem, key: serving.key.pem } } : {}),
    ...(agentCa ? { agentCa: agentCa.pem } : {}),
    ...(frontendCa ? { frontendCa: frontendCa.pem } : {}),
  };
}

/** What the directory recognises the tenant by: its entry and its files' contents. */
function credentialsOf(spec: TenantSpec, files: LoadedFiles): TenantCredentials {
  const v = spec.settings;
  return {
    name: spec.name,
    serverNames: v['server-name'],
    ...files,
    agentPins: spec.agentPins,
    frontendPins: spec.frontendPins,
    ...(v['token-issuer'] !== undefined ? { tokenIssuer: v['token-issuer'] } : {}),
    tokens: spec.tokens !== undefined,
  };
}

/** Who the tenant is (TenantDefinition.identity): everything but its settings, and where it is served. */
function identityOf(spec: TenantSpec, c: TenantCredentials): string {
  const h = createHash('sha256');
  for (const part of [c.serving?.cert, c.serving?.key, c.agentCa, c.frontendCa]) h.update(part ?? '').update('\0');
  const { serverNames, agentPins, frontendPins, tokenIssuer } = c;
  // The workers that serve it decide its server IDs and which worker holds it: a change starts it anew.
  h.update(
    JSON.stringify({
      serverNames,
      agentPins,
      frontendPins,
      tokenIssuer,
      tokens: spec.tokens,
      uds: spec.uds,
      workers: spec.settings['tenant-workers'],
    }),
  );
  return h.digest('hex');
}

/** Its entry, who it is, and its clients' token files' contents: a token file changed is a reload's change too. */
function fingerprintOf(spec: TenantSpec, identity: string, clients: readonly ClientEntry[]): string {
  const h = createHash('sha256').update(spec.fingerprint).update('\0').update(identity);
  for (const c of clients) if (c.token) h.update('\0').update(c.token.digest);
  return h.digest('hex');
}

/**
 * Roles never mix across tenants either: an agent CA of one tenant that is
 * also a kube-apiserver CA (of any tenant) needs pins on both sides, as
 * within one tenant (client-roles.ts). Compared by certificate fingerprint.
 */
function checkRolesAcross(loaded: readonly { spec: TenantSpec; credentials: TenantCredentials }[], mistakes: string[]): void {
  for (const a of loaded) {
    if (!a.credentials.agentCa) continue;
    for (const b of loaded) {
      if (!b.credentials.frontendCa) continue;
      const roles = new ClientRoles(a.spec.agentPins, b.spec.frontendPins);
      try {
        if (a === b) assertRolesSeparated(a.credentials.agentCa, b.credentials.frontendCa, roles);
        else if (sharedTrust(a.credentials.agentCa, b.credentials.frontendCa))
          assertRolesSeparated(a.credentials.agentCa, b.credentials.frontendCa, roles);
      } catch (err) {
        const who =
          a === b
            ? `tenant ${JSON.stringify(a.spec.name)}`
            : `tenants ${JSON.stringify(a.spec.name)} (agents) and ${JSON.stringify(b.spec.name)} (kube-apiserver)`;
        mistakes.push(`${who}: ${errorMessage(err).replace(/--([a-z-]+)/g, '$1')}`);
      }
    }
  }
}

/**
 * Tenants that trust one agent CA must each pin their agents (subject or
 * EKU), and not to the same pins: otherwise an agent of one, sending the
 * other's server name, would be taken as the other's (docs/multi-tenant.md,
 * "Recognition").
 */
function checkSharedAgentCas(loaded: readonly { spec: TenantSpec; credentials: TenantCredentials }[], mistakes: string[]): void {
  const byCa = new Map<string, { subject: string; tenants: TenantSpec[] }>();
  for (const { spec, credentials } of loaded) {
    for (const ca of credentials.agentCa ? parseBundle(credentials.agentCa) : []) {
      const entry = byCa.get(ca.fingerprint256) ?? { subject: ca.subject.replace(/\n/g, ', '), tenants: [] };
      if (!entry.tenants.includes(spec)) entry.tenants.push(spec);
      byCa.set(ca.fingerprint256, entry);
    }
  }
  const reported = new Set<string>();
  for (const { subject, tenants } of byCa.values()) {
    if (tenants.length < 2) continue;
    for (const t of tenants.filter((x) => !isPinned(x.agentPins) && !reported.has(x.name))) {
      reported.add(t.name);
      const others = tenants
        .filter((x) => x !== t)
        .slice(0, 3)
        .map((x) => JSON.stringify(x.name));
      mistakes.push(
        `tenant ${JSON.stringify(t.name)}: its cluster-ca-cert (${subject}) is trusted by tenant ${others.join(', ')} too: pin its agents with agent-client-subject or agent-client-eku (or give it a CA of its own), or their agents could join it`,
      );
    }
    const seen = new Map<string, string>();
    for (const t of tenants.filter((x) => isPinned(x.agentPins))) {
      const key = JSON.stringify([t.agentPins.subjects.map((p) => p.text).sort(), [...t.agentPins.ekus].sort()]);
      const first = seen.get(key);
      if (first !== undefined && !reported.has(t.name)) {
        reported.add(t.name);
        mistakes.push(
          `tenant ${JSON.stringify(t.name)}: its agent pins are tenant ${JSON.stringify(first)}'s, and both trust ${subject}: pin each to its own agents`,
        );
      } else seen.set(key, t.name);
    }
  }
}

/** The tenants of the file, and the digest of the text they were read from (a watch's starting point). */
export interface LoadedTenants {
  tenants: TenantDefinition[];
  digest: string;
}

/**
 * Reads the file and every credential file its entries name; throws
 * TenantsFileError listing every problem, the files' with the entries'
 * (docs/multi-tenant.md: all at once).
 */
export function loadTenants(file: string, server: { tcpFrontend: boolean }): LoadedTenants {
  const { entries, mistakes, digest } = readTenantsFile(file);
  if (!server.tcpFrontend)
    for (const { spec } of entries)
      if (spec?.settings['server-ca-cert'] !== undefined)
        mistakes.push(
          `tenant ${JSON.stringify(spec.name)}: server-ca-cert names the shared TCP frontend, which needs ${FLAG['server-cert']} and ${FLAG['server-key']} on the command line`,
        );
  const check = new CredentialCheck();
  const loaded = entries.flatMap(({ files, spec }) => {
    const read = loadFiles(files, check);
    return spec && read ? [{ spec, credentials: credentialsOf(spec, read) }] : [];
  });
  try {
    check.done();
  } catch (err) {
    if (!(err instanceof CredentialFilesError)) throw err;
    mistakes.push(...err.problems);
  }
  const clientsOf = new Map<TenantSpec, ClientEntry[]>();
  for (const { spec } of loaded) {
    if (!spec.clients) continue;
    const read = loadClients(spec.clients, `tenant ${JSON.stringify(spec.name)}: `);
    mistakes.push(...read.mistakes);
    clientsOf.set(spec, read.entries);
  }
  if (mistakes.length === 0) checkSharedAgentCas(loaded, mistakes);
  if (mistakes.length === 0 && loaded.length < 200) checkRolesAcross(loaded, mistakes);
  else if (mistakes.length === 0) checkRolesAcrossByFingerprint(loaded, mistakes);
  if (mistakes.length > 0) throw new TenantsFileError(file, mistakes);
  const tenants = loaded.map(({ spec, credentials }) => {
    const identity = identityOf(spec, credentials);
    const clients = clientsOf.get(spec) ?? [];
    return {
      name: spec.name,
      credentials,
      options: tenantOptionsOf(spec.settings, spec.settings, clients),
      workers: spec.settings['tenant-workers'],
      ...(spec.tokens ? { tokens: spec.tokens } : {}),
      ...(spec.uds ? { uds: spec.uds } : {}),
      fingerprint: fingerprintOf(spec, identity, clients),
      identity,
    };
  });
  return { tenants, digest };
}

/** checkRolesAcross for many tenants: pairs that share a CA certificate found through one index (a chain between CAs is then not looked for). */
function checkRolesAcrossByFingerprint(loaded: readonly { spec: TenantSpec; credentials: TenantCredentials }[], mistakes: string[]): void {
  const digest = (pem: Buffer): string => createHash('sha256').update(pem).digest('hex');
  const agentByCa = new Map<string, { spec: TenantSpec; credentials: TenantCredentials }[]>();
  for (const a of loaded) {
    if (!a.credentials.agentCa) continue;
    const key = digest(a.credentials.agentCa);
    agentByCa.set(key, [...(agentByCa.get(key) ?? []), a]);
  }
  const pairs: { spec: TenantSpec; credentials: TenantCredentials }[] = [];
  for (const b of loaded) {
    if (!b.credentials.frontendCa) continue;
    for (const a of agentByCa.get(digest(b.credentials.frontendCa)) ?? []) pairs.push(a, b);
  }
  for (let i = 0; i < pairs.length; i += 2) checkRolesAcross([pairs[i], pairs[i + 1]], mistakes);
  for (const t of loaded) checkRolesAcross([t], mistakes);
}
