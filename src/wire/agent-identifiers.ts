/**
 * The agentIdentifiers gRPC metadata (upstream's konnectivity-client
 * pkg/common/agent GenAgentIdentifiers): a URL query such as
 * "host=node-1&ipv4=10.0.0.5&ipv6=fd00::5&cidr=10.0.0.0/24&default-route=true".
 * The agent's CLI validates its flag with it and the server parses what agents
 * announce with it; a malformed value is an error naming it, never ignored
 * (it would silently misroute).
 */
import { BlockList, SocketAddress, isIP } from 'node:net';

/** A CIDR block an agent announces. */
export interface IpPrefix {
  family: 'ipv4' | 'ipv6';
  /** Prefix length: the longer, the more specific. */
  length: number;
  /** The block itself (node:net does the address arithmetic). */
  block: BlockList;
}

/** Names are lower-case and IP addresses canonical (see canonicalHost), as dial hosts are compared. */
export interface AgentIdentifiers {
  hosts: string[];
  ipv4: string[];
  ipv6: string[];
  cidrs: IpPrefix[];
  defaultRoute: boolean;
}

export const IDENTIFIER_KEYS = ['host', 'ipv4', 'ipv6', 'cidr', 'default-route'] as const;

/** Values one agent may announce in all: each one is a routing entry on every server. */
export const MAX_IDENTIFIER_VALUES = 64;

const HOST_NAME = /^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?$/;
/** Go's strconv.ParseBool, which upstream applies to default-route. */
const GO_TRUE = ['1', 't', 'T', 'TRUE', 'true', 'True'];
const GO_FALSE = ['0', 'f', 'F', 'FALSE', 'false', 'False'];

/** The form hosts are compared in: an IP address canonical (RFC 5952, no zone), a name lower-case. */
export function canonicalHost(host: string): string {
  const family = isIP(host);
  if (family === 0) return host.toLowerCase();
  return new SocketAddress({ address: host, family: family === 4 ? 'ipv4' : 'ipv6' }).address;
}

function parseCidr(text: string): IpPrefix {
  const slash = text.indexOf('/');
  const address = text.slice(0, Math.max(slash, 0));
  const ip = isIP(address);
  const lengthText = text.slice(slash + 1);
  if (slash < 0 || ip === 0 || !/^\d{1,3}$/.test(lengthText) || Number(lengthText) > (ip === 4 ? 32 : 128)) {
    throw new Error(`cidr ${JSON.stringify(text.slice(0, 80))} is not an address block such as 10.0.0.0/24 or fd00::/64`);
  }
  const family = ip === 4 ? 'ipv4' : 'ipv6';
  const block = new BlockList();
  block.addSubnet(address, Number(lengthText), family);
  return { family, length: Number(lengthText), block };
}

/** True when the IP address `host` (canonical) lies in `prefix`. */
export function prefixContains(prefix: IpPrefix, host: string): boolean {
  const family = isIP(host);
  return family !== 0 && prefix.family === (family === 4 ? 'ipv4' : 'ipv6') && prefix.block.check(host, prefix.family);
}

export function parseAgentIdentifiers(text: string): AgentIdentifiers {
  const q = new URLSearchParams(text);
  const ids: AgentIdentifiers = { hosts: [], ipv4: [], ipv6: [], cidrs: [], defaultRoute: false };
  let values = 0;
  let defaultRouteSeen = false;
  for (const [key, value] of q) {
    if (++values > MAX_IDENTIFIER_VALUES)
      throw new Error(`more than ${MAX_IDENTIFIER_VALUES} identifiers; announce fewer (a cidr covers many addresses)`);
    const quoted = JSON.stringify(value.slice(0, 80));
    switch (key) {
      case 'host':
        if (!HOST_NAME.test(value)) throw new Error(`host ${quoted} is not a host name`);
        ids.hosts.push(canonicalHost(value));
        break;
      case 'ipv4':
        if (isIP(value) !== 4) throw new Error(`ipv4 ${quoted} is not an IPv4 address`);
        ids.ipv4.push(canonicalHost(value));
        break;
      case 'ipv6':
        if (isIP(value) !== 6) throw new Error(`ipv6 ${quoted} is not an IPv6 address`);
        ids.ipv6.push(canonicalHost(value));
        break;
      case 'cidr':
        ids.cidrs.push(parseCidr(value));
        break;
      case 'default-route':
        if (defaultRouteSeen) throw new Error('default-route is given twice');
        defaultRouteSeen = true;
        if (GO_TRUE.includes(value)) ids.defaultRoute = true;
        else if (!GO_FALSE.includes(value)) throw new Error(`default-route ${quoted} is neither true nor false`);
        break;
      default:
        throw new Error(`unknown agent identifier ${JSON.stringify(key.slice(0, 80))} (known: ${IDENTIFIER_KEYS.join(', ')})`);
    }
  }
  return ids;
}
