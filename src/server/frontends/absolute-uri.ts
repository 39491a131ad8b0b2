/**
 * The destination of a forward-proxy request, from its absolute-form target
 * (RFC 9112 section 3.2.2): `http://host[:port][/path][?query]`. Read by
 * hand rather than with WHATWG URL, which rewrites what it reads (percent
 * escapes, backslashes, IDNA) so the origin could be sent something other
 * than what the client wrote. The path and query go on as they came.
 */
import { isIP } from 'node:net';
import { formatHostPort, isValidHost } from '../../common/host-port.js';

export interface ForwardTarget {
  /** host:port to dial (port 80 when the URI has none). */
  readonly address: string;
  /** The Host field for the origin: the URI's authority as written (RFC 9110 section 7.2). */
  readonly authority: string;
  /** origin-form: path and query, "/" for none (RFC 9112 section 3.2.1). */
  readonly path: string;
}

export type TargetVerdict = { readonly ok: true; readonly target: ForwardTarget } | { readonly ok: false; readonly reason: string };

const HTTP = /^http:\/\/([^/?#]*)([/?][^#]*)?$/i;

export function forwardTarget(uri: string): TargetVerdict {
  if (/^https:/i.test(uri))
    return { ok: false, reason: 'an https:// URI in absolute form: this proxy forwards http:// only; for TLS, send CONNECT host:port' };
  const m = HTTP.exec(uri);
  if (!m) {
    if (/^http:/i.test(uri) && uri.includes('#'))
      return { ok: false, reason: 'a fragment (#) in the request target (RFC 9112 section 3.2.2)' };
    return { ok: false, reason: 'the request target is not an http:// URI: send absolute form (http://host:port/path) or CONNECT' };
  }
  const authority = m[1];
  const path = m[2] === undefined ? '/' : m[2].startsWith('?') ? `/${m[2]}` : m[2];
  if (authority.includes('@')) return { ok: false, reason: 'user information in the request URI: send credentials in Proxy-Authorization' };
  let host: string;
  let portText: string;
  if (authority.startsWith('[')) {
    const close = authority.indexOf(']');
    host = close < 0 ? '' : authority.slice(1, close);
    const after = close < 0 ? '' : authority.slice(close + 1);
    if (isIP(host) !== 6 || (after !== '' && !after.startsWith(':'))) return { ok: false, reason: 'a malformed IPv6 authority in the URI' };
    portText = after.slice(1);
  } else {
    const colon = authority.lastIndexOf(':');
    host = colon < 0 ? authority : authority.slice(0, colon);
    portText = colon < 0 ? '' : authority.slice(colon + 1);
  }
  if (host.length === 0) return { ok: false, reason: 'no host in the request URI' };
  if (!isValidHost(host)) return { ok: false, reason: "the URI's host is neither an IP address nor a valid name" };
  // RFC 3986 section 6.2.3: an empty port is the scheme's default.
  const port = portText === '' ? 80 : /^\d{1,5}$/.test(portText) ? Number(portText) : 0;
  if (port < 1 || port > 65535) return { ok: false, reason: "the URI's port is not a number from 1 to 65535" };
  return { ok: true, target: { address: formatHostPort({ host, port }), authority, path } };
}
