/**
 * The addresses an agent dials (docs/ha.md): each `--proxy-server-host`
 * (repeatable; a name, an address, or either with its own port) resolved to
 * every address it has (dns.lookup with all: true). Each address is a
 * distinct server. A host that resolves to one address is dialled by its name,
 * as upstream's agent does: behind a load balancer the servers share that one
 * address, and the name is resolved afresh on every connect. A host whose
 * lookup fails keeps the addresses it resolved to before (a DNS blip drops no
 * server), or is dialled by name when it never resolved.
 */
import dns from 'node:dns/promises';
import { isIP } from 'node:net';
import { UsageError } from '../common/usage-error.js';
import { formatHostPort, isValidHost, parseHostPort, type HostPort } from '../common/host-port.js';
import { errorMessage } from '../common/error-message.js';

/** One `--proxy-server-host` value: a host, with the port it was given with (else --proxy-server-port). */
export interface ServerHost {
  host: string;
  port?: number;
}

/** One address the agent keeps a reconnect loop for. */
export interface ServerEndpoint {
  /** What the channel dials, "host:port": the given host itself, or one of its addresses. Identifies the endpoint. */
  target: string;
  /** The host as given. */
  name: string;
  /** `target` is one of the addresses `name` resolved to: the server's certificate is checked against `name` (and SNI names it). */
  resolved: boolean;
}

/** All addresses of a host name (IPv4 and IPv6), in the resolver's order. */
export type LookupAll = (hostname: string) => Promise<string[]>;

export const systemLookup: LookupAll = async (hostname) => (await dns.lookup(hostname, { all: true })).map((a) => a.address);

/**
 * Parses the values of `--proxy-server-host` (repeatable, or comma-separated):
 * `cp.example`, `10.0.0.1`, `::1`, or with a port of its own `cp.example:8132`,
 * `[::1]:8132`. A bare IPv6 address is a host, never host:port.
 */
export function parseServerHosts(values: readonly string[], flag: string): ServerHost[] {
  const hosts: ServerHost[] = [];
  for (const value of values.flatMap((v) => v.split(',')).map((v) => v.trim())) {
    if (value === '') continue;
    if (isIP(value) !== 0) hosts.push({ host: value });
    else if (value.includes(':')) {
      try {
        hosts.push(parseHostPort(value));
      } catch (err) {
        throw new UsageError(`--${flag} ${JSON.stringify(value.slice(0, 80))}: ${errorMessage(err)}`);
      }
    } else if (isValidHost(value)) hosts.push({ host: value });
    else throw new UsageError(`--${flag} ${JSON.stringify(value.slice(0, 80))} is not a host name or IP address`);
  }
  if (hosts.length === 0) throw new UsageError(`--${flag} is required`);
  return hosts;
}

/** Each host with its port: its own, else `defaultPort` (--proxy-server-port); duplicates once. */
export function withPorts(hosts: readonly ServerHost[], defaultPort: number): HostPort[] {
  const seen = new Set<string>();
  const out: HostPort[] = [];
  for (const h of hosts) {
    const hp = { host: h.host, port: h.port ?? defaultPort };
    const key = formatHostPort(hp);
    if (seen.has(key)) continue;
    seen.add(key);
    out.push(hp);
  }
  return out;
}

export interface Resolution {
  /** Every address to dial, each once (the first host that resolved to it names it). */
  endpoints: ServerEndpoint[];
  /** Hosts whose lookup failed this time, and why. */
  failures: { host: string; error: string }[];
}

/** The given hosts and what each resolved to last; resolve() again to follow DNS changes. */
export class ServerAddresses {
  /** Given host ("host:port") → the endpoints of its last successful lookup. */
  private readonly lastGood = new Map<string, ServerEndpoint[]>();

  constructor(
    readonly hosts: readonly HostPort[],
    private readonly lookup: LookupAll = systemLookup,
  ) {}

  /** Whether a lookup could change anything: false when every host is an IP address. */
  get resolvable(): boolean {
    return this.hosts.some((h) => isIP(h.host) === 0);
  }

  async resolve(): Promise<Resolution> {
    const failures: Resolution['failures'] = [];
    const perHost = await Promise.all(
      this.hosts.map(async (h): Promise<ServerEndpoint[]> => {
        const key = formatHostPort(h);
        const byName = [{ target: key, name: h.host, resolved: false }];
        if (isIP(h.host) !== 0) return byName;
        let addresses: string[];
        try {
          addresses = [...new Set(await this.lookup(h.host))];
        } catch (err) {
          failures.push({ host: h.host, error: errorMessage(err) });
          return this.lastGood.get(key) ?? byName;
        }
        const endpoints =
          addresses.length <= 1
            ? byName
            : addresses.map((address) => ({ target: formatHostPort({ host: address, port: h.port }), name: h.host, resolved: true }));
        this.lastGood.set(key, endpoints);
        return endpoints;
      }),
    );
    const endpoints: ServerEndpoint[] = [];
    const seen = new Set<string>();
    for (const e of perHost.flat()) {
      if (seen.has(e.target)) continue;
      seen.add(e.target);
      endpoints.push(e);
    }
    return { endpoints, failures };
  }
}
