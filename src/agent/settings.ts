/**
 * `kanal agent`'s settings, each declared once (src/settings/setting.ts):
 * upstream's names where the meaning matches (docs/upstream-flags.md).
 * Checks that tie several settings together are in config.ts.
 */
import os from 'node:os';
import { isIP } from 'node:net';
import { UsageError } from '../common/usage-error.js';
import { isValidHost, parsePort, type HostPort } from '../common/host-port.js';
import { durationFlag, namedFlag } from '../settings/checks.js';
import { choice, count, duration, durationOrOff, listOf, optionalText, port, setting, text, toggle } from '../settings/kinds.js';
import { processSettings } from '../settings/process-settings.js';
import { agentIgnoredFlags, klogFlags } from '../settings/upstream-flags.js';
import type { GivenOf, ValuesOf } from '../settings/setting.js';
import { flagNames } from '../settings/flag-names.js';
import { parseAgentIdentifiers } from '../wire/agent-identifiers.js';
import { auditSettings } from '../audit/settings.js';
import { transportSettings } from '../transport/settings.js';
import { tunnelSettings, LIMITS } from '../tunnel/settings.js';
import { httpPortSettings } from '../settings/http-port-settings.js';
import { DEFAULT_CP_TO_NODE_CONNECTIONS, DEFAULT_LIMITS, DEFAULT_NODE_TO_CP_CONNECTIONS } from '../tunnel/limits.js';
import { kubeSettings, leaseSelectorSetting, LEASES } from '../kube/settings.js';
import { INTERFACE_TYPES } from './host-interface-manager.js';
import { parseServerCountSource, SERVER_COUNT_SOURCES } from './server-count.js';
import { parseTarget } from './target.js';
import { parseServerHosts } from './server-addresses.js';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../transport/liveness.js';
import { DEFAULT_RESUME_TIMEOUT_MS } from '../tunnel/resume-timeout.js';

const SERVER = 'Proxy server';
const AUTH = 'Authentication';
const DIALS = 'Dials and reconnects';
const NODE = 'Node -> control plane (KEP-2025)';
const PORTS = 'Health and admin ports';

/** `--cluster-dns IP[:PORT]`: an address, since the resolver must not need a resolver. */
function parseClusterDns(v: string, flag: string): HostPort {
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(v);
  const colon = v.lastIndexOf(':');
  const [host, portText] = bracketed
    ? [bracketed[1], bracketed[2]]
    : isIP(v) !== 0 || colon < 0
      ? [v, undefined]
      : [v.slice(0, colon), v.slice(colon + 1)];
  if (isIP(host) === 0)
    throw new UsageError(`--${flag} ${JSON.stringify(v.slice(0, 80))}: expected the DNS Service's IP address, with :PORT if not 53`);
  try {
    return { host, port: portText === undefined ? 53 : parsePort(portText, `--${flag} port`) };
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
}

/** Default agent ID: the host name, which is stable across restarts and readable in server logs. */
export function defaultAgentID(): string {
  return os.hostname().toLowerCase();
}

export const agentSettings = {
  'proxy-server-host': setting({
    type: 'string',
    array: true,
    describe:
      'Proxy server host name or address (repeatable or comma-separated; host:port for a port of its own). One address: the servers behind it (a load balancer) get a tunnel each, as many as they count; several, or a name with several addresses: a tunnel through each (docs/ha.md)',
    group: SERVER,
    parse: (v: readonly string[] | undefined, flag) => parseServerHosts(v ?? [], flag),
  }),
  'proxy-server-port': port({
    default: 8091,
    allowZero: false,
    describe: 'Agent port of the proxy servers (for each --proxy-server-host without its own)',
    group: SERVER,
  }),
  'ca-cert': setting({
    type: 'string',
    describe: 'CA that signed the proxy server certificate',
    group: SERVER,
    parse: (v: string | undefined, flag): string => {
      if (!v) throw new UsageError(`--${flag} is required: the agent always verifies the proxy server`);
      return v;
    },
  }),
  'tls-server-name': optionalText({
    describe: 'Name to verify the server certificates against (default: the --proxy-server-host each address came from)',
    group: SERVER,
  }),
  'alpn-proto': setting({
    type: 'string',
    array: true,
    default: [] as readonly string[],
    describe: 'ALPN protocol offered before h2, for a front that routes by it (repeatable or comma-separated)',
    group: SERVER,
    parse: (v: readonly string[], flag): string[] => {
      const protocols = v.flatMap((p) => p.split(',')).filter((p) => p !== '');
      // RFC 7301, section 3.1: a protocol name is 1-255 bytes.
      for (const p of protocols) {
        if (p.length > 255 || !/^[\x21-\x7e]+$/.test(p))
          throw new UsageError(`--${flag} ${JSON.stringify(p.slice(0, 40))}: 1-255 printable characters without spaces`);
      }
      return protocols;
    },
  }),
  'agent-cert': optionalText({ describe: 'Client certificate presented to the server (mTLS)', group: AUTH }),
  'agent-key': optionalText({ describe: 'Key for --agent-cert', group: AUTH }),
  'service-account-token-path': optionalText({
    describe: 'File with the service account token sent to the server (read afresh on every connect; projected tokens rotate)',
    group: AUTH,
    check: (v, flag) => {
      if (v === '') throw new UsageError(`--${flag} must not be empty`);
    },
  }),
  'agent-id': setting({
    type: 'string',
    describe: 'ID announced to the server (default: $PROXY_AGENT_ID, else this host name)',
    group: AUTH,
    parse: (v: string | undefined, flag): string => {
      const id = v ?? (process.env.PROXY_AGENT_ID || defaultAgentID());
      if (!id || /\s/.test(id)) throw new UsageError(`--${flag} must be non-empty without spaces, got ${JSON.stringify(id)}`);
      return id;
    },
  }),
  'agent-identifiers': text({
    default: '',
    describe:
      "What this agent serves, for the server's --proxy-strategies: a URL query of host, ipv4, ipv6, cidr and default-route, e.g. host=node1&ipv4=10.0.0.5&cidr=10.244.1.0/24 (see docs/routing.md)",
    group: AUTH,
    check: (v, flag) => {
      namedFlag(flag, () => parseAgentIdentifiers(v));
    },
  }),
  'count-server-leases': toggle({
    describe: 'Count the proxy servers by their Leases (servers run --enable-lease-controller) and hold a tunnel to each',
    group: LEASES,
  }),
  ...kubeSettings,
  'lease-label': leaseSelectorSetting,
  'server-count-source': setting({
    type: 'string',
    choices: SERVER_COUNT_SOURCES,
    default: 'default',
    describe: '"default": the lease count with --count-server-leases, else the servers\' serverCount; "max": the larger of the two',
    group: LEASES,
    parse: (v: string) => parseServerCountSource(v),
  }),
  'sync-forever': toggle({
    describe: 'With every tunnel up, still connect once per --sync-interval-cap to learn of new servers',
    group: LEASES,
  }),
  'dial-timeout': duration({ default: '10s', describe: 'Timeout for dials the server asks for', group: DIALS }),
  'cluster-dns': setting({
    type: 'string',
    describe:
      "The cluster's DNS Service (IP[:PORT], port 53 by default) that resolves the names the server asks for ending in .svc or the --cluster-domain; without it, the system resolver resolves every name (docs/frontends.md)",
    group: DIALS,
    parse: (v: string | undefined, flag) => (v === undefined || v === '' ? undefined : parseClusterDns(v, flag)),
  }),
  'cluster-domain': text({
    default: 'cluster.local',
    describe: "The cluster's DNS domain: NAME.svc is asked of --cluster-dns as NAME.svc.<this>, and so is every name ending in it",
    group: DIALS,
    check: (v, flag) => {
      if (!isValidHost(v) || isIP(v) !== 0) throw new UsageError(`--${flag} ${JSON.stringify(v.slice(0, 80))} is not a DNS domain`);
    },
  }),
  'sync-interval': duration({
    default: '1s',
    describe: 'Reconnect interval (with jitter) after a failed connect, and while servers behind one address are missing',
    group: DIALS,
  }),
  'sync-interval-cap': duration({
    default: '30s',
    describe: 'Longest reconnect delay, reached after this long of failures; also how often host names are resolved again',
    group: DIALS,
  }),
  'connect-timeout': duration({ default: '10s', describe: 'Timeout for opening a tunnel to a server', group: DIALS }),
  // 2 s + 5 s: a dead tunnel is noticed within 7 s (docs/ha.md, "Liveness"); an upstream server gets at most one PING per 35 s (its policy).
  'keepalive-time': setting({
    type: 'string',
    default: '2s',
    describe: "How often the agent PINGs each server connection (at least 1s; upstream's 1h); an upstream server at most every 35s",
    group: DIALS,
    parse: (v: string, flag) => {
      const ms = durationFlag(flag, v);
      if (ms < MIN_KEEPALIVE_INTERVAL_MS) throw new UsageError(`--${flag} must be at least ${MIN_KEEPALIVE_INTERVAL_MS / 1000}s`);
      return ms;
    },
  }),
  'keepalive-timeout': duration({
    default: '5s',
    describe: 'A server connection that receives nothing this long after a PING (no answer, no data) is closed, and the agent reconnects',
    group: DIALS,
  }),
  'resume-timeout': durationOrOff({
    default: `${DEFAULT_RESUME_TIMEOUT_MS / 1000}s`,
    describe:
      'How long the connections of a lost tunnel wait for it to resume on a new stream to the same server (Kanal servers only); 0 closes them at once',
    group: DIALS,
  }),
  'shutdown-grace-period': duration({
    default: '30s',
    describe: 'On SIGTERM: how long open connections may finish after DRAIN',
    group: DIALS,
  }),
  'health-server-port': port({
    default: 8093,
    allowZero: true,
    describe: 'Port for /healthz, /readyz and /metrics (0 disables)',
    group: PORTS,
  }),
  'health-bind-address': text({ default: '0.0.0.0', describe: 'Address the health port listens on', group: PORTS }),
  'health-server-host': optionalText({ describe: "Upstream's name for --health-bind-address (empty: all addresses)", group: PORTS }),
  'admin-server-port': port({
    default: 8094,
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
  ...httpPortSettings,
  'bind-address': optionalText({
    describe: 'Node -> control plane: the kube-apiserver advertise address to serve locally',
    group: NODE,
    check: (v, flag) => {
      if (isIP(v) === 0) throw new UsageError(`--${flag} ${JSON.stringify(v)} is not an IP address`);
    },
  }),
  target: listOf({
    describe: 'local_port:dst_host:dst_port forwarded to the control plane (repeatable)',
    group: NODE,
    item: (v, flag) => namedFlag(flag, () => parseTarget(v)),
  }),
  'bind-interface': text({
    default: 'kanal0',
    describe: 'Host-scoped interface that carries --bind-address',
    group: NODE,
    check: (v, flag) => {
      if (!/^[A-Za-z0-9_.-]{1,15}$/.test(v)) throw new UsageError(`--${flag} ${JSON.stringify(v)}: 1-15 letters, digits, '.', '_' or '-'`);
    },
  }),
  'bind-interface-type': choice({
    choices: INTERFACE_TYPES,
    default: 'dummy',
    describe: 'Kind of --bind-interface to create; "none" uses an existing address',
    group: NODE,
  }),
  'tunnel-wait-timeout': duration({
    default: '10s',
    describe: 'How long a node connection waits for a tunnel before it is closed',
    group: NODE,
  }),
  ...tunnelSettings,
  'max-cp-to-node-connections': count({
    default: DEFAULT_CP_TO_NODE_CONNECTIONS,
    describe: 'Control plane -> node connections this agent dials or holds per server (its tunnels together); more are refused',
    group: LIMITS,
  }),
  'max-node-to-cp-connections': count({
    default: DEFAULT_NODE_TO_CP_CONNECTIONS,
    describe:
      'Node -> control plane connections this agent dials or holds per server (its tunnels together); more are refused here, before they reach the server',
    group: LIMITS,
  }),
  'max-pending-dials': count({
    default: DEFAULT_LIMITS.maxPendingDials,
    describe: 'Dials waiting for an answer per server (its tunnels together), in each direction; more are refused',
    group: LIMITS,
  }),
  'dial-rate': count({
    default: DEFAULT_LIMITS.dialRate,
    min: 0,
    describe:
      'Dials per second per server (its tunnels and reconnects together), in each direction; more are refused at once as throttled, node -> control plane ones before they reach the server (0: no rate limit)',
    group: LIMITS,
  }),
  'dial-burst': count({
    default: DEFAULT_LIMITS.dialBurst,
    describe: 'Dials per server at once, in each direction, before --dial-rate paces them',
    group: LIMITS,
  }),
  ...transportSettings,
  ...auditSettings,
  'log-level': processSettings['log-level'],
  'logging-format': processSettings['logging-format'],
  ...klogFlags,
  'dry-run': processSettings['dry-run'],
  check: toggle({
    describe: 'Preflight: check credentials, the server (TLS + agent stream + targets) and netlink, print a pass/fail list, exit 0 or 1',
    group: 'Command',
  }),
  ...agentIgnoredFlags,
} as const;

/** What the agent's command line gives, by flag name. */
export type AgentGiven = GivenOf<typeof agentSettings>;
/** Each agent setting parsed. */
export type AgentSettings = ValuesOf<typeof agentSettings>;

/** `kanal agent`'s flags as its messages spell them, typed by the table: FLAG['agent-cert'] is '--agent-cert'. */
export const FLAG = flagNames(agentSettings);
