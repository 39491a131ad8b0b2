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
  return credentialsToken(lines[0].value, 'Proxy-Authorization', true);
}

/**
 * A gRPC frontend stream's token: its `authorization` metadata, `Bearer
 * <token>` (gRPC's per-RPC credentials send it so; the kube-apiserver's
 * konnectivity-client sends none, and is known by its connection).
 */
export function grpcToken(values: readonly string[]): ProxyToken {
  if (values.length === 0) return {};
  if (values.length > 1) return { problem: 'more than one authorization metadata value' };
  return credentialsToken(values[0], 'authorization', false);
}

/** `Bearer <token>`, or with `basic` also `Basic base64(user:token)`, of the header (or metadata) `what`. */
function credentialsToken(value: string, what: string, basic: boolean): ProxyToken {
  const space = value.indexOf(' ');
  const scheme = (space < 0 ? value : value.slice(0, space)).toLowerCase();
  const credentials = space < 0 ? '' : value.slice(space + 1).trim();
  if (credentials.length === 0 || credentials.length > MAX_TOKEN_LENGTH)
    return { problem: `${what} ${scheme.slice(0, 16)} without credentials of a usable length` };
  if (scheme === 'bearer') {
    if (!TOKEN68.test(credentials)) return { problem: `${what} Bearer: the token is not a token68 (RFC 6750 section 2.1)` };
    return { token: credentials };
  }
  if (basic && scheme === 'basic') {
    if (!/^[A-Za-z0-9+/]+=*$/.test(credentials)) return { problem: `${what} Basic: not base64 (RFC 7617)` };
    const decoded = Buffer.from(credentials, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    const password = colon < 0 ? '' : decoded.slice(colon + 1);
    if (password.length === 0) return { problem: `${what} Basic: put the token in the password (user:token)` };
    return { token: password };
  }
  return {
    problem: `${what} scheme ${JSON.stringify(scheme.slice(0, 16))} not supported: use Bearer <token>${basic ? ' or Basic (the token as the password)' : ''}`,
  };
}
