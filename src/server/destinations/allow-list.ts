/**
 * Destinations the server dials for agent-initiated (node -> control plane)
 * connections. Exact host:port matches only: a wildcard here would turn
 * every node into a door to the whole control-plane network.
 */
import { isIP } from 'node:net';
import { formatHostPort, parseHostPort, type HostPort } from '../../common/host-port.js';

function canonical(hp: HostPort): string {
  const host = isIP(hp.host) ? hp.host.toLowerCase() : hp.host.toLowerCase().replace(/\.$/, '');
  return formatHostPort({ host: isIP(host) === 6 ? new URL(`http://[${host}]/`).hostname.slice(1, -1) : host, port: hp.port });
}

export class AllowList {
  private entries: Set<string>;

  constructor(destinations: readonly string[]) {
    this.entries = AllowList.parse(destinations);
  }

  private static parse(destinations: readonly string[]): Set<string> {
    return new Set(destinations.map((d) => canonical(parseHostPort(d))));
  }

  /** A tenant's list changed in its file (docs/multi-tenant.md): dials from now on are checked against `destinations`. */
  replace(destinations: readonly string[]): void {
    this.entries = AllowList.parse(destinations);
  }

  get empty(): boolean {
    return this.entries.size === 0;
  }

  list(): string[] {
    return [...this.entries];
  }

  /** Whether `address` (host:port) may be dialled. Malformed addresses never are. */
  allows(address: string): boolean {
    try {
      return this.entries.has(canonical(parseHostPort(address)));
    } catch {
      return false;
    }
  }
}
