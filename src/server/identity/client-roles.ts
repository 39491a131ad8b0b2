/**
 * Role separation of client certificates (docs/trust-model.md): a credential that
 * authenticates an agent is never accepted on the frontend, and the
 * kube-apiserver's frontend credential never registers as an agent. With a
 * separate CA per role the trust stores keep them apart; when both roles
 * trust one CA, each role is pinned to subjects or extended key usages of its
 * own, and a certificate matching the other role's pins is refused.
 */
import { X509Certificate } from 'node:crypto';

// The settings these messages name, spelt once here: this module sits below the server's table (src/server/config/settings.ts) in the layers.
const CLUSTER_CA_CERT = '--cluster-ca-cert';
const SERVER_CA_CERT = '--server-ca-cert';

export type Role = 'agent' | 'frontend';

/** One `ATTR=VALUE` of a certificate subject; VALUE ending in `*` matches by prefix. */
export interface SubjectPattern {
  attribute: string;
  value: string;
  prefix: boolean;
  /** As the operator wrote it, for messages. */
  text: string;
}

/** Pins of one role: a certificate matches when any subject pattern or any EKU matches. */
export interface RolePins {
  subjects: readonly SubjectPattern[];
  ekus: readonly string[];
}

export const NO_PINS: RolePins = { subjects: [], ekus: [] };

const FLAG: Record<Role, { subject: string; eku: string }> = {
  agent: { subject: '--agent-client-subject', eku: '--agent-client-eku' },
  frontend: { subject: '--frontend-client-subject', eku: '--frontend-client-eku' },
};

export function parseSubjectPattern(text: string): SubjectPattern {
  const m = /^([A-Za-z][A-Za-z0-9.]*)=(.+)$/.exec(text);
  if (!m) throw new Error(`"${text}": want ATTRIBUTE=VALUE, e.g. CN=kube-apiserver or O=system:nodes (a trailing * matches by prefix)`);
  const raw = m[2];
  const prefix = raw.endsWith('*');
  return { attribute: m[1].toUpperCase(), value: prefix ? raw.slice(0, -1) : raw, prefix, text };
}

export function parseEku(text: string): string {
  if (!/^[0-2](\.(0|[1-9][0-9]*))+$/.test(text)) throw new Error(`"${text}": want an extended key usage OID, e.g. 1.3.6.1.4.1.57264.1.1`);
  return text;
}

export function isPinned(pins: RolePins): boolean {
  return pins.subjects.length > 0 || pins.ekus.length > 0;
}

/**
 * The subject's attributes as [ATTR, value] pairs. Node prints one RDN per
 * line with RFC 2253 escapes (a value cannot fake a line); multi-valued RDNs
 * (rare) are matched as written.
 */
function subjectAttributes(cert: X509Certificate): [string, string][] {
  return cert.subject.split('\n').flatMap((line): [string, string][] => {
    const eq = line.indexOf('=');
    return eq > 0 ? [[line.slice(0, eq).toUpperCase(), line.slice(eq + 1)]] : [];
  });
}

export function matchesPins(cert: X509Certificate, pins: RolePins): boolean {
  const attrs = subjectAttributes(cert);
  const subjectMatch = pins.subjects.some((p) =>
    attrs.some(([a, v]) => a === p.attribute && (p.prefix ? v.startsWith(p.value) : v === p.value)),
  );
  const ekus = cert.keyUsage ?? [];
  return subjectMatch || pins.ekus.some((oid) => ekus.includes(oid));
}

function describePins(role: Role, pins: RolePins): string {
  return [...pins.subjects.map((p) => `${FLAG[role].subject} ${p.text}`), ...pins.ekus.map((e) => `${FLAG[role].eku} ${e}`)].join(', ');
}

export class ClientRoles {
  constructor(
    readonly agent: RolePins = NO_PINS,
    readonly frontend: RolePins = NO_PINS,
  ) {}

  /** Why a verified client certificate may not act as `role`, or undefined when it may. */
  refusal(cert: X509Certificate, role: Role): string | undefined {
    const other: Role = role === 'agent' ? 'frontend' : 'agent';
    const theirs = this[other];
    if (isPinned(theirs) && matchesPins(cert, theirs))
      return `the certificate is pinned to the ${other} role (${describePins(other, theirs)})`;
    const own = this[role];
    if (isPinned(own) && !matchesPins(cert, own)) return `the certificate matches none of ${describePins(role, own)}`;
    return undefined;
  }
}

/** The certificates of a PEM bundle. */
export function parseBundle(pem: Buffer | string): X509Certificate[] {
  const blocks = String(pem).match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
  return blocks.map((b) => new X509Certificate(b));
}

function issues(issuer: X509Certificate, cert: X509Certificate): boolean {
  return cert.checkIssued(issuer) && cert.verify(issuer.publicKey);
}

/**
 * A CA both bundles trust (the same certificate, or one bundle's CA issued by
 * the other's), described for a message; undefined when they share none.
 */
export function sharedTrust(agentCa: Buffer | string, frontendCa: Buffer | string): string | undefined {
  const a = parseBundle(agentCa);
  const f = parseBundle(frontendCa);
  for (const x of a) {
    for (const y of f) {
      if (x.fingerprint256 === y.fingerprint256) return `both trust ${x.subject.replace(/\n/g, ', ')}`;
      if (issues(x, y) || issues(y, x)) return `${x.subject.replace(/\n/g, ', ')} and ${y.subject.replace(/\n/g, ', ')} are one chain`;
    }
  }
  return undefined;
}

/**
 * Throws when an agent certificate could open the frontend or the KAS's
 * certificate could register as an agent: both roles trust one CA and the
 * operator has not pinned each role to something of its own.
 */
export function assertRolesSeparated(agentCa: Buffer | undefined, frontendCa: Buffer | undefined, roles: ClientRoles): void {
  if (!agentCa || !frontendCa) return;
  const shared = sharedTrust(agentCa, frontendCa);
  if (!shared) return;
  if (isPinned(roles.agent) && isPinned(roles.frontend)) {
    const same =
      roles.agent.subjects.some((a) =>
        roles.frontend.subjects.some((f) => a.attribute === f.attribute && a.value === f.value && a.prefix === f.prefix),
      ) || roles.agent.ekus.some((e) => roles.frontend.ekus.includes(e));
    if (!same) return;
    throw new Error(
      `${CLUSTER_CA_CERT} and ${SERVER_CA_CERT} share a CA (${shared}) and the two roles are pinned to the same subject or EKU: pin each role to its own`,
    );
  }
  throw new Error(
    `${CLUSTER_CA_CERT} and ${SERVER_CA_CERT} share a CA (${shared}): every agent certificate could then open the frontend and the kube-apiserver's certificate could register as an agent. ` +
      'Use a separate CA for each role (see docs/trust-model.md), or pin both roles: ' +
      `${FLAG.frontend.subject} (e.g. CN=kube-apiserver) or ${FLAG.frontend.eku}, and ${FLAG.agent.subject} (e.g. O=system:konnectivity-agents) or ${FLAG.agent.eku}`,
  );
}
