/**
 * One `--direct-route` (tenants file: `direct-route`): a destination on the
 * control plane's own network that the server dials itself instead of
 * through an agent (docs/frontends.md, "Direct routes"). Written
 * `CIDR[:PORT]` (IPv6 in brackets, as in a URL's authority, RFC 3986
 * section 3.2.2), `NAME[:PORT]` or `*.SUFFIX[:PORT]`; no port: any port.
 */
import { isIP } from 'node:net';
import { UsageError } from '../../common/usage-error.js';
import { parsePort } from '../../common/host-port.js';
import { errorMessage } from '../../common/error-message.js';
import { truncateForLog } from '../../common/log-safety.js';

/** Any port: an entry without `:PORT`. */
export const ANY_PORT = 0;

export type DirectRouteEntry =
  | { kind: 'cidr'; family: 'ipv4' | 'ipv6'; network: string; prefix: number; port: number; text: string }
  /** `name`: lower case, no trailing dot. */
  | { kind: 'name'; name: string; port: number; text: string }
  /** `suffix`: what a matching name ends with, from its first dot: `.cp.internal` for `*.cp.internal`. */
  | { kind: 'wildcard'; suffix: string; port: number; text: string };

const EXPECTED =
  'expected CIDR[:PORT] (10.1.0.0/16:443, [fd00::/64]:443), NAME[:PORT] (metrics-server.kube-system.svc:443) or *.SUFFIX[:PORT] (*.cp.internal); no port: any';

/** A DNS name's label (RFC 1123 section 2.1; '_' as in SRV-style names); the whole name at most 253 characters. */
const LABEL = /^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$/;

/** No entry is longer: a 253-character name with "*." and ":65535". */
const MAX_ENTRY_LENGTH = 270;

class EntryProblem extends Error {}

/** `text` as an entry, or a UsageError naming it and the forms an entry takes. */
export function parseDirectRoute(text: string): DirectRouteEntry {
  try {
    return parseEntry(text);
  } catch (err) {
    const problem = err instanceof EntryProblem ? err.message : errorMessage(err);
    throw new UsageError(`direct route ${JSON.stringify(truncateForLog(text, 80))}: ${problem}; ${EXPECTED}`);
  }
}

function parseEntry(text: string): DirectRouteEntry {
  if (text.length > MAX_ENTRY_LENGTH) throw new EntryProblem(`${text.length} characters long, no entry is longer than ${MAX_ENTRY_LENGTH}`);
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    if (close < 0) throw new EntryProblem('no "]" closes the IPv6 CIDR');
    const rest = text.slice(close + 1);
    if (rest !== '' && !rest.startsWith(':')) throw new EntryProblem(`${JSON.stringify(rest)} after "]", where ":PORT" or nothing goes`);
    return cidr(text.slice(1, close), 'ipv6', portOf(rest.slice(1)));
  }
  const colons = text.split(':').length - 1;
  if (colons > 1) throw new EntryProblem('an IPv6 CIDR goes in brackets, e.g. [fd00::/64]:443');
  const [host = '', portText = ''] = text.split(':');
  if (colons === 1 && portText === '') throw new EntryProblem('nothing after ":", where the port goes');
  const port = portOf(portText);
  if (host === '') throw new EntryProblem('no CIDR or name');
  if (host.includes('/') || isIP(host) === 4) return cidr(host, 'ipv4', port);
  return name(host, port);
}

function portOf(text: string): number {
  return text === '' ? ANY_PORT : parsePort(text);
}

/** `cidr`: an address with or without `/PREFIX` (without: that one address). */
function cidr(text: string, family: 'ipv4' | 'ipv6', port: number): DirectRouteEntry {
  const [address = '', prefixText, extra] = text.split('/');
  const bits = family === 'ipv4' ? 32 : 128;
  if (extra !== undefined) throw new EntryProblem('more than one "/"');
  if (isIP(address) !== (family === 'ipv4' ? 4 : 6))
    throw new EntryProblem(`${JSON.stringify(address)} is not an ${family === 'ipv4' ? 'IPv4' : 'IPv6'} address`);
  if (address.includes('%')) throw new EntryProblem('a zone (%) has no place in a route');
  if (prefixText !== undefined && !/^\d{1,3}$/.test(prefixText))
    throw new EntryProblem(`prefix ${JSON.stringify(prefixText)} is not a number from 0 to ${bits}`);
  const prefix = prefixText === undefined ? bits : Number(prefixText);
  if (prefix > bits)
    throw new EntryProblem(`prefix /${prefix} is longer than an ${family === 'ipv4' ? 'IPv4' : 'IPv6'} address (${bits} bits)`);
  const network = address.toLowerCase();
  const body = `${network}/${prefix}`;
  const shown = family === 'ipv6' ? `[${body}]` : body;
  return { kind: 'cidr', family, network, prefix, port, text: port === ANY_PORT ? shown : `${shown}:${port}` };
}

function name(text: string, port: number): DirectRouteEntry {
  const lower = text.toLowerCase().replace(/\.$/, '');
  const wildcard = lower.startsWith('*.');
  const base = wildcard ? lower.slice(2) : lower;
  if (base.includes('*')) throw new EntryProblem('"*" stands only for the leading label(s), as in *.cp.internal');
  if (base.length === 0 || base.length > 253) throw new EntryProblem('a name has 1 to 253 characters');
  const labels = base.split('.');
  const bad = labels.find((l) => !LABEL.test(l));
  if (bad !== undefined)
    throw new EntryProblem(`label ${JSON.stringify(bad)} is not a DNS label (a-z, 0-9, '-', '_', at most 63, no '-' at either end)`);
  if (/^\d+$/.test(labels[labels.length - 1] ?? '')) throw new EntryProblem('neither an IPv4 CIDR nor a name (its last label is a number)');
  const shown = wildcard ? `*.${base}` : base;
  const entryText = port === ANY_PORT ? shown : `${shown}:${port}`;
  return wildcard ? { kind: 'wildcard', suffix: `.${base}`, port, text: entryText } : { kind: 'name', name: base, port, text: entryText };
}
