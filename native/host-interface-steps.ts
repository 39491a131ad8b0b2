// The kernel steps of the host interface, one rtnetlink request each, with the
// sentence an operator needs for the errors of known cause (errno values from
// <asm-generic/errno-base.h> and <asm-generic/errno.h>).

import { NetlinkError, describeErrno } from './netlink-error.js';
import type { NetlinkSocket } from './netlink-socket.js';
import {
  RTM_NEWADDR,
  RTM_NEWLINK,
  type LinkInfo,
  addressBytes,
  buildDelAddr,
  buildDelLink,
  buildGetAddrDump,
  buildGetLinkByName,
  buildNewAddr,
  buildNewLink,
  buildSetLinkAlias,
  formatAddress,
  hostPrefixLen,
  parseAddr,
  parseLink,
} from './rtnetlink.js';
import type { InterfaceKind } from './host-interface-spec.js';

export const EPERM = 1;
export const ENODEV = 19;
export const EEXIST = 17;
export const EACCES = 13;
export const EADDRNOTAVAIL = 99;
export const EOPNOTSUPP = 95;

export function errnoOf(err: unknown): number {
  return err instanceof NetlinkError ? err.errno : -1;
}

/** Add the sentence an operator needs for the errors with a known cause. */
export function explain(err: unknown, what: string): unknown {
  if (!(err instanceof NetlinkError)) return err;
  if (err.errno === EPERM) {
    return new NetlinkError(
      err.operation,
      err.errno,
      `cannot ${what}: the kernel refused (${describeErrno(EPERM)}); CAP_NET_ADMIN is needed in this network namespace (run as root or grant the capability, e.g. AmbientCapabilities=CAP_NET_ADMIN)`,
      err.kernelMessage,
    );
  }
  const kernel = err.kernelMessage ? `: ${err.kernelMessage}` : '';
  return new NetlinkError(
    err.operation,
    err.errno,
    `cannot ${what} (${err.errno ? describeErrno(err.errno) : err.message})${kernel}`,
    err.kernelMessage,
  );
}

export function getLink(sock: NetlinkSocket, name: string): LinkInfo | undefined {
  try {
    const reply = sock.request(`RTM_GETLINK ${name}`, (seq) => buildGetLinkByName(seq, name));
    const msg = reply.find((m) => m.type === RTM_NEWLINK);
    return msg ? parseLink(msg) : undefined;
  } catch (err) {
    if (errnoOf(err) === ENODEV) return undefined;
    throw explain(err, `look up interface ${name}`);
  }
}

export function createLink(sock: NetlinkSocket, name: string, kind: InterfaceKind): void {
  const operation = `RTM_NEWLINK ${name} kind ${kind}`;
  try {
    sock.request(operation, (seq) => buildNewLink(seq, name, kind));
  } catch (err) {
    if (errnoOf(err) === EOPNOTSUPP) {
      const other: InterfaceKind = kind === 'dummy' ? 'bridge' : 'dummy';
      throw new NetlinkError(
        operation,
        EOPNOTSUPP,
        `cannot create interface ${name} of kind ${kind}: this kernel has no '${kind}' link type (${describeErrno(EOPNOTSUPP)}; module ${kind} not available). ` +
          `Use --bind-interface-type ${other}, or create the interface yourself and pass --bind-interface-type none`,
        err instanceof NetlinkError ? err.kernelMessage : undefined,
      );
    }
    if (errnoOf(err) === EEXIST) throw err; // the caller adopts the link
    throw explain(err, `create interface ${name} of kind ${kind}`);
  }
}

export function setLinkAlias(sock: NetlinkSocket, name: string, ifindex: number, alias: string): void {
  try {
    sock.request(`RTM_NEWLINK ${name} alias`, (seq) => buildSetLinkAlias(seq, ifindex, alias));
  } catch (err) {
    throw explain(err, `mark interface ${name} as created by Kanal (set its alias)`);
  }
}

export function hasAddress(sock: NetlinkSocket, ifindex: number, address: string): boolean {
  const { family, bytes } = addressBytes(address);
  const wanted = formatAddress(family, bytes);
  const reply = sock.request(`RTM_GETADDR dump`, (seq) => buildGetAddrDump(seq, family, ifindex));
  return reply
    .filter((m) => m.type === RTM_NEWADDR)
    .map(parseAddr)
    .some((a) => a.ifindex === ifindex && a.family === family && (a.local === wanted || a.address === wanted));
}

/** Returns true when this call added the address. */
export function addAddress(sock: NetlinkSocket, name: string, ifindex: number, address: string): boolean {
  const { family } = addressBytes(address);
  const prefix = `${address}/${hostPrefixLen(family)}`;
  try {
    if (hasAddress(sock, ifindex, address)) return false;
  } catch (err) {
    throw explain(err, `list addresses of ${name}`);
  }
  try {
    sock.request(`RTM_NEWADDR ${prefix} dev ${name}`, (seq) => buildNewAddr(seq, ifindex, address));
    return true;
  } catch (err) {
    if (errnoOf(err) === EEXIST) return false; // appeared in between: someone else owns it
    if (errnoOf(err) === EACCES && family === 10) {
      const e = err as NetlinkError;
      throw new NetlinkError(
        e.operation,
        EACCES,
        `cannot add ${prefix} to ${name}: IPv6 is disabled on this interface (${describeErrno(EACCES)}; check net.ipv6.conf.${name}.disable_ipv6 and net.ipv6.conf.all.disable_ipv6)`,
        e.kernelMessage,
      );
    }
    throw explain(err, `add address ${prefix} to ${name}`);
  }
}

export function deleteLink(sock: NetlinkSocket, name: string, ifindex: number): void {
  try {
    sock.request(`RTM_DELLINK ${name}`, (seq) => buildDelLink(seq, ifindex));
  } catch (err) {
    if (errnoOf(err) !== ENODEV) throw explain(err, `delete interface ${name}`);
  }
}

export function deleteAddress(sock: NetlinkSocket, name: string, ifindex: number, address: string): void {
  try {
    sock.request(`RTM_DELADDR ${address} dev ${name}`, (seq) => buildDelAddr(seq, ifindex, address));
  } catch (err) {
    if (errnoOf(err) !== EADDRNOTAVAIL && errnoOf(err) !== ENODEV) throw explain(err, `remove address ${address} from ${name}`);
  }
}
