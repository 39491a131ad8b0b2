/**
 * A client's token from its Proxy-Authorization (RFC 9110 section 11.7.2):
 * `Bearer <token>` (RFC 6750), or `Basic` with the token as the password
 * (RFC 7617) for clients that can only send a user and a password (Go's
 * `http://user:token@proxy` URLs, curl --proxy-user). The user name is
 * ignored: who the client is comes from the token.
 */
import type { HeaderLine } from './request-head.js';

/** The token, or none; `problem` says why a Proxy-Authorization given carried none (for a 407's message). */
export interface ProxyToken {
  readonly token?: string;
  readonly problem?: string;
}

/** A token68 (RFC 9110 section 11.2): what a Bearer token is. */
const TOKEN68 = /^[A-Za-z0-9\-._~+/]+=*$/;

/** Tokens longer than this are no service account token (they run to about 1 KiB; a JWT with many claims, a few). */
const MAX_TOKEN_LENGTH = 16 * 1024;

export function proxyToken(headers: readonly HeaderLine[]): ProxyToken {
  const lines = headers.filter((h) => h.name.toLowerCase() === 'proxy-authorization');
  if (lines.length === 0) return {};
  if (lines.length > 1) return { problem: 'more than one Proxy-Authorization line' };
  const value = lines[0].value;
  const space = value.indexOf(' ');
  const scheme = (space < 0 ? value : value.slice(0, space)).toLowerCase();
  const credentials = space < 0 ? '' : value.slice(space + 1).trim();
  if (credentials.length === 0 || credentials.length > MAX_TOKEN_LENGTH)
    return { problem: `Proxy-Authorization ${scheme.slice(0, 16)} without credentials of a usable length` };
  if (scheme === 'bearer') {
    if (!TOKEN68.test(credentials)) return { problem: 'Proxy-Authorization Bearer: the token is not a token68 (RFC 6750 section 2.1)' };
    return { token: credentials };
  }
  if (scheme === 'basic') {
    if (!/^[A-Za-z0-9+/]+=*$/.test(credentials)) return { problem: 'Proxy-Authorization Basic: not base64 (RFC 7617)' };
    const decoded = Buffer.from(credentials, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    const password = colon < 0 ? '' : decoded.slice(colon + 1);
    if (password.length === 0) return { problem: 'Proxy-Authorization Basic: put the token in the password (user:token)' };
    return { token: password };
  }
  return {
    problem: `Proxy-Authorization scheme ${JSON.stringify(scheme.slice(0, 16))} not supported: use Bearer <token> or Basic (the token as the password)`,
  };
}
