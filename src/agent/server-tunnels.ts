/**
 * Kanal proxy agent: keeps one tunnel to every proxy server, performs dials
 * the servers ask for, and drains gracefully on shutdown. The servers are
 * found two ways (docs/ha.md): behind one address (a load balancer: the
 * agent connects until it holds as many tunnels as the servers announce in
 * serverCount, or as --count-server-leases counts), or by name (several
 * addresses: --proxy-server-host repeated, or a name with several addresses;
 * one tunnel through each, each address with its own reconnect loop).
 */
import { ConnectionAuditor, type TunnelParty } from '../audit/connection-auditor.js';
import type { AuditSink } from '../audit/audit-record.js';
import { setMaxListeners } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { ClientKeepalive, ClientTlsOptions, Transport } from '../transport/transport.js';
import { Feature, formatFeatures, type FeatureSet } from '../wire/features.js';
import { MD_KANAL_FEATURES, type MetadataMap } from '../wire/metadata.js';
import type { TunnelLimitName, TunnelLimits } from '../tunnel/limits.js';
import type { InboundDial, Tunnel, TunnelStats } from '../tunnel/tunnel.js';
import { DialError } from '../tunnel/errors.js';
import { Backoff } from '../common/backoff.js';
import { dialTcp } from '../tunnel/tcp-dial.js';
import { formatHostPort, parseHostPort, type HostPort } from '../common/host-port.js';
import { startHealthServer, type HealthPortOptions, type HealthServer, type Readiness } from '../common/health-server.js';
import { connectToServer, type ServerConnection } from './server-connection.js';
import { ServerAddresses, type LookupAll, type ServerEndpoint } from './server-addresses.js';
import { ReconnectDelay } from './reconnect-delay.js';
import { KanalMetrics } from '../domain/metrics.js';
import { countTunnelLimit } from '../tunnel/limit-metrics.js';
import type { RefusalReasons } from '../tunnel/limit-reports.js';
import { registerUpstreamAgentMetrics, type UpstreamAgentEventMetrics } from '../domain/upstream-metrics.js';
import { serverCount, type ServerCount, type ServerCountSource } from './server-count.js';
import { errorMessage } from '../common/error-message.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { listenError } from '../common/listen-error.js';
import { diagnoseConnectError, type ConnectAttempt } from './connect-diagnosis.js';
import { refusedTargetMessage, type Target } from './target.js';
import { randomBytes } from 'node:crypto';
import { ResumeMetrics } from '../domain/resume-metrics.js';
import { DialAllowances } from '../tunnel/dial-allowances.js';
import { resolveLimits } from '../tunnel/limits.js';

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
  /** The agent's audit log (--audit-log-path); absent: none. */
  audit?: AuditSink;
  log: Logger;
}

export interface AgentStats {
  tunnels: (TunnelStats & { serverID: string; address: string; features: string })[];
}

/** ServerTunnels.snapshot(): read when asked, from the maps that hold the state. */
export interface AgentTunnelsSnapshot {
  state: AgentState;
  expected: ServerCount;
  /** The addresses dialled; `reachedHeld`: the server this one reached, held through another address. */
  endpoints: { target: string; name: string; lastError: string; reachedHeld: string | undefined }[];
  tunnels: { serverID: string; address: string; tunnel: Tunnel; detached: boolean }[];
}

/** A tunnel the agent holds, and the address it came through. */
interface HeldTunnel {
  conn: ServerConnection;
  /** The endpoint's target ("host:port") it was opened to. */
  address: string;
}

/**
 * One address the agent dials and its reconnect loop (maintainEndpoint).
 * Invariant: in `endpoints` exactly while the address is resolved; `removed`
 * is aborted when it leaves, after which its loop opens no more tunnels.
 */
interface EndpointState {
  readonly endpoint: ServerEndpoint;
  readonly removed: AbortController;
  /** Why its last connect failed, with the flag to change (connect-diagnosis.ts; '' once one succeeds). */
  lastError: string;
  /** The server its last connect reached while held through another address (by name: not dialled again until that tunnel goes). */
  reachedHeld: string | undefined;
}

/** What the one decision on a server just connected to did (ServerTunnels.settle). */
export type Settled = 'adopted' | 'already-held' | 'closed';

/**
 * Kanal servers accept a PING every few seconds (Node's nghttp2 and grpc-js
 * enforce no PING policy); upstream's grpc-go servers do not (transport.ts,
 * POLICED_PING_INTERVAL_MS). A server that answered kanal-features is Kanal.
 */
const acceptsFrequentPings = (responseMetadata: MetadataMap): boolean => (responseMetadata.get(MD_KANAL_FEATURES)?.length ?? 0) > 0;

const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);
/** A connect failure is logged when its cause changes, then at most once per this long with the count of the rest. */
const CONNECT_FAILURE_LOG_MS = 60_000;
/** Servers whose dial allowances the agent keeps (ServerTunnels.allowances); beyond, new ones share one. */
const MAX_SERVER_ALLOWANCES = 256;
const RESUMING_AGENT_FEATURES: FeatureSet = new Set([...AGENT_FEATURES, Feature.Resume]);

/** True when `err` (or an error it was caused by) is a TCP connection refused. */
function refusedConnection(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    if ((e as NodeJS.ErrnoException).code === 'ECONNREFUSED') return true;
  }
  return false;
}

/** On a tunnel to a server the agent performs control plane -> node dials (inbound) and requests node -> control plane ones. */
const SERVER_TUNNEL_REFUSALS: RefusalReasons = {
  maxPendingDials: 'pending_dials',
  maxInboundConnections: 'cp_to_node_connections',
  maxOutboundConnections: 'node_to_cp_connections',
  dialRate: 'throttled',
};
const SERVER_TUNNEL_LIMIT_FLAGS: Partial<Record<TunnelLimitName, string>> = {
  maxInboundConnections: '--max-cp-to-node-connections',
  maxOutboundConnections: '--max-node-to-cp-connections',
  maxPendingDials: '--max-pending-dials',
  dialRate: '--dial-rate',
  pauseReadingQueuedBytes: '--peer-read-timeout',
  maxQueuedBytes: '--peer-read-timeout',
  peerReadTimeoutMs: '--peer-read-timeout',
};

/**
 * Where a ServerTunnels is in its life; it only moves forward (transition()).
 * - created: nothing started; stop() has nothing to do.
 * - running: maintain() keeps a tunnel to every server; a tunnel lost is a warning and a
 *   server_connection_failure_count.
 * - draining: stop() sent DRAIN and opens no tunnel; the tunnels still serve dials until their
 *   connections end or the grace period does (a tunnel lost is expected: logged at info).
 * - stopped: every tunnel closed, maintain() returned, the health port closed.
 */
export type AgentState = 'created' | 'running' | 'draining' | 'stopped';

export class ServerTunnels {
  /** See AgentState; changed only by transition(). */
  private state: AgentState = 'created';
  /** Aborted on leaving 'running': wakes every loop from any wait so it sees the state. */
  private readonly stopping = new AbortController();
  /** maintain(), from start() until it returns (after leaving 'running' and every endpoint loop ended). */
  private loop: Promise<void> | undefined;
  /** Loops waiting for a change (a tunnel lost, the addresses changed); each is called once, then dropped. */
  private readonly waiters = new Set<() => void>();
  /** Tunnels up, by serverID: at most one per server; a tunnel leaves on its 'close' or 'detached'. */
  private readonly connections = new Map<string, HeldTunnel>();
  /** Tunnels whose stream was lost, waiting to resume (docs/protocol.md), by serverID; each leaves on its resume or 'close'. */
  private readonly detached = new Map<string, HeldTunnel>();
  /**
   * --dial-rate and the per-tunnel caps, per server (serverID) rather than
   * per stream: a reconnect to the same server starts with what its last
   * tunnel left (docs/limits.md). Servers a load balancer may show are few;
   * the table's bound is for a server that announces a new ID each time.
   */
  private readonly allowances = new DialAllowances({ maxEntries: MAX_SERVER_ALLOWANCES });
  /** This process, for the servers (MD_KANAL_INCARNATION). */
  private readonly incarnation = randomBytes(12).toString('base64url');
  private readonly resumeMetrics: ResumeMetrics;
  /** The addresses dialled, by target; changed only by reconcile(). */
  private readonly endpoints = new Map<string, EndpointState>();
  /** Endpoint loops running, removed addresses' too until they end. */
  private readonly endpointLoops = new Set<Promise<void>>();
  private readonly addresses: ServerAddresses;
  /** The transport, its channels PINGing as the options say. */
  private readonly transport: Transport;
  /** The serverCount header of the last server connected to (0: none yet). */
  private announcedServers = 0;
  /** What the servers' count was last found to be (updateExpected() only). */
  private expected: ServerCount = { count: 1, from: 'fallback to 1' };
  /** By name: the last "addresses vs count" disagreement logged ('' none), so each is logged once. */
  private countMismatch = '';
  /** Set by start() when a health port is configured; closed by stop(). */
  private health: HealthServer | undefined;
  private readonly listeners = new Set<(tunnel: Tunnel, change: 'up' | 'down') => void>();
  /** One warning per address and cause of connect failure, not one per retry (keys bounded by RateLimitedLog). */
  private readonly connectFailures: RateLimitedLog;
  /** More conditions /readyz requires besides a tunnel (e.g. the advertise address in place). */
  private readonly conditions: (() => Readiness)[] = [];

  readonly metrics = new KanalMetrics('agent');
  /** The log line and audit record of each ended connection and each dial either way that made none. */
  readonly auditor: ConnectionAuditor;
  /** Upstream's agent metrics updated as things happen (the lease counter feeds the lease ones). */
  readonly upstreamMetrics: UpstreamAgentEventMetrics;

  constructor(private readonly opts: ServerTunnelsOptions) {
    this.auditor = new ConnectionAuditor({
      side: 'agent',
      log: opts.log.child({ part: 'connections' }),
      ...(opts.audit ? { sink: opts.audit } : {}),
    });
    this.addresses = new ServerAddresses(opts.server.hosts, opts.lookup);
    this.connectFailures = new RateLimitedLog(opts.log, CONNECT_FAILURE_LOG_MS);
    const base = opts.transport;
    const keepalive: ClientKeepalive | undefined = opts.keepalive && { ...opts.keepalive, acceptsFrequentPings };
    this.transport = keepalive ? { ...base, createChannel: (o) => base.createChannel({ ...o, keepalive }) } : base;
    // A waiting loop per address listens on it (changeOrTimeout); as many as DNS gives addresses.
    setMaxListeners(0, this.stopping.signal);
    this.metrics.gauge('kanal_agent_tunnels', 'Tunnels up to proxy servers', () => this.connections.size);
    this.metrics.gauge(
      'kanal_agent_expected_servers',
      'Proxy servers the agent holds tunnels to: announced by serverCount, or counted by leases; by name, the addresses dialled',
      () => this.target(),
    );
    this.metrics.gauge('kanal_agent_connections_open', 'Tunnelled connections open', () => this.openConnections());
    this.metrics.gauge(
      'kanal_agent_window_growth_bytes',
      'Receive-window growth (beyond the first window) held by tunnelled connections',
      () => {
        let n = 0;
        for (const { conn } of this.connections.values()) n += conn.tunnel.stats().windowGrowthBytes;
        return n;
      },
    );
    this.resumeMetrics = new ResumeMetrics(this.metrics, {
      detached: () => ({
        tunnels: this.detached.size,
        connections: [...this.detached.values()].reduce((n, h) => n + h.conn.tunnel.stats().connections, 0),
      }),
      retainedBytes: () => [...this.connections.values(), ...this.detached.values()].reduce((n, h) => n + h.conn.tunnel.retainedBytes(), 0),
    });
    this.upstreamMetrics = registerUpstreamAgentMetrics(this.metrics.registry, {
      serverConnections: () => this.connections.size,
      knownServers: () => this.expected.count,
      endpointConnections: () => this.openConnections(),
    });
  }

  get healthPort(): number {
    return this.health?.port ?? 0;
  }

  /** Tunnels currently up, one per server. */
  tunnels(): Tunnel[] {
    return [...this.connections.values()].map(({ conn }) => conn.tunnel);
  }

  onTunnelChange(listener: (tunnel: Tunnel, change: 'up' | 'down') => void): void {
    this.listeners.add(listener);
  }

  /** Makes /readyz also require `condition` (its detail is appended either way). */
  addReadinessCondition(condition: () => Readiness): void {
    this.conditions.push(condition);
  }

  readiness(): Readiness {
    const tunnels = this.tunnelReadiness();
    const all = [tunnels, ...this.conditions.map((c) => c())];
    return { ready: all.every((r) => r.ready), detail: all.map((r) => r.detail).join('; ') };
  }

  private tunnelReadiness(): Readiness {
    const n = this.connections.size;
    if (n === 0) {
      const lastError = [...this.endpoints.values()].map((e) => e.lastError).find((e) => e !== '');
      return { ready: false, detail: `no tunnel to a proxy server${lastError ? ` (last error: ${lastError})` : ''}` };
    }
    const byName = this.byName();
    // Behind one address every tunnel shares it; by name each names its own.
    const held = [...this.connections].map(([serverID, h]) => (byName ? `${serverID} (${h.address})` : serverID));
    let detail = `${n}/${this.target()} server tunnel(s) up: ${held.join(', ')}`;
    if (byName) detail += this.addressesReadiness();
    // Still ready (control plane -> node works, and the other targets), but say which targets a server refuses.
    for (const { conn } of this.connections.values())
      for (const t of this.refusedTargets(conn)) detail += `; ${refusedTargetMessage(t, conn.serverID)}`;
    // Still ready (control plane -> node works), but say when the node -> control plane direction is not.
    if (!(this.opts.features ?? AGENT_FEATURES).has(Feature.NodeDial)) return { ready: true, detail };
    const without = [...this.connections.values()]
      .filter(({ conn }) => !conn.tunnel.features.has(Feature.NodeDial))
      .map(({ conn }) => conn.serverID);
    if (without.length === 0) return { ready: true, detail };
    const note =
      without.length === n
        ? 'node -> control plane dials unavailable: no connected server supports them (upstream Konnectivity?)'
        : `node -> control plane dials unavailable through ${without.join(', ')} (server does not support them)`;
    return { ready: true, detail: `${detail}; ${note}` };
  }

  /** By name: the addresses without a tunnel and why, and a count the servers give that differs. */
  private addressesReadiness(): string {
    const through = new Set([...this.connections.values()].map((h) => h.address));
    const notes: string[] = [];
    for (const e of this.endpoints.values()) {
      if (through.has(e.endpoint.target)) continue;
      const held = e.reachedHeld && this.connections.get(e.reachedHeld);
      if (held) notes.push(`${e.endpoint.target} reaches ${e.reachedHeld}, held through ${held.address}`);
      else notes.push(`no tunnel through ${e.endpoint.target}${e.lastError ? ` (last error: ${e.lastError})` : ''}`);
    }
    if (this.countMismatch) notes.push(this.countMismatch);
    return notes.map((note) => `; ${note}`).join('');
  }

  stats(): AgentStats {
    return {
      tunnels: [...this.connections.values()].map(({ conn, address }) => ({
        serverID: conn.serverID,
        address,
        features: formatFeatures(conn.tunnel.features),
        ...conn.tunnel.stats(),
      })),
    };
  }

  /** Where the agent is, its addresses and its tunnels (up and detached), for the admin port's /status (agent-status.ts). */
  snapshot(): AgentTunnelsSnapshot {
    const held = (detached: boolean) => (h: HeldTunnel) => ({
      serverID: h.conn.serverID,
      address: h.address,
      tunnel: h.conn.tunnel,
      detached,
    });
    return {
      state: this.state,
      expected: { ...this.expected },
      endpoints: [...this.endpoints.values()].map((e) => ({
        target: e.endpoint.target,
        name: e.endpoint.name,
        lastError: e.lastError,
        reachedHeld: e.reachedHeld !== undefined && this.connections.has(e.reachedHeld) ? e.reachedHeld : undefined,
      })),
      tunnels: [...[...this.connections.values()].map(held(false)), ...[...this.detached.values()].map(held(true))],
    };
  }

  /** Moves from one of `from` to `to`; false (and no change) from any other state. */
  private transition(from: readonly AgentState[], to: AgentState): boolean {
    if (!from.includes(this.state)) return false;
    this.state = to;
    if (to !== 'running') this.stopping.abort();
    return true;
  }

  async start(): Promise<void> {
    if (this.state !== 'created') throw new Error(`the agent cannot start when ${this.state}`);
    const health = this.opts.health;
    if (health) {
      try {
        this.health = await startHealthServer({
          ...health,
          readiness: () => this.readiness(),
          registry: this.metrics.registry,
          onRefusal: (reason) => this.metrics.refusals.inc({ reason }),
          log: this.opts.log,
        });
      } catch (err) {
        throw listenError(err, formatHostPort(health), '--health-bind-address, --health-server-port');
      }
    }
    // stop() during the await above found nothing started yet: the health port is all there is.
    if (!this.transition(['created'], 'running')) {
      await this.health?.close();
      return;
    }
    this.loop = this.maintain();
    this.opts.log.info({ servers: this.opts.server.hosts.map((h) => formatHostPort(h)) }, 'kanal agent started');
  }

  /**
   * Graceful stop: DRAIN to every server, keep serving the dials they still
   * send (DRAIN means "prefer other agents", as upstream's agent does: a
   * server with no other agent left keeps using this one), wait for open
   * connections to finish (at most graceMs), then close everything.
   */
  async stop(graceMs: number): Promise<void> {
    if (!this.transition(['running'], 'draining')) {
      // Not started, or start() still opening the health port (it sees 'stopped' and closes it); or stopping already.
      this.transition(['created'], 'stopped');
      return;
    }
    for (const { conn } of this.connections.values()) conn.tunnel.sendDrain();
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && this.inFlight() > 0) await sleep(50);
    const left = this.inFlight();
    if (left > 0) this.opts.log.warn({ connections: left }, 'grace period over; closing remaining connections');
    const closing = [...this.connections.values()].map(({ conn }) => conn);
    for (const c of closing) c.close();
    for (const { conn } of [...this.detached.values()]) conn.close();
    // Let DRAIN and the end of each stream reach the server before the process exits (bounded).
    await Promise.race([Promise.all(closing.map((c) => c.finished)), sleep(2000, undefined, { ref: false })]);
    await this.loop;
    this.connectFailures.flush();
    await this.health?.close();
    this.transition(['draining'], 'stopped');
  }

  /** What a graceful stop waits for: open connections, and dials either way that will become ones. */
  private inFlight(): number {
    let n = 0;
    for (const { conn } of this.connections.values()) {
      const st = conn.tunnel.stats();
      n += st.connections + st.pendingDials + st.inboundDials;
    }
    return n;
  }

  private openConnections(): number {
    let n = 0;
    for (const { conn } of this.connections.values()) n += conn.tunnel.stats().connections;
    return n;
  }

  /** This agent and a server, as the audit log names them. */
  private party(serverID: string, address: string): TunnelParty {
    return { agent: { id: this.opts.agentID }, server: { id: serverID, address } };
  }

  /** This agent and the server of `tunnel` (for a node -> control plane dial), as the audit log names them. */
  partyOf(tunnel: Tunnel): TunnelParty {
    for (const [serverID, held] of this.connections) if (held.conn.tunnel === tunnel) return this.party(serverID, held.address);
    return { agent: { id: this.opts.agentID } };
  }

  /** Performs a control plane -> node dial. */
  private dialForServer = (dial: InboundDial): Promise<Duplex> => {
    const t0 = performance.now();
    return dialTcp(dial.address, { timeoutMs: this.opts.dialTimeoutMs, signal: dial.signal }).then(
      (socket) => {
        this.metrics.dialDone('cp_to_node', 'ok', t0);
        return socket;
      },
      (err: Error) => {
        this.metrics.dialDone('cp_to_node', err instanceof DialError ? err.failure : 'refused', t0);
        throw err;
      },
    );
  };

  /**
   * Resolves the hosts, keeps one loop per address (maintainEndpoint), and
   * resolves names again every reconnect.maxMs (sooner after a failed lookup)
   * to follow servers added and removed. Returns once stopping and every loop ended.
   */
  private async maintain(): Promise<void> {
    const { reconnect } = this.opts;
    const lookupRetry = new Backoff(reconnect.initialMs, reconnect.maxMs);
    while (this.state === 'running') {
      const failed = await this.resolve();
      if (!this.addresses.resolvable) break;
      await this.changeOrTimeout(failed ? lookupRetry.next() : reconnect.maxMs, this.stopping.signal, false);
      if (!failed) lookupRetry.reset();
    }
    // Loops end once stopping (each wakes on this.stopping); removed ones have ended or will.
    while (this.endpointLoops.size > 0) await Promise.all([...this.endpointLoops]);
  }

  /** One resolution of every host, then reconcile(); true when a lookup failed. */
  private async resolve(): Promise<boolean> {
    const result = await this.unlessStopping(this.addresses.resolve());
    if (!result || this.state !== 'running') return false;
    for (const f of result.failures) {
      this.opts.log.warn({ host: f.host, err: f.error }, 'cannot resolve proxy server host; keeping the addresses it had');
    }
    this.reconcile(result.endpoints);
    return result.failures.length > 0;
  }

  /** Makes `endpoints` the addresses dialled: a loop starts for each new one; a gone one's loop ends (its tunnel stays until it closes). */
  private reconcile(endpoints: readonly ServerEndpoint[]): void {
    const wanted = new Set(endpoints.map((e) => e.target));
    let changed = false;
    for (const [target, e] of this.endpoints) {
      if (wanted.has(target)) continue;
      e.removed.abort();
      this.endpoints.delete(target);
      changed = true;
      this.opts.log.info({ address: target }, 'proxy server address no longer resolved; no new tunnel through it');
    }
    for (const endpoint of endpoints) {
      if (this.endpoints.has(endpoint.target)) continue;
      const e: EndpointState = { endpoint, removed: new AbortController(), lastError: '', reachedHeld: undefined };
      this.endpoints.set(endpoint.target, e);
      changed = true;
      const loop = this.maintainEndpoint(e).finally(() => this.endpointLoops.delete(loop));
      this.endpointLoops.add(loop);
    }
    if (!changed) return;
    this.opts.log.info(
      { addresses: [...this.endpoints.keys()], mode: this.byName() ? 'one tunnel per address' : 'one address for every server' },
      'proxy server addresses',
    );
    this.updateExpected();
    this.wake();
  }

  /** By name (several addresses): one tunnel through each. Behind one address: as many as the servers count. */
  private byName(): boolean {
    return this.endpoints.size > 1;
  }

  /** How many tunnels the agent aims at: the servers' count behind one address; by name, each address not known to reach a server held through another. */
  private target(): number {
    if (!this.byName()) return this.expected.count;
    let n = 0;
    for (const e of this.endpoints.values()) if (!(e.reachedHeld && this.connections.has(e.reachedHeld))) n++;
    return n;
  }

  /**
   * Keeps a tunnel through one address for as long as it is resolved: by
   * name, one tunnel through it; behind one address, tunnels until the
   * servers' count is reached. Waits between connects as ReconnectDelay says.
   */
  private async maintainEndpoint(e: EndpointState): Promise<void> {
    const delay = new ReconnectDelay(this.opts.reconnect);
    const { signal } = e.removed;
    let lastAttempt = 0;
    while (this.state === 'running' && !signal.aborted) {
      const wait = this.untilNextConnect(e, lastAttempt);
      if (wait > 0) {
        await this.changeOrTimeout(wait, signal);
        continue;
      }
      lastAttempt = Date.now();
      let conn: ServerConnection;
      try {
        conn = await this.connect(e.endpoint);
      } catch (err) {
        const { cause, message } = diagnoseConnectError(err, this.attempt(e.endpoint));
        e.lastError = message;
        if (refusedConnection(err)) this.refusedBy(e);
        const retryInMs = delay.failed(this.detached.size > 0);
        const server = e.endpoint.target;
        this.opts.log.debug({ server, cause, err: errorMessage(err), retryInMs }, 'connect attempt failed');
        // One warning per cause in its words (an empty token file, then a missing one, are two); numbers aside, as grpc-js dates its messages.
        const key = `${server} ${cause} ${message.replace(/\d+/g, '#')}`;
        this.connectFailures.warn(key, { server, cause, err: message }, 'cannot connect to proxy server');
        await this.pause(retryInMs, signal);
        continue;
      }
      e.lastError = '';
      const settled = this.settle(conn, e);
      if (settled === 'adopted') delay.succeeded();
      // Behind one address the next connect may reach another server: soon, while any is missing.
      else if (settled === 'already-held' && !this.byName() && this.connections.size < this.expected.count)
        await this.pause(delay.reachedHeld(), signal);
      else delay.succeeded();
    }
  }

  /** What a connect to `endpoint` offers and checks, for the diagnosis of its failure. */
  private attempt(endpoint: ServerEndpoint): ConnectAttempt {
    const { tls } = this.opts.server;
    const host = endpoint.resolved ? endpoint.name : parseHostPort(endpoint.target).host;
    return {
      target: endpoint.target,
      verifyName: tls.serverName ?? host,
      clientCertificate: tls.cert !== undefined,
      token: this.opts.token !== undefined,
      connectTimeoutMs: this.opts.connectTimeoutMs,
    };
  }

  /** The one place a tunnel is opened: to `endpoint`, its certificate checked against the name it was given by. */
  private connect(endpoint: ServerEndpoint): Promise<ServerConnection> {
    const { tls } = this.opts.server;
    const resumeTimeoutMs = this.opts.resumeTimeoutMs ?? 0;
    const resume =
      resumeTimeoutMs > 0
        ? {
            timeoutMs: resumeTimeoutMs,
            incarnation: this.incarnation,
            held: () =>
              new Map(
                [...this.detached.values()].flatMap((h) => (h.conn.resumeToken ? [[h.conn.resumeToken, h.conn.tunnel] as const] : [])),
              ),
            onReplayed: (n: number) => this.resumeMetrics.replayedBytes.inc(n),
          }
        : undefined;
    return connectToServer({
      ...(resume ? { resume } : {}),
      target: endpoint.target,
      tls: tls.serverName === undefined && endpoint.resolved ? { ...tls, serverName: endpoint.name } : tls,
      agentID: this.opts.agentID,
      agentIdentifiers: this.opts.agentIdentifiers,
      token: this.opts.token,
      features: this.opts.features ?? (resumeTimeoutMs > 0 ? RESUMING_AGENT_FEATURES : AGENT_FEATURES),
      targets: this.opts.targets?.map((t) => t.destination),
      transport: this.transport,
      dialHandler: this.dialForServer,
      limits: this.opts.limits,
      allowance: (serverID) => this.allowances.allowanceFor('', serverID, resolveLimits(this.opts.limits)),
      connectTimeoutMs: this.opts.connectTimeoutMs,
      log: this.opts.log,
      // The agent performs control plane -> node dials and requests node -> control plane ones.
      onConnectionClosed: (c, serverID) => {
        this.metrics.connectionClosed(
          c.role === 'performer' ? 'cp_to_node' : 'node_to_cp',
          c.bytesOut,
          c.bytesIn,
          (Date.now() - c.openedAt) / 1000,
        );
        this.auditor.connectionEnded(c, this.party(serverID, endpoint.target));
      },
      onInboundDialFailed: (f, serverID) => this.auditor.inboundDialFailed('performer', this.party(serverID, endpoint.target), f),
      onLimit: (limit, reason) => countTunnelLimit(this.metrics, limit, reason),
      refusalReasons: SERVER_TUNNEL_REFUSALS,
      limitFlags: SERVER_TUNNEL_LIMIT_FLAGS,
      onPeerFault: (reason) => {
        this.metrics.refusals.inc({ reason });
        this.metrics.recent.add(reason);
      },
    });
  }

  /**
   * The one decision on a server just connected to through `e`'s address:
   * adopt its tunnel, or close it because the agent is stopping or already
   * holds a tunnel to that server.
   */
  private settle(conn: ServerConnection, e: EndpointState): Settled {
    this.announcedServers = conn.serverCount;
    if (this.state !== 'running') {
      conn.close();
      return 'closed';
    }
    if (conn.resumed) {
      e.reachedHeld = undefined;
      this.adopt(conn, e.endpoint.target);
      return 'adopted';
    }
    this.forgottenBy(conn);
    const held = this.connections.get(conn.serverID);
    if (held) {
      conn.close();
      e.reachedHeld = conn.serverID;
      this.opts.log.debug(
        { serverID: conn.serverID, address: e.endpoint.target, heldThrough: held.address },
        'already connected to this server; will retry for the others',
      );
      this.updateExpected();
      return 'already-held';
    }
    e.reachedHeld = undefined;
    this.adopt(conn, e.endpoint.target);
    this.updateExpected();
    return 'adopted';
  }

  /**
   * Milliseconds until `e`'s loop should connect (0: now; Infinity: not
   * until something changes). By name: while a tunnel is held through the
   * address, or the server it reached is held through another. Behind one
   * address: while the servers' count is reached (with --sync-forever, a
   * connect per reconnect.maxMs still; with leases, a look per sync interval).
   */
  private untilNextConnect(e: EndpointState, lastAttempt: number): number {
    this.updateExpected();
    if (this.byName()) {
      const through = [...this.connections.values()].some((h) => h.address === e.endpoint.target);
      return through || (e.reachedHeld !== undefined && this.connections.has(e.reachedHeld)) ? Infinity : 0;
    }
    const { reconnect, syncForever } = this.opts;
    if (this.connections.size < this.expected.count) return 0;
    const probeIn = syncForever ? lastAttempt + reconnect.maxMs - Date.now() : Infinity;
    if (probeIn <= 0) return 0;
    // A lease count changes without a tunnel changing: look again every sync interval.
    return Math.min(probeIn, this.opts.serverCount?.leases ? reconnect.initialMs : Infinity);
  }

  /** The number of servers to hold tunnels to now; logs each change with its source (by name: and a disagreement with the addresses). */
  private updateExpected(): number {
    const c = serverCount(this.opts.serverCount?.source ?? 'default', this.opts.serverCount?.leases?.(), this.announcedServers);
    if (c.count !== this.expected.count || c.from !== this.expected.from) {
      this.opts.log.info(
        { serverCount: c.count, from: c.from, previous: this.expected.count, tunnels: this.connections.size },
        'server count changed',
      );
    }
    this.expected = c;
    this.checkCount();
    return c.count;
  }

  /** By name: says once (log and /readyz) when the servers count differently from the addresses dialled; updateExpected() only. */
  private checkCount(): void {
    if (!this.byName() || this.announcedServers === 0) {
      this.countMismatch = '';
      return;
    }
    const addresses = this.target();
    const { count, from } = this.expected;
    const mismatch = count === addresses ? '' : `the servers count ${count} (${from}), ${addresses} address(es) reach distinct servers`;
    if (mismatch && mismatch !== this.countMismatch) {
      this.opts.log.warn(
        { serverCount: count, from, addresses: [...this.endpoints.keys()] },
        `server count and server addresses disagree: ${mismatch}`,
      );
    }
    this.countMismatch = mismatch;
  }

  /** `work`'s result, or undefined as soon as the agent stops (a lookup may take the resolver's whole timeout). */
  private async unlessStopping<T>(work: Promise<T>): Promise<T | undefined> {
    let onAbort = (): void => undefined;
    const stopped = new Promise<undefined>((resolve) => {
      onAbort = () => resolve(undefined);
      this.stopping.signal.addEventListener('abort', onAbort, { once: true });
    });
    if (this.stopping.signal.aborted) return undefined;
    try {
      return await Promise.race([work, stopped]);
    } finally {
      this.stopping.signal.removeEventListener('abort', onAbort);
    }
  }

  /** Wakes every loop waiting in changeOrTimeout(). */
  private wake(): void {
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const w of waiters) w();
  }

  /**
   * Resolves after `timeoutMs` (Infinity: never), once `signal` aborts or the
   * agent stops, or (unless `onChange` is false) when a tunnel goes down or the addresses change.
   */
  private changeOrTimeout(timeoutMs: number, signal: AbortSignal, onChange = true): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = Number.isFinite(timeoutMs) ? setTimeout(() => done(), timeoutMs) : undefined;
      const done = (): void => {
        clearTimeout(timer);
        this.waiters.delete(done);
        signal.removeEventListener('abort', done);
        this.stopping.signal.removeEventListener('abort', done);
        resolve();
      };
      if (onChange) this.waiters.add(done);
      signal.addEventListener('abort', done, { once: true });
      this.stopping.signal.addEventListener('abort', done, { once: true });
      if (signal.aborted || this.stopping.signal.aborted) done();
    });
  }

  /** Waits `ms`, or less when `signal` aborts or the agent stops. */
  private pause(ms: number, signal: AbortSignal): Promise<void> {
    return this.changeOrTimeout(ms, signal, false);
  }

  /**
   * A server that answered without resuming the tunnel we hold detached
   * for it (same serverID) no longer has it: restarted, or its timeout
   * passed. Its connections are closed now, not at our timeout.
   */
  private forgottenBy(conn: ServerConnection): void {
    const lost = this.detached.get(conn.serverID);
    if (!lost || lost.conn.tunnel === conn.tunnel) return;
    this.resumeMetrics.results.inc({ result: 'refused' });
    this.opts.log.warn(
      { serverID: conn.serverID, connections: lost.conn.tunnel.stats().connections },
      'server no longer holds the tunnel (restarted?); its connections are closed',
    );
    lost.conn.tunnel.close(new Error(`server ${conn.serverID} no longer holds the tunnel (restarted?)`));
  }

  /**
   * `e`'s address refuses connections: no process listens there, so a
   * server reached directly through it (by name, or the only server behind
   * one address) that holds a detached tunnel of ours is gone with it. Behind
   * a balancer of several servers a refusal says nothing about any one.
   */
  private refusedBy(e: EndpointState): void {
    if (!this.byName() && this.expected.count > 1) return;
    for (const lost of [...this.detached.values()]) {
      if (lost.address !== e.endpoint.target) continue;
      this.opts.log.warn(
        { serverID: lost.conn.serverID, address: lost.address, connections: lost.conn.tunnel.stats().connections },
        'server refuses connections (its process is gone); the connections of its tunnel are closed',
      );
      lost.conn.tunnel.close(new Error(`server ${lost.conn.serverID} at ${lost.address} refuses connections`));
    }
  }

  /** A tunnel new or resumed through `address`: held, and (new) watched until it closes. */
  private adopt(conn: ServerConnection, address: string): void {
    const held: HeldTunnel = { conn, address };
    if (this.detached.get(conn.serverID)?.conn.tunnel === conn.tunnel) this.detached.delete(conn.serverID);
    this.connections.set(conn.serverID, held);
    if (conn.resumed) {
      this.opts.log.info({ serverID: conn.serverID, address, connections: conn.tunnel.stats().connections }, 'tunnel resumed');
      for (const l of this.listeners) l(conn.tunnel, 'up');
      return;
    }
    this.watch(conn.tunnel, conn.serverID);
    const features = formatFeatures(conn.tunnel.features);
    this.opts.log.info(
      { serverID: conn.serverID, address, serverCount: conn.serverCount, features: features || 'none (upstream server)' },
      'tunnel up',
    );
    for (const t of this.refusedTargets(conn))
      this.opts.log.warn({ serverID: conn.serverID, target: t.localPort }, refusedTargetMessage(t, conn.serverID));
    if ((this.opts.features ?? AGENT_FEATURES).has(Feature.NodeDial) && !conn.tunnel.features.has(Feature.NodeDial)) {
      this.opts.log.warn(
        { serverID: conn.serverID },
        'server does not support node -> control plane dials (upstream Konnectivity?); that direction is unavailable through it',
      );
    }
    for (const l of this.listeners) l(conn.tunnel, 'up');
  }

  /** The --target listeners whose destination `conn`'s server refuses. */
  private refusedTargets(conn: ServerConnection): Target[] {
    return (this.opts.targets ?? []).filter((t) => conn.refusedTargets.includes(t.destination));
  }

  /** Follows a new tunnel through its losses, resumes and close (once per tunnel: a resume keeps the listeners). */
  private watch(tunnel: Tunnel, serverID: string): void {
    this.resumeMetrics.watch(tunnel);
    const isHeld = (m: Map<string, HeldTunnel>): HeldTunnel | undefined => {
      const h = m.get(serverID);
      return h?.conn.tunnel === tunnel ? h : undefined;
    };
    tunnel.on('detached', (err) => {
      const held = isHeld(this.connections);
      if (!held) return;
      this.connections.delete(serverID);
      this.detached.set(serverID, held);
      if (this.state === 'running') this.upstreamMetrics.serverFailures.inc({ direction: 'from_server' });
      this.opts.log.warn(
        {
          serverID,
          address: held.address,
          reason: err.message,
          connections: tunnel.stats().connections,
          resumeTimeoutMs: this.opts.resumeTimeoutMs,
        },
        'tunnel lost; its connections wait for it to resume',
      );
      for (const l of this.listeners) l(tunnel, 'down');
      this.wake();
    });
    tunnel.on('resume-expired', () =>
      this.opts.log.warn({ serverID, connections: tunnel.stats().connections }, 'tunnel not resumed in time; its connections are closed'),
    );
    tunnel.once('close', (err) => {
      const held = isHeld(this.connections);
      const wasUp = held !== undefined;
      if (held) this.connections.delete(serverID);
      const detached = isHeld(this.detached);
      if (detached) this.detached.delete(serverID);
      this.wake();
      // A tunnel closed by our own stop is planned; any other loss is worth a warning.
      const running = this.state === 'running';
      const level = running ? 'warn' : 'info';
      if (running && err && wasUp) this.upstreamMetrics.serverFailures.inc({ direction: 'from_server' });
      this.opts.log[level]({ serverID, address: (held ?? detached)?.address, reason: err?.message ?? 'stream ended' }, 'tunnel down');
      if (wasUp) for (const l of this.listeners) l(tunnel, 'down');
    });
  }
}
