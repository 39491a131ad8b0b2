// What the agent's host interface is (its spec, its state once ensured, the
// marker of a Kanal-made link) and the checks of a spec before any kernel call.

import { isIP } from 'node:net';
import { addressBytes } from './rtnetlink.js';

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

const IFNAMSIZ = 16; // including the trailing NUL

/**
 * The alias (IFLA_IFALIAS) Kanal puts on every link it creates: the kernel's
 * record that the link is Kanal's to delete. Compared byte for byte; an
 * operator can hand a link over to Kanal by setting exactly this alias, or
 * keep a Kanal-made link by changing or clearing it.
 */
export const KANAL_LINK_ALIAS = 'kanal-agent: created by kanal, removed on clean stop';

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
