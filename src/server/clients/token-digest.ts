/** The SHA-256 of a bearer token: what static tokens are held as and compared by (client-admission.ts), never the token itself. */
import { createHash } from 'node:crypto';

export function tokenDigestOf(token: string): Buffer {
  return createHash('sha256').update(token).digest();
}
