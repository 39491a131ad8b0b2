/**
 * Kanal proxy agent: keeps one tunnel to every proxy server, performs dials
 * the servers ask for, and drains gracefully on shutdown. The servers are
 * found two ways (docs/ha.md): behind one address (a load balancer: the
 * agent connects until it holds as many tunnels as the servers announce in
 * serverCount, or as --count-server-leases counts), or by name (several
 * addresses: --proxy-server-host repeated, or a name with several addresses;
 * one tunnel through each, each address with its own reconnect loop).
 *
 * The composition of its rooms: the reconnect loop (reconnect-loop.ts, when
 * each address connects: connect-schedule.ts, waits: wakeups.ts), opening a
 * tunnel (server-connector.ts), the tunnels held up and detached
 * (held-tunnels.ts), the servers' count (expected-servers.ts) and /readyz
 * (tunnel-readiness.ts); here the one decision on a server reached (settle)
 * and the life from start to a drained stop.
 */
import { ConnectionAuditor, type TunnelParty } from '../audit/connection-auditor.js';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Tunnel, TunnelStats } from '../tunnel/tunnel.js';
import { formatFeatures, Feature } from '../wire/features.js';
import { formatHostPort } from '../common/host-port.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { StateMachine, type Lifecycle } from '../common/state-machine.js';
import type { ServerConnection } from './server-connection.js';
import { ServerAddresses } from './server-addresses.js';
import { KanalMetrics } from '../domain/metrics.js';
import type { ResolveHandler } from '../tunnel/name-resolution.js';
import { registerUpstreamAgentMetrics, type UpstreamAgentEventMetrics } from '../domain/upstream-metrics.js';
import type { ServerCount } from './server-count.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { listenError } from '../common/listen-error.js';
import { refusedTargetMessage, type Target } from './target.js';
import type { ServerTunnelsOptions } from './server-tunnels-options.js';
import { Wakeups } from './wakeups.js';
import { HeldTunnels, type HeldTunnel } from './held-tunnels.js';
import { ExpectedServers, tunnelsAimedAt } from './expected-servers.js';
import { allReady, tunnelReadiness } from './tunnel-readiness.js';
import { offersNodeDial, ServerConnector } from './server-connector.js';
import { ReconnectLoop, type EndpointState, type Settled } from './reconnect-loop.js';
import { untilNextConnect } from './connect-schedule.js';
import { FLAG } from './settings.js';

export type { ServerTunnelsOptions } from './server-tunnels-options.js';
export type { Settled } from './reconnect-loop.js';

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

/** A connect failure is logged when its cause changes, then at most once per this long with the count of the rest. */
const CONNECT_FAILURE_LOG_MS = 60_000;

/**
 * Where a ServerTunnels is in its life; it only moves forward (TUNNELS_LIFECYCLE, transition()).
 * - created: nothing started; stop() has nothing to do (a start() still opening the health port sees 'stopped' and closes it).
 * - running: the reconnect loop keeps a tunnel to every server; a tunnel lost is a warning and a
 *   server_connection_failure_count.
 * - draining: stop() sent DRAIN and opens no tunnel; the tunnels still serve dials until their
 *   connections end or the grace period does (a tunnel lost is expected: logged at info).
 * - stopped: every tunnel closed, the reconnect loop returned, the health port closed.
 * Leaving 'running' aborts `stopping`, which wakes every loop from any wait.
 */
export type AgentState = 'created' | 'running' | 'draining' | 'stopped';

const TUNNELS_LIFECYCLE: Lifecycle<AgentState> = {
  name: 'agent tunnels',
  moves: { created: ['running', 'stopped'], running: ['draining'], draining: ['stopped'], stopped: [] },
};

export class ServerTunnels {
  /** See AgentState; changed only by transition(). */
  private readonly life: StateMachine<AgentState>;
  /** Aborted on leaving 'running': wakes every loop from any wait so it sees the state. */
  private readonly stopping = new AbortController();
  private readonly wakeups = new Wakeups(this.stopping.signal);
  /** The reconnect loop's run(), from start() until it returns (after leaving 'running' and every endpoint loop ended). */
  private loop: Promise<void> | undefined;
  private readonly held: HeldTunnels;
  private readonly expected: ExpectedServers;
  private readonly connector: ServerConnector;
  private readonly reconnect: ReconnectLoop;
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
    const { log } = opts;
    this.life = new StateMachine<AgentState>('created', TUNNELS_LIFECYCLE, (from, to) => log.debug({ from, to }, 'agent tunnels state'));
    this.auditor = new ConnectionAuditor({
      side: 'agent',
      log: log.child({ part: 'connections' }),
      ...(opts.audit ? { sink: opts.audit } : {}),
    });
    this.connectFailures = new RateLimitedLog(log, CONNECT_FAILURE_LOG_MS);
    this.expected = new ExpectedServers({
      source: opts.serverCount?.source ?? 'default',
      ...(opts.serverCount?.leases ? { leases: opts.serverCount.leases } : {}),
      log,
    });
    this.metrics.gauge('kanal_agent_tunnels', 'Tunnels up to proxy servers', () => this.held.up.size);
    this.metrics.gauge(
      'kanal_agent_expected_servers',
      'Proxy servers the agent holds tunnels to: announced by serverCount, or counted by leases; by name, the addresses dialled',
      () => this.aimed(),
    );
    this.metrics.gauge('kanal_agent_connections_open', 'Tunnelled connections open', () => this.held.openConnections());
    this.metrics.gauge(
      'kanal_agent_window_growth_bytes',
      'Receive-window growth (beyond the first window) held by tunnelled connections',
      () => this.held.windowGrowthBytes(),
    );
    this.held = new HeldTunnels({
      metrics: this.metrics,
      log,
      resumeTimeoutMs: opts.resumeTimeoutMs,
      running: () => this.life.is('running'),
      serverFailure: () => this.upstreamMetrics.serverFailures.inc({ direction: 'from_server' }),
      down: (tunnel) => {
        for (const l of this.listeners) l(tunnel, 'down');
      },
      changed: () => this.wakeups.wake(),
    });
    this.upstreamMetrics = registerUpstreamAgentMetrics(this.metrics.registry, {
      serverConnections: () => this.held.up.size,
      knownServers: () => this.expected.current.count,
      endpointConnections: () => this.held.openConnections(),
    });
    const resolve = opts.resolveHandler;
    this.connector = new ServerConnector({
      ...opts,
      ...(resolve ? { resolveHandler: countedResolves(resolve, this.metrics) } : {}),
      metrics: this.metrics,
      auditor: this.auditor,
      resumeMetrics: this.held.resumeMetrics,
      resumable: () => this.held.resumable(),
      party: (serverID, address) => this.party(serverID, address),
    });
    this.reconnect = new ReconnectLoop({
      addresses: new ServerAddresses(opts.server.hosts, opts.lookup),
      reconnect: opts.reconnect,
      log,
      wakeups: this.wakeups,
      running: () => this.life.is('running'),
      connectFailures: this.connectFailures,
      untilNextConnect: (e, lastAttempt) => this.untilNextConnect(e, lastAttempt),
      connect: (endpoint) => this.connector.connect(endpoint),
      attempt: (endpoint) => this.connector.attempt(endpoint),
      settle: (conn, e) => this.settle(conn, e),
      refused: (e) => this.refusedBy(e),
      resuming: () => this.held.detached.size > 0,
      missing: () => this.held.up.size < this.expected.current.count,
      changed: () => {
        this.updateExpected();
        this.wakeups.wake();
      },
    });
  }

  get healthPort(): number {
    return this.health?.port ?? 0;
  }

  /** Tunnels currently up, one per server. */
  tunnels(): Tunnel[] {
    return [...this.held.up.values()].map(({ conn }) => conn.tunnel);
  }

  onTunnelChange(listener: (tunnel: Tunnel, change: 'up' | 'down') => void): void {
    this.listeners.add(listener);
  }

  /** Makes /readyz also require `condition` (its detail is appended either way). */
  addReadinessCondition(condition: () => Readiness): void {
    this.conditions.push(condition);
  }

  readiness(): Readiness {
    const tunnels = tunnelReadiness({
      tunnels: [...this.held.up.values()].map(({ conn, address }) => ({
        serverID: conn.serverID,
        address,
        nodeDial: conn.tunnel.features.has(Feature.NodeDial),
        refusedTargets: this.refusedTargets(conn),
      })),
      addresses: [...this.reconnect.endpoints.values()].map((e) => ({
        target: e.endpoint.target,
        lastError: e.lastError,
        reachedHeld: e.reachedHeld,
      })),
      byName: this.reconnect.byName,
      aimed: this.aimed(),
      countMismatch: this.expected.mismatch,
      nodeDial: offersNodeDial(this.opts.features),
    });
    return allReady([tunnels, ...this.conditions.map((c) => c())]);
  }

  stats(): AgentStats {
    return {
      tunnels: [...this.held.up.values()].map(({ conn, address }) => ({
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
      state: this.life.state,
      expected: { ...this.expected.current },
      endpoints: [...this.reconnect.endpoints.values()].map((e) => ({
        target: e.endpoint.target,
        name: e.endpoint.name,
        lastError: e.lastError,
        reachedHeld: this.held.holds(e.reachedHeld) ? e.reachedHeld : undefined,
      })),
      tunnels: [...[...this.held.up.values()].map(held(false)), ...[...this.held.detached.values()].map(held(true))],
    };
  }

  /** The one transition function: moves from one of `from` to `to`; false (and no change) from any other state. */
  private transition(from: readonly AgentState[], to: AgentState): boolean {
    if (!this.life.from(from, to)) return false;
    if (to !== 'running') this.stopping.abort();
    return true;
  }

  async start(): Promise<void> {
    if (!this.life.is('created')) throw new Error(`the agent cannot start when ${this.life.state}`);
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
        throw listenError(err, formatHostPort(health), `${FLAG['health-bind-address']}, ${FLAG['health-server-port']}`);
      }
    }
    // stop() during the await above found nothing started yet: the health port is all there is.
    if (!this.transition(['created'], 'running')) {
      await this.health?.close();
      return;
    }
    this.loop = this.reconnect.run(this.stopping.signal);
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
    for (const { conn } of this.held.up.values()) conn.tunnel.sendDrain();
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && this.held.inFlight() > 0) await sleep(50);
    const left = this.held.inFlight();
    if (left > 0) this.opts.log.warn({ connections: left }, 'grace period over; closing remaining connections');
    const closing = [...this.held.up.values()].map(({ conn }) => conn);
    for (const c of closing) c.close();
    for (const { conn } of [...this.held.detached.values()]) conn.close();
    // Let DRAIN and the end of each stream reach the server before the process exits (bounded).
    await Promise.race([Promise.all(closing.map((c) => c.finished)), sleep(2000, undefined, { ref: false })]);
    await this.loop;
    this.connectFailures.flush();
    await this.health?.close();
    this.transition(['draining'], 'stopped');
  }

  /** This agent and a server, as the audit log names them. */
  private party(serverID: string, address: string): TunnelParty {
    return { agent: { id: this.opts.agentID }, server: { id: serverID, address } };
  }

  /** This agent and the server of `tunnel` (for a node -> control plane dial), as the audit log names them. */
  partyOf(tunnel: Tunnel): TunnelParty {
    for (const [serverID, held] of this.held.up) if (held.conn.tunnel === tunnel) return this.party(serverID, held.address);
    return { agent: { id: this.opts.agentID } };
  }

  /** How many tunnels the agent aims at (expected-servers.ts). */
  private aimed(): number {
    return tunnelsAimedAt(this.reconnect.byName, this.expected.current.count, this.reconnect.endpoints.values(), (id) =>
      this.held.holds(id),
    );
  }

  /** The number of servers to hold tunnels to now (expected-servers.ts). */
  private updateExpected(): number {
    return this.expected.update({
      tunnels: this.held.up.size,
      byName: this.reconnect.byName,
      addresses: () => [...this.reconnect.endpoints.keys()],
      aimed: () => this.aimed(),
    });
  }

  /** Milliseconds until `e`'s loop should connect (connect-schedule.ts), the servers' count looked at again first. */
  private untilNextConnect(e: EndpointState, lastAttempt: number): number {
    const servers = this.updateExpected();
    const target = e.endpoint.target;
    return untilNextConnect({
      byName: this.reconnect.byName,
      covered: this.held.through(target) || this.held.holds(e.reachedHeld),
      tunnels: this.held.up.size,
      servers,
      syncForever: this.opts.syncForever ?? false,
      leases: this.opts.serverCount?.leases !== undefined,
      reconnect: this.opts.reconnect,
      lastAttempt,
      now: Date.now(),
    });
  }

  /**
   * The one decision on a server just connected to through `e`'s address:
   * adopt its tunnel, or close it because the agent is stopping or already
   * holds a tunnel to that server.
   */
  private settle(conn: ServerConnection, e: EndpointState): Settled {
    this.expected.announce(conn.serverCount);
    if (!this.life.is('running')) {
      conn.close();
      return 'closed';
    }
    if (conn.resumed) {
      e.reachedHeld = undefined;
      this.adopt(conn, e.endpoint.target);
      return 'adopted';
    }
    this.held.forgottenBy(conn);
    const held = this.held.up.get(conn.serverID);
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
   * `e`'s address refuses connections: no process listens there, so a
   * server reached directly through it (by name, or the only server behind
   * one address) that holds a detached tunnel of ours is gone with it. Behind
   * a balancer of several servers a refusal says nothing about any one.
   */
  private refusedBy(e: EndpointState): void {
    if (!this.reconnect.byName && this.expected.current.count > 1) return;
    this.held.refusedThrough(e.endpoint.target);
  }

  /** A tunnel new or resumed through `address`: held, said, and told to the listeners. */
  private adopt(conn: ServerConnection, address: string): void {
    this.held.hold(conn, address);
    if (conn.resumed) {
      this.opts.log.info({ serverID: conn.serverID, address, connections: conn.tunnel.stats().connections }, 'tunnel resumed');
      for (const l of this.listeners) l(conn.tunnel, 'up');
      return;
    }
    const features = formatFeatures(conn.tunnel.features);
    this.opts.log.info(
      { serverID: conn.serverID, address, serverCount: conn.serverCount, features: features || 'none (upstream server)' },
      'tunnel up',
    );
    for (const t of this.refusedTargets(conn))
      this.opts.log.warn({ serverID: conn.serverID, target: t.localPort }, refusedTargetMessage(t, conn.serverID));
    if (offersNodeDial(this.opts.features) && !conn.tunnel.features.has(Feature.NodeDial)) {
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
}

/** `resolve`, each answer counted in kanal_name_resolutions_total{result}. */
function countedResolves(resolve: ResolveHandler, metrics: KanalMetrics): ResolveHandler {
  return async (name, signal) => {
    try {
      const answer = await resolve(name, signal);
      metrics.resolves.inc({ result: 'ok' });
      return answer;
    } catch (err) {
      metrics.resolves.inc({ result: signal.aborted ? 'cancelled' : 'unresolved' });
      throw err;
    }
  };
}
