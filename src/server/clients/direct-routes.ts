/**
 * A tenant's direct routes: destinations on the control plane's own network
 * (an API extension or metrics-server beside the kube-apiserver) that the
 * server dials itself, names resolved by the server's own resolver, instead
 * of through an agent. Off (empty) unless configured; the clients policy
 * applies its rules, limits and audit before it dials here.
 */
import net from 'node:net';
import { lookup } from 'node:dns/promises';
import type { CancelSignal } from '../../common/cancel.js';
import { formatHostPort, parseHostPort, type HostPort } from '../../common/host-port.js';
import { errorMessage } from '../../common/error-message.js';
import { truncateForLog } from '../../common/log-safety.js';
import { DialError } from '../../tunnel/errors.js';
import { dialTcp } from '../../tunnel/tcp-dial.js';
import { ANY_PORT, parseDirectRoute, type DirectRouteEntry } from './direct-routes-entry.js';

/** Addresses of one name tried in turn, at most: each within what is left of the dial's timeout. */
export const MAX_ADDRESSES_TRIED = 16;

/** A name's addresses, in the resolver's order; rejects with an error carrying `code` (ENOTFOUND …) when there are none. */
export type NameLookup = (name: string) => Promise<string[]>;

export interface DirectRoutesOptions {
  /** Default: the system resolver (getaddrinfo, as dns.lookup), which is the control plane's network's. */
  lookup?: NameLookup;
}

const systemLookup: NameLookup = async (name) => (await lookup(name, { all: true, order: 'verbatim' })).map((a) => a.address);

/** The parsed entries, indexed: CIDRs in one BlockList per port (ANY_PORT: any), names and wildcard suffixes with their ports. */
interface RouteTable {
  entries: readonly DirectRouteEntry[];
  cidrs: Map<number, net.BlockList>;
  names: Map<string, Set<number>>;
  suffixes: Map<string, Set<number>>;
}

function tableOf(texts: readonly string[]): RouteTable {
  // Every entry parsed before anything is kept: one mistake leaves the routes as they were.
  const entries = texts.map(parseDirectRoute);
  const table: RouteTable = { entries, cidrs: new Map(), names: new Map(), suffixes: new Map() };
  const add = (map: Map<string, Set<number>>, key: string, port: number): void => {
    const ports = map.get(key) ?? new Set<number>();
    ports.add(port);
    map.set(key, ports);
  };
  for (const e of entries) {
    if (e.kind === 'cidr') {
      const list = table.cidrs.get(e.port) ?? new net.BlockList();
      list.addSubnet(e.network, e.prefix, e.family);
      table.cidrs.set(e.port, list);
    } else if (e.kind === 'name') add(table.names, e.name, e.port);
    else add(table.suffixes, e.suffix, e.port);
  }
  return table;
}

function hasPort(ports: Set<number> | undefined, port: number): boolean {
  return ports !== undefined && (ports.has(ANY_PORT) || ports.has(port));
}

export class DirectRoutes {
  private table: RouteTable;
  private readonly lookup: NameLookup;

  /** Throws a UsageError naming the first malformed entry (direct-routes-entry.ts). */
  constructor(entries: readonly string[], opts: DirectRoutesOptions = {}) {
    this.table = tableOf(entries);
    this.lookup = opts.lookup ?? systemLookup;
  }

  /** A tenant's routes changed in its file: dials from now on are checked against `entries`; on a UsageError nothing changed. */
  replace(entries: readonly string[]): void {
    this.table = tableOf(entries);
  }

  /** No route: every destination goes through an agent. */
  get empty(): boolean {
    return this.table.entries.length === 0;
  }

  /** The entries as given, in canonical form (lower case, IPv6 in brackets, a bare address as /32 or /128). */
  list(): string[] {
    return this.table.entries.map((e) => e.text);
  }

  /**
   * Whether `host` (an IP literal, or a name: case-insensitive, a trailing dot
   * ignored) on `port` is a direct route. An IP literal matches CIDR entries
   * only and a name name entries only: a name is not resolved to be matched.
   */
  matches(host: string, port: number): boolean {
    const family = net.isIP(host);
    const t = this.table;
    if (family !== 0) {
      const type = family === 4 ? 'ipv4' : 'ipv6';
      return [ANY_PORT, port].some((p) => t.cidrs.get(p)?.check(host, type) === true);
    }
    const name = host.toLowerCase().replace(/\.$/, '');
    if (hasPort(t.names.get(name), port)) return true;
    // Each proper suffix from a dot: at most one per label of the name (at most 127 in 253 characters).
    for (let dot = name.indexOf('.'); dot > 0; dot = name.indexOf('.', dot + 1)) {
      if (hasPort(t.suffixes.get(name.slice(dot)), port)) return true;
    }
    return false;
  }

  /**
   * Dials `address` (host:port, a direct route) from the server: a name is
   * resolved by the server's resolver, then its addresses are tried in turn,
   * all within `timeoutMs`. Rejects with a DialError: forbidden (not a direct
   * route), unresolved, refused, timeout or cancelled.
   */
  async dial(address: string, timeoutMs: number, signal?: CancelSignal): Promise<net.Socket> {
    let target: HostPort;
    try {
      target = parseHostPort(address);
    } catch (err) {
      throw new DialError('refused', errorMessage(err));
    }
    const label = formatHostPort(target);
    if (!this.matches(target.host, target.port))
      throw new DialError('forbidden', `dial tcp ${label}: not a direct route (direct-route: ${this.list().join(', ') || 'none'})`);
    if (signal?.aborted) throw new DialError('cancelled', `dial tcp ${label}: cancelled`);
    if (net.isIP(target.host) !== 0) return dialTcp(label, { timeoutMs, ...(signal ? { signal } : {}) });
    const deadline = Date.now() + timeoutMs;
    const addresses = await this.resolve(target.host, label, timeoutMs, signal);
    const via = `${label} (resolved by the server's resolver to ${truncateForLog(addresses.join(', '), 200)})`;
    let last: DialError | undefined;
    for (const a of addresses.slice(0, MAX_ADDRESSES_TRIED)) {
      const left = deadline - Date.now();
      if (left <= 0) break;
      try {
        return await dialTcp(formatHostPort({ host: a, port: target.port }), { timeoutMs: left, ...(signal ? { signal } : {}) });
      } catch (err) {
        if (!(err instanceof DialError)) throw err;
        if (err.failure !== 'refused') throw new DialError(err.failure, `dial tcp ${via}: ${err.message}`);
        last = err;
      }
    }
    if (last) throw new DialError('refused', `dial tcp ${via}: ${last.message}`);
    throw new DialError('timeout', `dial tcp ${via}: i/o timeout after ${timeoutMs} ms`);
  }

  /** `name`'s addresses within `timeoutMs`; getaddrinfo cannot be stopped, so a late answer is dropped. */
  private resolve(name: string, label: string, timeoutMs: number, signal: CancelSignal | undefined): Promise<string[]> {
    return new Promise<string[]>((resolve, reject) => {
      let settled = false;
      const settle = (err: DialError | null, addresses: string[] = []): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        if (err) reject(err);
        else resolve(addresses);
      };
      const onAbort = (): void =>
        settle(new DialError('cancelled', `dial tcp ${label}: cancelled while the server's resolver looked up ${name}`));
      const timer = setTimeout(
        () =>
          settle(new DialError('timeout', `dial tcp ${label}: the server's resolver did not answer for ${name} within ${timeoutMs} ms`)),
        timeoutMs,
      );
      signal?.addEventListener('abort', onAbort);
      Promise.resolve()
        .then(() => this.lookup(name))
        .then(
          (addresses) =>
            addresses.length > 0
              ? settle(null, addresses)
              : settle(new DialError('unresolved', `dial tcp ${label}: the server's resolver has no address for ${name}`)),
          (err: unknown) => settle(new DialError('unresolved', `dial tcp ${label}: ${unresolvedWhy(name, err)}`)),
        );
    });
  }
}

/** A lookup's failure in words: NXDOMAIN and "no address" as such, anything else with its code. */
function unresolvedWhy(name: string, err: unknown): string {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === 'ENOTFOUND' || code === 'ENODATA' || code === 'EAI_NONAME')
    return `the server's resolver found no address for ${name} (${code})`;
  if (code === 'EAI_AGAIN') return `the server's resolver could not look up ${name} now (EAI_AGAIN: temporary failure)`;
  return `the server's resolver failed to look up ${name}: ${truncateForLog(errorMessage(err), 200)}`;
}
