/**
 * The header fields a proxy does not forward (RFC 9110 section 7.6.1): the
 * connection's own, named by Connection or by convention, and the framing
 * fields, which the proxy writes anew for the next hop (http-framing.ts).
 */
import type { HeaderLine } from './request-head.js';
import { listValues } from './body-framing.js';

/**
 * Hop-by-hop by definition (RFC 9110 section 7.6.1; Keep-Alive and
 * Proxy-Connection as RFC 9112 appendix C.2.2 and upstream proxies treat
 * them), the proxy's own credentials (sections 11.7.1-11.7.2), and the
 * framing, which is re-done.
 */
const ALWAYS = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'proxy-authorization',
  'proxy-authenticate',
  'content-length',
  'host',
]);

/** `headers` without the hop-by-hop ones, nor those its Connection lines name. */
export function endToEnd(headers: readonly HeaderLine[]): HeaderLine[] {
  const named = new Set(listValues(headers, 'connection').map((v) => v.toLowerCase()));
  return headers.filter((h) => {
    const n = h.name.toLowerCase();
    return !ALWAYS.has(n) && !named.has(n);
  });
}

/** Whether the sender asked for the connection to close after this message (RFC 9112 section 9.3), as its version defaults. */
export function wantsClose(version: 'HTTP/1.0' | 'HTTP/1.1', headers: readonly HeaderLine[]): boolean {
  const options = listValues(headers, 'connection').map((v) => v.toLowerCase());
  if (options.includes('close')) return true;
  // HTTP/1.0 keep-alive (RFC 9112 appendix C.2.2) is not offered: a 1.0 client's connection closes after each answer.
  return version === 'HTTP/1.0';
}

/** Header lines as they go on the wire. */
export function formatHeaders(headers: readonly HeaderLine[]): string {
  let out = '';
  for (const h of headers) out += `${h.name}: ${h.value}\r\n`;
  return out;
}

/** What the proxy adds to every message it forwards (RFC 9110 section 7.6.3). */
export const VIA = 'Via: 1.1 kanal\r\n';
