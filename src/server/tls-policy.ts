/** Checks a TLS peer against a listener's client-certificate policy: trust, then role. */
import type { TLSSocket } from 'node:tls';
import { certificateCredential, unauthenticatedCredential, type AgentCredential } from './agent-credential.js';
import type { ClientRoles, Role } from './client-roles.js';

/** A refusal is either about trust (`certificate`) or about the role (`role`): `<role>_<refusal>` in metrics. */
export type PeerVerdict = { ok: true; credential: AgentCredential; detail: string } | { ok: false; refusal: 'certificate' | 'role'; detail: string };

/** `withoutCertificate`: why a peer without a valid certificate may still connect (absent: it may not). */
export function verifyClientCertificate(socket: TLSSocket, role: Role, roles: ClientRoles, withoutCertificate?: string): PeerVerdict {
  const cert = socket.authorized ? socket.getPeerX509Certificate() : undefined;
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
    return { ok: true, credential: unauthenticatedCredential(socket.remoteAddress ?? 'unknown'), detail: `unauthenticated (${reason}); allowed: ${withoutCertificate}` };
  }
  return { ok: false, refusal: 'certificate', detail: reason };
}
