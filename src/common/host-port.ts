/** "host:port" with IPv6 literals in brackets, as Go's net.SplitHostPort wants. */
import { isIP } from 'node:net';
import { truncateForLog } from './log-safety.js';

export interface HostPort {
  host: string;
  port: number;
}

export class AddressError extends Error {
  override name = 'AddressError';
}

const HOSTNAME = /^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;

/** An IP address, or a host name as parseHostPort accepts one. */
export function isValidHost(host: string): boolean {
  return isIP(host) !== 0 || HOSTNAME.test(host);
}

/** No valid "host:port" is longer: a 253-character name, ":" and 5 digits. */
export const MAX_ADDRESS_LENGTH = 259;

/** `text` quoted for an error message, cut short: peers send these. */
function quote(text: string): string {
  return JSON.stringify(truncateForLog(text, 80));
}

/** `what` names the port in the error; a function is called only then (parseHostPort runs on every dial). */
export function parsePort(text: string, what: string | (() => string) = 'port'): number {
  if (!/^\d{1,5}$/.test(text)) throw new AddressError(`${nameOf(what)} ${quote(text)} is not a number from 1 to 65535`);
  const port = Number(text);
  if (port < 1 || port > 65535) throw new AddressError(`${nameOf(what)} ${port} is out of range 1-65535`);
  return port;
}

function nameOf(what: string | (() => string)): string {
  return typeof what === 'string' ? what : what();
}

export function parseHostPort(text: string): HostPort {
  if (text.length > MAX_ADDRESS_LENGTH) {
    throw new AddressError(`address ${quote(text)} is ${text.length} characters long; no host:port is longer than ${MAX_ADDRESS_LENGTH}`);
  }
  let host: string;
  let portText: string;
  if (text.startsWith('[')) {
    const close = text.indexOf(']');
    if (close < 0 || text[close + 1] !== ':') throw new AddressError(`address ${quote(text)}: expected [ipv6]:port`);
    host = text.slice(1, close);
    portText = text.slice(close + 2);
    if (isIP(host) !== 6) throw new AddressError(`address ${quote(text)}: ${quote(host)} is not an IPv6 address`);
  } else {
    const colon = text.lastIndexOf(':');
    if (colon <= 0) throw new AddressError(`address ${quote(text)}: expected host:port`);
    host = text.slice(0, colon);
    portText = text.slice(colon + 1);
    if (host.includes(':')) throw new AddressError(`address ${quote(text)}: IPv6 hosts must be in brackets, e.g. [::1]:443`);
    if (isIP(host) === 0 && !HOSTNAME.test(host)) throw new AddressError(`address ${quote(text)}: ${quote(host)} is not a valid host`);
  }
  return { host, port: parsePort(portText, () => `address ${quote(text)}: port`) };
}

export function formatHostPort({ host, port }: HostPort): string {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}
