/** Checks a TLS peer against a listener's client-certificate policy: trust, then role. */
import { X509Certificate } from 'node:crypto';
import type { TLSSocket } from 'node:tls';
import { certificateCredential, unauthenticatedCredential, type AgentCredential } from './agent-credential.js';
import type { ClientRoles, Role } from './client-roles.js';

/** A refusal is either about trust (`certificate`) or about the role (`role`): `<role>_<refusal>` in metrics. */
export type PeerVerdict =
  { ok: true; credential: AgentCredential; detail: string } | { ok: false; refusal: 'certificate' | 'role'; detail: string };

/**
 * The peer's verified certificate, parsed from its DER. Not
 * `getPeerX509Certificate()`: on a server socket it keeps the parsed
 * certificate (≈ 5 KiB of OpenSSL's memory) after the connection and its
 * X509Certificate are gone, in Node 20.20, 22.23 and 24.21 alike
 * (docs/memory.md, "Connection churn"); `getPeerCertificate()` and the
 * X509Certificate made from its DER are freed with the socket.
 */
export function peerCertificate(socket: TLSSocket): X509Certificate | undefined {
  if (!socket.authorized) return undefined;
  const { raw } = socket.getPeerCertificate();
  return raw ? new X509Certificate(raw) : undefined;
}

/** `withoutCertificate`: why a peer without a valid certificate may still connect (absent: it may not). */
export function verifyClientCertificate(socket: TLSSocket, role: Role, roles: ClientRoles, withoutCertificate?: string): PeerVerdict {
  const cert = peerCertificate(socket);
  if (cert) {
    const credential = certificateCredential(cert);
    const refused = roles.refusal(cert, role);
    if (refused) return { ok: false, refusal: 'role', detail: `${credential.subject}: ${refused}` };
    return { ok: true, credential, detail: `certificate ${credential.subject}` };
  }
  // Without a certificate OpenSSL still reports a verify error (UNABLE_TO_GET_ISSUER_CERT),
  // which would send operators looking for a CA problem.
  const presented = Object.keys(socket.getPeerCertificate()).length > 0;
  const reason = presented && socket.authorizationError ? String(socket.authorizationError) : 'no client certificate presented';
  if (withoutCertificate) {
    return {
      ok: true,
      credential: unauthenticatedCredential(socket.remoteAddress ?? 'unknown'),
      detail: `unauthenticated (${reason}); allowed: ${withoutCertificate}`,
    };
  }
  return { ok: false, refusal: 'certificate', detail: reason };
}
