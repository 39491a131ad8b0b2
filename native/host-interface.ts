// The host-scoped interface the agent owns: a link (dummy or bridge) carrying
// one address/32 or /128 with scope host, so local clients can connect to the
// advertised address while nothing is announced on the network.
//
// Everything goes over rtnetlink in this process (no `ip` binary), in the
// caller's network namespace. ensure/remove are idempotent and remove only
// what Kanal created, so adopting an operator-made interface is safe.
//
// Ownership is recorded in the kernel, not only in process memory: a link
// Kanal creates gets the alias KANAL_LINK_ALIAS (IFLA_IFALIAS, visible as
// `ip -d link show` "alias ..." and /sys/class/net/<dev>/ifalias). After a
// crash the next ensure finds the marker and reclaims the link as its own, so
// the following clean stop removes it. A link without the marker is the
// operator's and is never deleted.

import { isIP } from 'node:net';
import { readFileSync } from 'node:fs';
import { NetlinkError, describeErrno } from './netlink-error.js';
import { NetlinkSocket, withNetlinkSocket, type NetlinkSocketOptions } from './netlink-socket.js';
import {
  IFF_UP,
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
  buildSetLinkUp,
  formatAddress,
  hostPrefixLen,
  parseAddr,
  parseLink,
} from './rtnetlink.js';

export { NetlinkError } from './netlink-error.js';

export type InterfaceKind = 'dummy' | 'bridge';
export const INTERFACE_KINDS: readonly InterfaceKind[] = ['dummy', 'bridge'];

export interface HostInterfaceSpec {
  name: string;
  kind: InterfaceKind;
  /** IPv4 or IPv6 literal; installed as /32 or /128. */
  address: string;
}

export interface HostInterfaceState {
  name: string;
  address: string;
  /**
   * True when Kanal created the link (remove will delete it): either this
   * ensure created it, or it was reclaimed (see `reclaimed`).
   */
  createdLink: boolean;
  /**
   * True when Kanal added the address (remove will delete it). Always true on
   * a Kanal-created link: such a link only ever gets its address from Kanal.
   */
  addedAddress: boolean;
  /**
   * True when the link already existed and carried the Kanal ownership marker
   * (KANAL_LINK_ALIAS): a leftover of an earlier run that did not stop cleanly
   * (crash, SIGKILL). It is treated as created by Kanal.
   */
  reclaimed: boolean;
  ifindex: number;
  /**
   * Kind of the link as the kernel reports it (IFLA_INFO_KIND). May differ from
   * the requested kind when an existing link was adopted; null when the link
   * has no kind (e.g. a physical NIC).
   */
  kind: string | null;
}

/** Invalid input, detected before any kernel call. */
export class HostInterfaceSpecError extends Error {
  override name = 'HostInterfaceSpecError';
  readonly field: 'name' | 'kind' | 'address';
  constructor(field: 'name' | 'kind' | 'address', message: string) {
    super(message);
    this.field = field;
  }
}

const EPERM = 1;
const ENODEV = 19;
const EEXIST = 17;
const EACCES = 13;
const EADDRNOTAVAIL = 99;
const EOPNOTSUPP = 95;
const IFNAMSIZ = 16; // including the trailing NUL

/**
 * The alias (IFLA_IFALIAS) Kanal puts on every link it creates: the kernel's
 * record that the link is Kanal's to delete. Compared byte for byte; an
 * operator can hand a link over to Kanal by setting exactly this alias, or
 * keep a Kanal-made link by changing or clearing it.
 */
export const KANAL_LINK_ALIAS = 'kanal-agent: created by kanal, removed on clean stop';

// ---------------------------------------------------------------- validation

export function validateInterfaceName(name: unknown): string {
  if (typeof name !== 'string' || name.length === 0) {
    throw new HostInterfaceSpecError('name', 'interface name must be a non-empty string');
  }
  const bytes = Buffer.byteLength(name, 'utf8');
  if (bytes > IFNAMSIZ - 1) {
    throw new HostInterfaceSpecError(
      'name',
      `interface name ${JSON.stringify(name)} is ${bytes} bytes; Linux allows at most ${IFNAMSIZ - 1} (IFNAMSIZ)`,
    );
  }
  if (name === '.' || name === '..') {
    throw new HostInterfaceSpecError('name', `interface name ${JSON.stringify(name)} is not allowed`);
  }
  // '/' and ':' and whitespace are rejected by the kernel (dev_valid_name); '%'
  // would make the kernel pick a name from a template ("kanal%d"), which we
  // could then not find again by name.
  // eslint-disable-next-line no-control-regex
  const bad = /[\s/:%\x00-\x1f\x7f]/.exec(name);
  if (bad) {
    throw new HostInterfaceSpecError(
      'name',
      `interface name ${JSON.stringify(name)} contains ${JSON.stringify(bad[0])}; '/', ':', '%', whitespace and control characters are not allowed`,
    );
  }
  return name;
}

export function validateAddress(address: unknown): string {
  if (typeof address !== 'string' || isIP(address) === 0 || address.includes('%')) {
    throw new HostInterfaceSpecError(
      'address',
      `address ${JSON.stringify(address)} is not an IPv4 or IPv6 literal (no prefix length, no zone)`,
    );
  }
  const { family, bytes } = addressBytes(address);
  if (bytes.every((b) => b === 0)) {
    throw new HostInterfaceSpecError('address', `address ${address} is the unspecified address; a host address is needed`);
  }
  if ((family === 2 && bytes[0] >= 224 && bytes[0] <= 239) || (family === 10 && bytes[0] === 0xff)) {
    throw new HostInterfaceSpecError('address', `address ${address} is a multicast address; a unicast host address is needed`);
  }
  return address;
}

export function validateKind(kind: unknown): InterfaceKind {
  if (kind !== 'dummy' && kind !== 'bridge') {
    throw new HostInterfaceSpecError(
      'kind',
      `interface kind ${JSON.stringify(kind)} is not supported; use one of ${INTERFACE_KINDS.join(', ')}`,
    );
  }
  return kind;
}

/** Check a spec completely without touching the kernel. */
export function validateHostInterfaceSpec(spec: HostInterfaceSpec): HostInterfaceSpec {
  return { name: validateInterfaceName(spec.name), kind: validateKind(spec.kind), address: validateAddress(spec.address) };
}

// ---------------------------------------------------------------- kernel steps

function errnoOf(err: unknown): number {
  return err instanceof NetlinkError ? err.errno : -1;
}

/** Add the sentence an operator needs for the errors with a known cause. */
function explain(err: unknown, what: string): unknown {
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

function getLink(sock: NetlinkSocket, name: string): LinkInfo | undefined {
  try {
    const reply = sock.request(`RTM_GETLINK ${name}`, (seq) => buildGetLinkByName(seq, name));
    const msg = reply.find((m) => m.type === RTM_NEWLINK);
    return msg ? parseLink(msg) : undefined;
  } catch (err) {
    if (errnoOf(err) === ENODEV) return undefined;
    throw explain(err, `look up interface ${name}`);
  }
}

function createLink(sock: NetlinkSocket, name: string, kind: InterfaceKind): void {
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

function setLinkAlias(sock: NetlinkSocket, name: string, ifindex: number, alias: string): void {
  try {
    sock.request(`RTM_NEWLINK ${name} alias`, (seq) => buildSetLinkAlias(seq, ifindex, alias));
  } catch (err) {
    throw explain(err, `mark interface ${name} as created by Kanal (set its alias)`);
  }
}

function hasAddress(sock: NetlinkSocket, ifindex: number, address: string): boolean {
  const { family, bytes } = addressBytes(address);
  const wanted = formatAddress(family, bytes);
  const reply = sock.request(`RTM_GETADDR dump`, (seq) => buildGetAddrDump(seq, family, ifindex));
  return reply
    .filter((m) => m.type === RTM_NEWADDR)
    .map(parseAddr)
    .some((a) => a.ifindex === ifindex && a.family === family && (a.local === wanted || a.address === wanted));
}

/** Returns true when this call added the address. */
function addAddress(sock: NetlinkSocket, name: string, ifindex: number, address: string): boolean {
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

function deleteLink(sock: NetlinkSocket, name: string, ifindex: number): void {
  try {
    sock.request(`RTM_DELLINK ${name}`, (seq) => buildDelLink(seq, ifindex));
  } catch (err) {
    if (errnoOf(err) !== ENODEV) throw explain(err, `delete interface ${name}`);
  }
}

function deleteAddress(sock: NetlinkSocket, name: string, ifindex: number, address: string): void {
  try {
    sock.request(`RTM_DELADDR ${address} dev ${name}`, (seq) => buildDelAddr(seq, ifindex, address));
  } catch (err) {
    if (errnoOf(err) !== EADDRNOTAVAIL && errnoOf(err) !== ENODEV) throw explain(err, `remove address ${address} from ${name}`);
  }
}

// ---------------------------------------------------------------- public API

/**
 * Create (or adopt) the link, add address/32|/128 scope host unless present,
 * and bring the link up. Idempotent. A link this call creates is marked with
 * KANAL_LINK_ALIAS; an existing link that carries the marker is reclaimed
 * (createdLink and addedAddress true, so remove deletes it). If a step fails,
 * whatever this call created is rolled back before the error is thrown; a
 * reclaimed link is left for the next attempt to reclaim again.
 */
export function ensureHostInterface(spec: HostInterfaceSpec, options?: NetlinkSocketOptions): HostInterfaceState {
  const { name, kind, address } = validateHostInterfaceSpec(spec);
  return withNetlinkSocket((sock) => {
    let link = getLink(sock, name);
    let createdNow = false;
    if (!link) {
      try {
        createLink(sock, name, kind);
        createdNow = true;
      } catch (err) {
        if (errnoOf(err) !== EEXIST) throw err;
        // Created concurrently by someone else: adopt it like any existing link.
      }
      link = getLink(sock, name);
      if (!link) throw new NetlinkError(`RTM_GETLINK ${name}`, ENODEV, `interface ${name} disappeared right after it was created`);
    }
    const ifindex = link.ifindex;
    const reclaimed = !createdNow && link.alias === KANAL_LINK_ALIAS;
    let addedNow = false;
    try {
      // Mark first: a crash after this point leaves a link the next run reclaims.
      if (createdNow) setLinkAlias(sock, name, ifindex, KANAL_LINK_ALIAS);
      addedNow = addAddress(sock, name, ifindex, address);
      if ((link.flags & IFF_UP) === 0) {
        try {
          sock.request(`RTM_NEWLINK ${name} up`, (seq) => buildSetLinkUp(seq, ifindex));
        } catch (err) {
          throw explain(err, `bring interface ${name} up`);
        }
      }
    } catch (err) {
      try {
        if (createdNow) deleteLink(sock, name, ifindex);
        else if (addedNow) deleteAddress(sock, name, ifindex, address);
      } catch {
        // Keep the original error; the rollback failure is secondary.
      }
      throw err;
    }
    return {
      name,
      address,
      createdLink: createdNow || reclaimed,
      addedAddress: addedNow || reclaimed,
      reclaimed,
      ifindex,
      kind: link.kind ?? null,
    };
  }, options);
}

/**
 * Undo ensureHostInterface: delete the link if Kanal created it (which also
 * drops the address), else delete the address if Kanal added it. Missing pieces are
 * fine. If the name now belongs to a different link (other ifindex), that link
 * is not ours and is left alone.
 */
export function removeHostInterface(state: HostInterfaceState, options?: NetlinkSocketOptions): void {
  const name = validateInterfaceName(state.name);
  const address = validateAddress(state.address);
  if (!state.createdLink && !state.addedAddress) return;
  withNetlinkSocket((sock) => {
    const link = getLink(sock, name);
    if (!link || link.ifindex !== state.ifindex) return;
    if (state.createdLink) deleteLink(sock, name, link.ifindex);
    else deleteAddress(sock, name, link.ifindex, address);
  }, options);
}

/**
 * What keeps the advertise address from working now: the link gone, down, or
 * without the address. Empty when all is well. Reads only (two requests).
 */
export function inspectHostInterface(spec: Pick<HostInterfaceSpec, 'name' | 'address'>, options?: NetlinkSocketOptions): string[] {
  const name = validateInterfaceName(spec.name);
  const address = validateAddress(spec.address);
  return withNetlinkSocket((sock) => {
    const link = getLink(sock, name);
    if (!link) return [`interface ${name} is gone`];
    const problems: string[] = [];
    if ((link.flags & IFF_UP) === 0) problems.push(`interface ${name} is down`);
    let present: boolean;
    try {
      present = hasAddress(sock, link.ifindex, address);
    } catch (err) {
      throw explain(err, `list addresses of ${name}`);
    }
    if (!present) problems.push(`address ${address} is missing from ${name}`);
    return problems;
  }, options);
}

/** Whether this process has CAP_NET_ADMIN in its effective set (Linux /proc). */
function hasNetAdmin(): boolean | undefined {
  try {
    const m = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'));
    if (!m) return undefined;
    return (BigInt(`0x${m[1]}`) & (1n << 12n)) !== 0n; // CAP_NET_ADMIN = 12
  } catch {
    return undefined;
  }
}

/**
 * Preflight: can we talk rtnetlink at all? Opens a socket and looks up "lo".
 * Needs no privilege itself; CAP_NET_ADMIN (needed by ensure) is reported in detail.
 */
export function checkNetlink(options?: NetlinkSocketOptions): { ok: boolean; detail: string } {
  const cap = hasNetAdmin();
  const capText =
    cap === undefined ? 'CAP_NET_ADMIN unknown' : cap ? 'CAP_NET_ADMIN present' : 'CAP_NET_ADMIN missing (needed to create interfaces)';
  try {
    const lo = withNetlinkSocket((sock) => getLink(sock, 'lo'), { timeoutMs: 2000, ...options });
    if (!lo) return { ok: true, detail: `rtnetlink works, but this network namespace has no "lo"; ${capText}` };
    return { ok: true, detail: `rtnetlink works (lo is ifindex ${lo.ifindex}, ${lo.flags & IFF_UP ? 'up' : 'down'}); ${capText}` };
  } catch (err) {
    return { ok: false, detail: `rtnetlink unavailable: ${err instanceof Error ? err.message : String(err)}` };
  }
}
