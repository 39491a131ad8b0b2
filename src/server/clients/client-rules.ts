/**
 * A client's destination rules (docs/frontends.md, "Clients"): a
 * destination is allowed when some rule allows it. A name rule matches the
 * requested name (case-insensitive, trailing dot ignored, `*.` one or more
 * labels on the left) and port; a CIDR rule matches an IP address and port.
 * A name no name rule allows is checked by its addresses: resolved inside the
 * cluster first (client-policy.ts), each address must be allowed by a CIDR
 * rule, so a name that resolves to a denied address is refused.
 */
import net from 'node:net';
import type { ClientRule, PortRange } from './client-entry.js';

/** The rules' list as messages show it, bounded. */
const MAX_LISTED = 8;

function inPorts(ports: PortRange | undefined, port: number): boolean {
  return ports === undefined || (port >= ports.from && port <= ports.to);
}

/** A name as rules compare it: lower case, no trailing dot. */
export function normalName(name: string): string {
  const lower = name.toLowerCase();
  return lower.endsWith('.') ? lower.slice(0, -1) : lower;
}

/** `pattern` (`*.svc.cluster.local`, or a name) matches `name` (both normal). */
export function nameMatches(pattern: string, name: string): boolean {
  if (!pattern.startsWith('*.')) return pattern === name;
  const suffix = pattern.slice(1);
  return name.length > suffix.length && name.endsWith(suffix);
}

/** An IPv4-mapped IPv6 address (::ffff:a.b.c.d) is the IPv4 address it carries. */
function unmapped(ip: string): { address: string; family: 'ipv4' | 'ipv6' } {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  if (m) return { address: m[1], family: 'ipv4' };
  return { address: ip, family: net.isIP(ip) === 4 ? 'ipv4' : 'ipv6' };
}

export class ClientRules {
  private readonly cidrs: { rule: ClientRule & { kind: 'cidr' }; list: net.BlockList }[];
  private readonly names: (ClientRule & { kind: 'names' })[];

  constructor(readonly rules: readonly ClientRule[]) {
    this.cidrs = [];
    this.names = [];
    for (const rule of rules) {
      if (rule.kind === 'names') {
        this.names.push(rule);
        continue;
      }
      const list = new net.BlockList();
      list.addSubnet(rule.cidr.address, rule.cidr.prefix, rule.cidr.family);
      this.cidrs.push({ rule, list });
    }
  }

  /** The name rule that allows `name` (any case, trailing dot or not) on `port`. */
  nameRule(name: string, port: number): ClientRule | undefined {
    const n = normalName(name);
    return this.names.find((r) => inPorts(r.ports, port) && r.names.some((p) => nameMatches(p, n)));
  }

  /** The CIDR rule that allows the IP address `ip` on `port`. */
  addressRule(ip: string, port: number): ClientRule | undefined {
    if (net.isIP(ip) === 0) return undefined;
    const { address, family } = unmapped(ip);
    return this.cidrs.find(({ rule, list }) => inPorts(rule.ports, port) && list.check(address, family))?.rule;
  }

  /** Whether a name could be allowed by its addresses on `port`: some CIDR rule takes that port (else resolving is pointless). */
  addressesCanAllow(port: number): boolean {
    return this.cidrs.some(({ rule }) => inPorts(rule.ports, port));
  }

  /** "cidr 10.0.0.0/8 port 9100, name *.svc.cluster.local port 443" (at most a few), or "none". */
  describe(): string {
    if (this.rules.length === 0) return 'none: the entry allows nothing';
    const listed = this.rules.slice(0, MAX_LISTED).map((r) => r.text);
    const more = this.rules.length - listed.length;
    return `${listed.join(', ')}${more > 0 ? ` and ${more} more` : ''}`;
  }
}
