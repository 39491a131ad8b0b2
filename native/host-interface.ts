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

import { readFileSync } from 'node:fs';
import { NetlinkError } from './netlink-error.js';
import { withNetlinkSocket, type NetlinkSocketOptions } from './netlink-socket.js';
import { IFF_UP, buildSetLinkUp } from './rtnetlink.js';
import {
  KANAL_LINK_ALIAS,
  validateAddress,
  validateHostInterfaceSpec,
  validateInterfaceName,
  type HostInterfaceSpec,
  type HostInterfaceState,
} from './host-interface-spec.js';
import {
  EEXIST,
  ENODEV,
  addAddress,
  createLink,
  deleteAddress,
  deleteLink,
  errnoOf,
  explain,
  getLink,
  hasAddress,
  setLinkAlias,
} from './host-interface-steps.js';

export { NetlinkError } from './netlink-error.js';
export {
  HostInterfaceSpecError,
  INTERFACE_KINDS,
  KANAL_LINK_ALIAS,
  validateAddress,
  validateHostInterfaceSpec,
  validateInterfaceName,
  validateKind,
  type HostInterfaceSpec,
  type HostInterfaceState,
  type InterfaceKind,
} from './host-interface-spec.js';

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
