/**
 * Client-certificate verification done here rather than by OpenSSL, for
 * listeners whose CertificateRequest must name no CA: Node's `ca` option is
 * both the trust store and the certificate_authorities list sent to every
 * peer (RFC 8446 §4.2.4, RFC 5246 §7.4.4), and a shared server must not show
 * one tenant's CA names to a peer that has proven nothing
 * (docs/multi-tenant.md, "What a tenant can and cannot see or do").
 *
 * What OpenSSL's verification of a client leaf checks, for a leaf issued
 * directly by a trusted certificate: the issuer's name and key identifier and
 * its signature over the leaf; every certificate of the path within its
 * validity period; every issuer a CA (basicConstraints) allowed to sign
 * certificates (keyUsage, in checkIssued); an extended key usage, where there
 * is one, that allows client authentication (OpenSSL's "ssl_client"
 * purpose); and a path that ends at a self-signed certificate of the trust
 * store (no partial chains, OpenSSL's default). Not checked: unknown critical
 * extensions and path-length constraints (X509Certificate does not expose
 * them); the trusted certificates are the operator's own.
 */
import type { X509Certificate } from 'node:crypto';

/** id-kp-clientAuth (RFC 5280 §4.2.1.12). */
export const CLIENT_AUTH_EKU = '1.3.6.1.5.5.7.3.2';

/** Longest path from a trusted certificate up to its self-signed root within one bundle. */
const MAX_PATH = 8;

/** Whether `issuer` issued `cert`: names, key identifiers, key usage and the signature. */
export function issued(issuer: X509Certificate, cert: X509Certificate): boolean {
  return cert.checkIssued(issuer) && cert.verify(issuer.publicKey);
}

/**
 * The path from `ca` up to a self-signed certificate, each issued by the
 * next, all from `bundle` (`ca` first); undefined when `ca` anchors nothing
 * (OpenSSL would not trust a chain ending there either).
 */
export function anchorPath(ca: X509Certificate, bundle: readonly X509Certificate[]): X509Certificate[] | undefined {
  const path = [ca];
  for (let top = ca; path.length <= MAX_PATH;) {
    if (issued(top, top)) return path;
    const next = bundle.find((c) => c !== top && !path.includes(c) && issued(c, top));
    if (!next) return undefined;
    path.push(next);
    top = next;
  }
  return undefined;
}

/** Why `cert` is not within its validity period at `now`, or undefined. */
function outOfDate(cert: X509Certificate, now: number, what: string): string | undefined {
  if (now < new Date(cert.validFrom).getTime()) return `${what} is not valid before ${cert.validFrom}`;
  if (now > new Date(cert.validTo).getTime()) return `${what} expired ${cert.validTo}`;
  return undefined;
}

/** Why `cert`'s extended key usage, if it has one, does not allow client authentication, or undefined. */
function notForClients(cert: X509Certificate, what: string): string | undefined {
  const ekus = cert.keyUsage;
  return ekus && ekus.length > 0 && !ekus.includes(CLIENT_AUTH_EKU)
    ? `${what} is not for client authentication (extended key usage)`
    : undefined;
}

/**
 * Why `cert` is not a valid client certificate under `path` (from
 * anchorPath(): its issuer first), or undefined when it is; for the
 * server's log, never for the peer.
 */
export function chainRefusal(cert: X509Certificate, path: readonly X509Certificate[], now: number): string | undefined {
  const [issuer] = path;
  if (!issuer || !issued(issuer, cert)) return 'not issued by a trusted CA';
  const leaf = outOfDate(cert, now, 'the certificate') ?? notForClients(cert, 'the certificate');
  if (leaf) return leaf;
  for (const ca of path) {
    const what = `its CA ${ca.subject.replace(/\n/g, ', ')}`;
    const refused = ca.ca ? (outOfDate(ca, now, what) ?? notForClients(ca, what)) : `${what} is not a CA (basicConstraints)`;
    if (refused) return refused;
  }
  return undefined;
}
