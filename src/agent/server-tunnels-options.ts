/** What a ServerTunnels is made with (server-tunnels.ts): the servers, how to reach them, how many to hold, and what to offer. */
import type { AuditSink } from '../audit/audit-record.js';
import type { Logger } from 'pino';
import type { ClientKeepalive, ClientTlsOptions, Transport } from '../transport/transport.js';
import type { FeatureSet } from '../wire/features.js';
import type { TunnelLimits } from '../tunnel/limits.js';
import type { HostPort } from '../common/host-port.js';
import type { HealthPortOptions } from '../common/health-server.js';
import type { LookupAll } from './server-addresses.js';
import type { ServerCountSource } from './server-count.js';
import type { Target } from './target.js';
import type { ResolveHandler } from '../tunnel/name-resolution.js';

export interface ServerTunnelsOptions {
  agentID: string;
  agentIdentifiers: string;
  /** The hosts given (--proxy-server-host with its port) and how servers are verified. */
  server: { hosts: readonly HostPort[]; tls: ClientTlsOptions };
  /** Resolves a host name to all its addresses (default: the system's resolver); tests give their own. */
  lookup?: LookupAll;
  /** The agent's PINGs to each server (--keepalive-time, --keepalive-timeout; default DEFAULT_CLIENT_KEEPALIVE). */
  keepalive?: Omit<ClientKeepalive, 'acceptsFrequentPings'>;
  /** Read for every connect (projected tokens rotate); throws when the token cannot be read. */
  token?: () => string | undefined;
  /**
   * How many servers to hold tunnels to (server-count.ts): `leases` is
   * the lease counter's count (`--count-server-leases`), combined with the
   * servers' serverCount headers by `source`.
   */
  serverCount?: { leases?: () => number; source: ServerCountSource };
  /**
   * `--sync-forever`: with every tunnel up, still connect once per
   * reconnect.maxMs to learn of new servers from their serverCount headers
   * (behind one address; by name, the names are resolved again as often).
   */
  syncForever?: boolean;
  dialTimeoutMs: number;
  connectTimeoutMs: number;
  reconnect: { initialMs: number; maxMs: number };
  health?: HealthPortOptions;
  transport: Transport;
  limits?: Partial<TunnelLimits>;
  features?: FeatureSet;
  /** The --target listeners: their destinations are named to each server, which says which its allow-list refuses. */
  targets?: readonly Target[];
  /** Resume (docs/protocol.md): how long a lost tunnel's connections wait for it (absent or 0: not offered). */
  resumeTimeoutMs?: number;
  /** Resolves the names the servers ask for (--cluster-dns, --cluster-domain: name-resolver.ts); absent: each is refused. */
  resolveHandler?: ResolveHandler;
  /** The agent's audit log (--audit-log-path); absent: none. */
  audit?: AuditSink;
  log: Logger;
}
