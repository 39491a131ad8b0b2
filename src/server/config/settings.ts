/**
 * `kanal server`'s settings, each declared once (src/settings/setting.ts):
 * upstream's names where the meaning matches (docs/upstream-flags.md).
 * Checks that tie several settings together are in config.ts.
 */
import { DEFAULT_RESUME_TIMEOUT_MS } from '../../tunnel/resume-timeout.js';
import os from 'node:os';
import { randomUUID } from 'node:crypto';
import { UsageError } from '../../common/usage-error.js';
import { parseHostPort } from '../../common/host-port.js';
import {
  choice,
  count,
  countOrAuto,
  duration,
  durationOrOff,
  listOf,
  optionalText,
  port,
  setting,
  text,
  toggle,
} from '../../settings/kinds.js';
import { durationFlag, namedFlag } from '../../settings/checks.js';
import { processSettings } from '../../settings/process-settings.js';
import { oneClusterOnly, perTenant, processAndTenant } from '../../settings/scope.js';
import { klogFlags, serverIgnoredFlags } from '../../settings/upstream-flags.js';
import type { GivenOf, ValuesOf } from '../../settings/setting.js';
import { flagNames } from '../../settings/flag-names.js';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../../transport/liveness.js';
import { auditSettings } from '../../audit/settings.js';
import { transportSettings } from '../../transport/settings.js';
import { tunnelSettings, LIMITS } from '../../tunnel/settings.js';
import { httpPortSettings } from '../../settings/http-port-settings.js';
import { DEFAULT_CP_TO_NODE_CONNECTIONS, DEFAULT_LIMITS, DEFAULT_NODE_TO_CP_CONNECTIONS } from '../../tunnel/limits.js';
import { kubeRateSettings, kubeSettings, leaseLabelsSetting, LEASES } from '../../kube/settings.js';
import { parseEku, parseSubjectPattern } from '../identity/client-roles.js';
import { FRONTEND_MODES } from '../listeners.js';
import { parseDirectRoute } from '../clients/direct-routes-entry.js';
import { parseProxyStrategies, PROXY_STRATEGIES } from '../routing/proxy-strategies.js';
import { cipherSuitesFlag, minVersionFlag } from './tls-flags.js';
import { fileModeFlag, groupFlag } from './unix-socket-flags.js';
import { DEFAULT_AGENT_KEEPALIVE } from '../server-options.js';
import { DEFAULT_AGENT_RETAINED_BYTES, DEFAULT_TENANT_RETAINED_BYTES } from '../../domain/retention-ledger.js';
import type { HelpGroup } from '../../settings/groups.js';

/** `--backend-dial-timeout`'s default, also what upstream's 0 ("no timeout") becomes. */
export const DEFAULT_BACKEND_DIAL_TIMEOUT = '10s';

const IDENTITY = 'Server identity and HA';
const AGENTS = 'Agent port';
const AUTH = 'Agent authentication';
const FRONTEND = "Frontend (the kube-apiserver's side)";
const ROUTING = 'Routing and dials';
const PORTS = 'Health and admin ports';

/** A repeatable certificate pin: each value parsed by `parse`, a mistake named with the flag. */
function pins<T>(describe: string, group: HelpGroup, parse: (text: string) => T) {
  return listOf({
    describe,
    group,
    item: (v, flag) => namedFlag(flag, () => parse(v), ' '),
  });
}

/**
 * Each entry's scope (setting.ts, Scope) says where its value holds: a
 * tenant's own (perTenant), the process's and a tenant's (processAndTenant),
 * one cluster's only (oneClusterOnly), else the process's.
 */
export const serverSettings = {
  'tenants-config': optionalText({
    describe:
      'Serve many clusters: the YAML file declaring each tenant, how its agents and kube-apiserver are recognised and its settings (docs/multi-tenant.md); re-read when it changes and on SIGHUP',
    group: IDENTITY,
  }),
  workers: countOrAuto({
    default: 1,
    min: 0,
    describe:
      "Worker processes (auto or 0: the cgroup's CPU quota, else one per core). One cluster: each worker is a server of its own to the agents (server ID suffixed -wN, --server-count multiplied), agents and kube-apiserver connections spread over them. With --tenants-config: the tenants are spread over them, each served whole by one. A worker that dies is started again alone",
    group: IDENTITY,
  }),
  'max-pending-client-hellos': count({
    default: 1024,
    min: 1,
    describe:
      'With --workers: connections the primary holds at once while it reads their TLS ClientHello (agent port and TCP frontend together, each for at most 15 s); a connection beyond it is closed at once and counted',
    group: IDENTITY,
  }),
  'max-pending-client-hellos-per-host': count({
    default: 64,
    min: 1,
    describe: 'With --workers: the same from one peer address, so one host cannot take every place of --max-pending-client-hellos',
    group: IDENTITY,
  }),
  'server-id': setting({
    type: 'string',
    describe: 'Unique ID of this server, sent to agents (default: $PROXY_SERVER_ID, else host name + random suffix)',
    group: IDENTITY,
    parse: (v: string | undefined): string => v || process.env.PROXY_SERVER_ID || `${os.hostname()}-${randomUUID().slice(0, 8)}`,
  }),
  'server-count': perTenant(
    setting({
      type: 'number',
      default: 1,
      describe: 'Number of proxy servers behind the agent address (HA); agents keep a tunnel to each',
      group: IDENTITY,
      parse: (v: number, flag) => {
        if (!Number.isInteger(v) || v < 1) throw new UsageError(`--${flag} must be a positive integer, got ${v}`);
        return v;
      },
    }),
  ),
  'agent-port': port({ default: 8091, allowZero: true, describe: 'Port agents connect to (mTLS gRPC)', group: AGENTS }),
  'agent-bind-address': text({ default: '0.0.0.0', describe: 'Address the agent port listens on', group: AGENTS }),
  'cluster-cert': processAndTenant(
    optionalText({ describe: 'Certificate the agent port presents (default: --server-cert)', group: AGENTS }),
  ),
  'cluster-key': processAndTenant(optionalText({ describe: 'Key for --cluster-cert (default: --server-key)', group: AGENTS })),
  'cluster-ca-cert': perTenant(
    optionalText({
      describe:
        'CA that signs agent client certificates; agents without a valid one are refused (with token authentication: required as well)',
      group: AUTH,
    }),
  ),
  'allow-unauthenticated-agents': oneClusterOnly(
    toggle({
      describe: 'Accept agents without a valid client certificate (insecure; upstream default); they are told apart by peer address',
      group: AUTH,
    }),
  ),
  'agent-namespace': perTenant(
    optionalText({
      describe: "Token authentication: namespace of the agents' service account (with --agent-service-account, --authentication-audience)",
      group: AUTH,
    }),
  ),
  'agent-service-account': perTenant(
    optionalText({
      describe: "Token authentication: the agents' service account; every agent stream needs its token (see docs/kubernetes-api.md)",
      group: AUTH,
    }),
  ),
  'authentication-audience': perTenant(
    optionalText({
      describe: "Token authentication: audience the agents' tokens must be for, e.g. system:konnectivity-server",
      group: AUTH,
    }),
  ),
  ...kubeSettings,
  kubeconfig: perTenant(kubeSettings.kubeconfig),
  'kube-api-content-type': processAndTenant(kubeSettings['kube-api-content-type']),
  ...kubeRateSettings,
  'kubeconfig-qps': processAndTenant(kubeRateSettings['kubeconfig-qps']),
  'kubeconfig-burst': processAndTenant(kubeRateSettings['kubeconfig-burst']),
  'enable-lease-controller': oneClusterOnly(
    toggle({
      describe: "Publish this server's Lease (renewed every 15s, 30s long) and delete expired ones, so agents can count servers",
      group: LEASES,
    }),
  ),
  'lease-label': oneClusterOnly(leaseLabelsSetting),
  'max-agents-per-credential': perTenant(
    count({
      default: 1,
      describe:
        'Agents (distinct agentIDs) one credential may hold on this server; raise it only for a credential shared by several agents (see docs/trust-model.md)',
      group: AUTH,
    }),
  ),
  'agent-client-subject': perTenant(
    pins(
      'Agent client certificates must have this subject attribute, e.g. O=system:nodes or CN=node-* (repeatable; needed when agents and the frontend trust one CA)',
      AUTH,
      parseSubjectPattern,
    ),
  ),
  'agent-client-eku': perTenant(
    pins(
      'Agent client certificates must carry this extended key usage OID (repeatable; alternative to --agent-client-subject)',
      AUTH,
      parseEku,
    ),
  ),
  'frontend-client-subject': perTenant(
    pins(
      'The frontend client certificate (the kube-apiserver) must have this subject attribute, e.g. CN=kube-apiserver (repeatable)',
      FRONTEND,
      parseSubjectPattern,
    ),
  ),
  'frontend-client-eku': perTenant(
    pins('The frontend client certificate must carry this extended key usage OID (repeatable)', FRONTEND, parseEku),
  ),
  'keepalive-time': setting({
    type: 'string',
    default: `${DEFAULT_AGENT_KEEPALIVE.intervalMs / 1000}s`,
    describe: 'How often the server PINGs each agent connection; an agent that does not answer within 2s is avoided for dials',
    group: AGENTS,
    parse: (v: string, flag) => {
      const ms = durationFlag(flag, v);
      if (ms < MIN_KEEPALIVE_INTERVAL_MS) throw new UsageError(`--${flag} must be at least ${MIN_KEEPALIVE_INTERVAL_MS / 1000}s`);
      return ms;
    },
  }),
  'keepalive-timeout': duration({
    default: `${DEFAULT_AGENT_KEEPALIVE.timeoutMs / 1000}s`,
    describe: 'An agent connection whose PING stays unanswered this long is closed',
    group: AGENTS,
  }),
  'resume-timeout': durationOrOff({
    default: `${DEFAULT_RESUME_TIMEOUT_MS / 1000}s`,
    describe:
      'How long the connections of a lost agent tunnel wait for the agent to resume it on a new stream (Kanal agents only); 0 closes them at once',
    group: AGENTS,
  }),
  mode: choice({
    choices: FRONTEND_MODES,
    default: FRONTEND_MODES[0],
    describe: 'Frontend protocol(s) for the kube-apiserver; "both" tells them apart per connection',
    group: FRONTEND,
  }),
  'uds-name': perTenant(optionalText({ describe: 'Serve the frontend on this Unix socket instead of TCP', group: FRONTEND })),
  // Upstream's default (true): its manifests rely on it across restarts; Kanal removes only a stale socket (docs/frontends.md).
  'delete-existing-uds-file': perTenant(
    toggle({
      default: true,
      describe: 'Remove a stale socket at --uds-name before listening (never a file of another kind, nor a socket a live process serves)',
      group: FRONTEND,
    }),
  ),
  'uds-mode': perTenant(
    setting({
      type: 'string',
      default: '0660',
      describe: 'Permission bits of the --uds-name socket, set before anyone can reach it (the umask does not apply)',
      group: FRONTEND,
      parse: (v: string, flag) => fileModeFlag(flag, v),
    }),
  ),
  'uds-group': perTenant(
    setting({
      type: 'string',
      describe: "Group (name or ID) of the --uds-name socket (default: the server's group)",
      group: FRONTEND,
      parse: (v: string | undefined, flag) => (v === undefined ? undefined : groupFlag(flag, v)),
    }),
  ),
  'frontend-clients-config': oneClusterOnly(
    optionalText({
      describe:
        "YAML file with a clients: list: each frontend client's identity (certificate subject, uid, token file, service account) and the destinations it may reach (docs/frontends.md); re-read when it changes and on SIGHUP; absent: the kube-apiserver alone, reaching everything",
      group: FRONTEND,
    }),
  ),
  'frontend-header-timeout': duration({
    default: '30s',
    describe:
      'Time a frontend client has from connecting to the end of its request head (CONNECT headers, or the HTTP/2 preface); then 408 and closed',
    group: FRONTEND,
  }),
  'http-proxy-port': oneClusterOnly(
    port({
      default: 0,
      allowZero: true,
      describe:
        'Plain-TCP port (no TLS) of the HTTP door: forward proxy and CONNECT for clients without a certificate (Prometheus); 0: off',
      group: FRONTEND,
    }),
  ),
  'http-proxy-bind-address': oneClusterOnly(
    text({
      default: '127.0.0.1',
      describe: 'Address the --http-proxy-port listens on: loopback, or a pod IP only the clients can reach (no TLS)',
      group: FRONTEND,
    }),
  ),
  'server-port': port({ default: 8090, allowZero: true, describe: 'Frontend TCP port (mTLS); ignored with --uds-name', group: FRONTEND }),
  'server-bind-address': text({ default: '0.0.0.0', describe: 'Address the frontend TCP port listens on', group: FRONTEND }),
  // SOCKS5's own listeners (docs/frontends.md, "SOCKS5"): off unless asked for; one cluster's (a tenants file gives no tenant a port).
  'socks5-port': oneClusterOnly(
    port({
      default: 0,
      allowZero: true,
      describe:
        'Serve SOCKS5 (RFC 1928, CONNECT) on this plain-TCP port (0: off); a client is admitted by the token in its RFC 1929 password, else by its address',
      group: FRONTEND,
    }),
  ),
  'socks5-bind-address': oneClusterOnly(
    text({ default: '127.0.0.1', describe: 'Address the --socks5-port listener binds: loopback, or a pod IP', group: FRONTEND }),
  ),
  'socks5-uds-name': oneClusterOnly(
    optionalText({
      describe:
        "Serve SOCKS5 on this Unix socket (besides or instead of --socks5-port); a client without authentication is known by its uid, so the socket file's permissions decide who may connect (--delete-existing-uds-file applies)",
      group: FRONTEND,
    }),
  ),
  // Owner only: a client that chooses no authentication is let in by the file's permissions alone; 0660 with --socks5-uds-group opens it to a group.
  'socks5-uds-mode': oneClusterOnly(
    setting({
      type: 'string',
      default: '0600',
      describe: 'Permission bits of the --socks5-uds-name socket, set before anyone can reach it (the umask does not apply)',
      group: FRONTEND,
      parse: (v: string, flag) => fileModeFlag(flag, v),
    }),
  ),
  'socks5-uds-group': oneClusterOnly(
    setting({
      type: 'string',
      describe: "Group (name or ID) of the --socks5-uds-name socket (default: the server's group)",
      group: FRONTEND,
      parse: (v: string | undefined, flag) => (v === undefined ? undefined : groupFlag(flag, v)),
    }),
  ),
  'server-cert': optionalText({ describe: 'Frontend TLS certificate', group: FRONTEND }),
  'server-key': optionalText({ describe: 'Frontend TLS key', group: FRONTEND }),
  'server-ca-cert': perTenant(
    optionalText({ describe: 'CA for kube-apiserver client certificates on the frontend (mTLS)', group: FRONTEND }),
  ),
  'proxy-strategies': perTenant(
    setting({
      type: 'string',
      default: 'default',
      describe: `Ordered, comma-separated ways to pick an agent for a dial: ${PROXY_STRATEGIES.join(', ')} (see docs/routing.md)`,
      group: ROUTING,
      parse: (v: string, flag) => namedFlag(flag, () => parseProxyStrategies(v)),
    }),
  ),
  'tls-min-version': setting({
    type: 'string',
    default: '',
    describe: 'Oldest TLS version the agent port and TCP frontend accept: VersionTLS12 (default) or VersionTLS13',
    group: AGENTS,
    parse: (v: string, flag) => minVersionFlag(v, flag),
  }),
  'cipher-suites': setting({
    type: 'string',
    array: true,
    default: [] as readonly string[],
    describe: "TLS 1.2 cipher suites allowed, Go names, comma-separated (default: Node's list); no effect on TLS 1.3",
    group: AGENTS,
    parse: (v: readonly string[], flag) => cipherSuitesFlag(v, flag),
  }),
  'backend-dial-timeout': perTenant(
    setting({
      type: 'string',
      default: DEFAULT_BACKEND_DIAL_TIMEOUT,
      describe: 'How long a dial through an agent may take (then HTTP 504); 0 (upstream: no timeout) keeps 10s',
      group: ROUTING,
      parse: (v: string, flag): { ms: number; notice?: string } => {
        // Upstream's 0 waits for ever; every wait in Kanal is bounded.
        if (!/^0+(\.0*)?[a-z]*$/.test(v)) return { ms: durationFlag(flag, v) };
        return {
          ms: durationFlag(flag, DEFAULT_BACKEND_DIAL_TIMEOUT),
          notice: `--${flag} ${v}: upstream's "no timeout" is not offered; using ${DEFAULT_BACKEND_DIAL_TIMEOUT}`,
        };
      },
    }),
  ),
  'allowed-destination': perTenant(
    listOf({
      describe: 'host:port agents may reach through this server (repeatable; none = deny all)',
      group: ROUTING,
      item: (v, flag) => {
        return namedFlag(flag, () => {
          parseHostPort(v);
          return v;
        });
      },
    }),
  ),
  'direct-route': perTenant(
    listOf({
      describe:
        "A destination on the control plane's network the server dials itself instead of through an agent: CIDR[:PORT] (IPv6 in brackets: [fd00::/64]:443), NAME[:PORT] or *.SUFFIX[:PORT]; no port: any; names resolved by the server's resolver, dialled within --destination-dial-timeout (repeatable; none: every frontend dial goes through an agent)",
      group: ROUTING,
      item: (v, flag) => namedFlag(flag, () => parseDirectRoute(v).text),
    }),
  ),
  'destination-dial-timeout': perTenant(
    duration({ default: '10s', describe: 'Timeout for dials to allowed destinations and direct routes', group: ROUTING }),
  ),
  'health-port': port({ default: 8092, allowZero: true, describe: 'Port for /healthz, /readyz and /metrics (0 disables)', group: PORTS }),
  'health-bind-address': text({ default: '0.0.0.0', describe: 'Address the health port listens on', group: PORTS }),
  'admin-port': port({
    default: 8095,
    allowZero: true,
    describe: 'Port for /metrics and, with --enable-profiling, profiles (0 disables)',
    group: PORTS,
  }),
  'admin-bind-address': text({ default: '127.0.0.1', describe: 'Address the admin port listens on', group: PORTS }),
  'enable-profiling': toggle({
    describe:
      'Serve CPU profiles and heap snapshots on the admin port, when it listens on loopback (a heap snapshot holds every secret of the process; see docs/operations.md)',
    group: PORTS,
  }),
  'health-metrics': choice({
    choices: ['auto', 'any', 'loopback'] as const,
    default: 'auto',
    describe:
      'Who /metrics on the health port answers: any caller, or callers on this host only (the admin port serves it too). auto: loopback with --tenants-config, whose series name every tenant, else any (see docs/metrics.md)',
    group: PORTS,
  }),
  ...httpPortSettings,
  'max-message-size': setting({
    type: 'number',
    default: 4 * 1024 * 1024,
    describe: 'Largest gRPC message accepted, bytes',
    group: LIMITS,
    parse: (v: number, flag) => {
      if (!Number.isInteger(v) || v < 64 * 1024) throw new UsageError(`--${flag} must be at least 65536 bytes`);
      return v;
    },
  }),
  ...tunnelSettings,
  'max-connection-window': perTenant(tunnelSettings['max-connection-window']),
  'peer-read-timeout': perTenant(tunnelSettings['peer-read-timeout']),
  'max-node-to-cp-connections-per-agent': perTenant(
    count({
      default: DEFAULT_NODE_TO_CP_CONNECTIONS,
      describe:
        'Node -> control plane connections one agent (credential + agentID, all its tunnels) may hold (dialling or open); more are refused',
      group: LIMITS,
    }),
  ),
  'max-node-to-cp-connections': count({
    default: 0,
    min: 0,
    describe: 'Node -> control plane connections of all agents together (each holds a file descriptor); 0 = half the open-files limit',
    group: LIMITS,
  }),
  'max-cp-to-node-connections-per-agent': perTenant(
    count({
      default: DEFAULT_CP_TO_NODE_CONNECTIONS,
      describe: 'Control plane -> node connections through one agent (all its tunnels; dialling or open); more fail with 503',
      group: LIMITS,
    }),
  ),
  'max-pending-dials-per-agent': perTenant(
    count({
      default: DEFAULT_LIMITS.maxPendingDials,
      describe: 'Dials waiting for an answer on one agent (all its tunnels), in each direction; more are refused',
      group: LIMITS,
    }),
  ),
  'max-retained-bytes-per-agent': perTenant(
    count({
      default: DEFAULT_AGENT_RETAINED_BYTES,
      min: DEFAULT_LIMITS.windowBytes,
      describe:
        'Bytes one agent (credential + agentID) may keep for resends over all its tunnels, detached and lingering ones included (resume); at the cap its connections stop reading until it acknowledges',
      group: LIMITS,
    }),
  ),
  'max-retained-bytes-per-tenant': perTenant(
    count({
      default: DEFAULT_TENANT_RETAINED_BYTES,
      min: DEFAULT_LIMITS.windowBytes,
      describe: 'The same for all agents of the tenant (of the server without --tenants-config) together',
      group: LIMITS,
    }),
  ),
  'memory-budget': count({
    default: 0,
    min: 0,
    describe:
      'Bytes all connections may hold together (resend buffers, queues); past it the agent that holds the most has its connections closed. 0: half the cgroup memory limit, else a quarter of the machine memory',
    group: LIMITS,
  }),
  'dial-rate-per-agent': perTenant(
    count({
      default: DEFAULT_LIMITS.dialRate,
      min: 0,
      describe:
        'Dials per second through one agent (all its tunnels; a reconnect does not refill it), in each direction; more are refused at once as throttled (0: no rate limit)',
      group: LIMITS,
    }),
  ),
  'dial-burst-per-agent': perTenant(
    count({
      default: DEFAULT_LIMITS.dialBurst,
      describe: 'Dials one agent (all its tunnels) may make at once, in each direction, before --dial-rate-per-agent paces them',
      group: LIMITS,
    }),
  ),
  ...transportSettings,
  ...auditSettings,
  'log-level': processSettings['log-level'],
  'logging-format': processSettings['logging-format'],
  ...klogFlags,
  'dry-run': processSettings['dry-run'],
  ...serverIgnoredFlags,
} as const;

/** What the server's command line gives, by flag name. */
export type ServerGiven = GivenOf<typeof serverSettings>;
/** Each server setting parsed. */
export type ServerSettings = ValuesOf<typeof serverSettings>;

/** `kanal server`'s flags as its messages spell them, typed by the table: FLAG['uds-name'] is '--uds-name'. */
export const FLAG = flagNames(serverSettings);
