/** Checks a TLS peer against the listener's client-certificate policy. */
import type { TLSSocket } from 'node:tls';

export interface PeerVerdict {
  ok: boolean;
  /** Why the peer is refused, or how it was identified. */
  detail: string;
}

export function verifyClientCertificate(socket: TLSSocket, allowUnauthenticated: boolean): PeerVerdict {
  if (socket.authorized) {
    const cert = socket.getPeerCertificate();
    return { ok: true, detail: `certificate CN=${cert.subject?.CN ?? '?'}` };
  }
  // Without a certificate OpenSSL still reports a verify error (UNABLE_TO_GET_ISSUER_CERT),
  // which would send operators looking for a CA problem.
  const presented = Object.keys(socket.getPeerCertificate()).length > 0;
  const reason = presented && socket.authorizationError ? String(socket.authorizationError) : 'no client certificate presented';
  if (allowUnauthenticated) return { ok: true, detail: `unauthenticated (${reason}); allowed by --allow-unauthenticated-agents` };
  return { ok: false, detail: reason };
}
