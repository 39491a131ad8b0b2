/** What a KanalServer is given (ports, credentials, routing, limits) and what it reports of itself. */
import type { HealthPortOptions } from '../common/health-server.js';
import type { ClientsFileSource } from './tenants/clients-file-watch.js';
import type { AuditLogFileOptions } from '../audit/settings.js';
import type { Logger } from 'pino';
import type { Transport } from '../transport/transport.js';
import type { TunnelStats } from '../tunnel/tunnel.js';
import type { FrontendMode, TlsFiles } from './listeners.js';
import type { UnixSocketOptions } from './frontends/unix-socket.js';
import type { RolePins } from './identity/client-roles.js';
import type { KeepaliveOptions } from '../transport/liveness.js';
import type { TokenAuthenticator } from './identity/token-authenticator.js';
import type { ServerLeaseController } from './leases/lease-controller.js';
import type { TenantDefinition } from './tenants/tenant-definition.js';
import type { TenantSettingsOptions } from './tenants/tenant.js';
import type { TlsPolicyOptions } from './tenants/tenant-directory.js';
import type { WorkerPlace } from './workers/worker-env.js';

/** An agent that misses PINGs for this long is closed; quiet (avoided) after QUIET_AFTER_MS already. */
export const DEFAULT_AGENT_KEEPALIVE = { intervalMs: 10_000, timeoutMs: 20_000 };
/** How the command line names the settings KanalServer's own messages cite (the assembly passes its table's names). */
export interface ServerFlags {
  tenantsConfig: string;
  maxNodeToCpConnections: string;
  /** The health port's address and port, as a listen error lists them. */
  health: string;
  healthMetrics: string;
}

export interface ServerOptions {
  serverID: string;
  flags: ServerFlags;
  /** Where each tunnelled connection, failed dial and refusal is recorded (--audit-log-path; docs/operations.md); absent: nowhere. */
  auditLog?: AuditLogFileOptions;
  /**
   * The one cluster's settings (config/tenant-options.ts); with --tenants-config
   * each tenant's come from its entry instead.
   */
  tenant: TenantSettingsOptions;
  /** --frontend-clients-config: watched and re-read while the server runs (one cluster; tenants have theirs in the tenants file). */
  clientsFile?: ClientsFileSource;
  agent: {
    host: string;
    port: number;
    tls: TlsFiles;
    allowUnauthenticated: boolean;
    /** Client certificates of agents must match these (when set) and never the frontend's. */
    clientPins?: RolePins;
    /** Server PINGs on agent connections. Default DEFAULT_AGENT_KEEPALIVE. */
    keepalive?: Omit<KeepaliveOptions, 'onTimeout'>;
    /** Resume (docs/protocol.md): how long a lost agent tunnel's connections wait for it; absent or 0: not offered. */
    resumeTimeoutMs?: number;
    /**
     * Service account token authentication: every agent stream needs a
     * valid token, whose identity is the agent's credential. Without a
     * client CA (`tls.ca`) the agent port then asks for no certificate (as
     * upstream); with one, the connection needs a valid certificate as well.
     */
    tokens?: TokenAuthenticator;
  };
  /** `--enable-lease-controller`: started once the listeners serve; stopped (lease deleted) first on stop. */
  leases?: ServerLeaseController;
  frontend: {
    mode: FrontendMode;
    /** From accept to a complete request head; default REQUEST_HEAD_TIMEOUT_MS. */
    headerTimeoutMs?: number;
    uds?: UnixSocketOptions;
    /** `clientPins`: the KAS's client certificate must match these (when set) and never the agents'. */
    tcp?: { host: string; port: number; tls: TlsFiles; clientPins?: RolePins };
    /** Listeners of their own for other doors (a plain-TCP forward proxy, SOCKS5), each serving one `mode`; a server of one cluster. */
    extra?: readonly ExtraFrontendListener[];
  };
  health?: HealthPortOptions;
  maxReceiveMessageBytes: number;
  transport: Transport;
  /**
   * What all connections of the process may hold before the largest agent is
   * shed (docs/limits.md, "Retained bytes"; default: defaultMemoryBudget()).
   */
  memoryBudgetBytes?: number;
  /** Node -> control plane connections of all agents together (file descriptors here); default half the open-files limit. */
  maxNodeToCpConnections?: number;
  log: Logger;
  /**
   * `--tenants-config`: the server serves the tenants `load()` reads (and
   * reads again on reloadTenants()) instead of one cluster from the options
   * above; those then only give what the tenants share (ports, keepalive,
   * transport, the default agent-port certificate, the TCP frontend).
   */
  tenants?: {
    /** Reads and checks the file and every file it names; throws a TenantsFileError listing every problem. */
    load(): TenantDefinition[];
    /** --tls-min-version and --cipher-suites for the tenants' own TLS contexts. */
    policy: TlsPolicyOptions;
    /** A token authenticator against the tenant's own kube-apiserver, and what closes its client. */
    tokenReview?(tenant: TenantDefinition): Promise<{ authenticator: TokenAuthenticator; release: () => void }>;
  };
  /**
   * `--workers`: this server is worker `index` of several (docs/multi-tenant.md,
   * "Workers"). It binds no TCP port: the primary hands it connections
   * (adopt*), and it serves only the tenants `owner` gives it, relaying a
   * connection it recognised as another worker's tenant to that worker.
   */
  worker?: WorkerPlace;
}

/** A listener of one door beside the frontend: a Unix socket or plain TCP (docs/frontends.md). */
export interface ExtraFrontendListener {
  mode: FrontendMode;
  /** What names it in errors: the flags that made it ("--socks5-port"). */
  flags: string;
  uds?: UnixSocketOptions;
  plain?: { host: string; port: number };
}

export interface ServerStats {
  agents: number;
  frontendStreams: number;
  agentTunnels: (TunnelStats & { agentID: string; credential: string; tenant?: string })[];
  frontendTunnels: TunnelStats[];
}
