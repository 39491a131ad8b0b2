/**
 * Kanal proxy agent: keeps one tunnel to every proxy server behind the
 * configured address (HA: servers announce serverCount), performs dials the
 * servers ask for, and drains gracefully on shutdown.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { ClientTlsOptions, Transport } from '../transport/transport.js';
import { Feature, formatFeatures, type FeatureSet } from '../wire/features.js';
import type { TunnelLimitName, TunnelLimits } from '../tunnel/limits.js';
import type { InboundDial, Tunnel, TunnelStats } from '../tunnel/tunnel.js';
import { DialError } from '../tunnel/errors.js';
import { Backoff } from '../common/backoff.js';
import { dialTcp } from '../tunnel/tcp-dial.js';
import { formatHostPort } from '../common/host-port.js';
import { startHealthServer, type HealthServer, type Readiness } from '../common/health-server.js';
import { connectToServer, type ServerConnection } from './server-connection.js';
import { KanalMetrics } from '../domain/metrics.js';
import { countTunnelLimit, type RefusalReasons } from '../tunnel/limit-metrics.js';
import { registerUpstreamAgentMetrics, type UpstreamAgentEventMetrics } from '../domain/upstream-metrics.js';
import { serverCount, type ServerCount, type ServerCountSource } from './server-count.js';
import { errorMessage } from '../common/error-message.js';

export interface ServerTunnelsOptions {
  agentID: string;
  agentIdentifiers: string;
  server: { host: string; port: number; tls: ClientTlsOptions };
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
   * reconnect.maxMs to learn of new servers from their serverCount headers.
   */
  syncForever?: boolean;
  dialTimeoutMs: number;
  connectTimeoutMs: number;
  reconnect: { initialMs: number; maxMs: number };
  health?: { host: string; port: number };
  transport: Transport;
  limits?: Partial<TunnelLimits>;
  features?: FeatureSet;
  log: Logger;
}

export interface AgentStats {
  tunnels: (TunnelStats & { serverID: string; features: string })[];
}

const AGENT_FEATURES: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.NodeDial]);

/** On a tunnel to a server the agent performs control plane -> node dials (inbound) and requests node -> control plane ones. */
const SERVER_TUNNEL_REFUSALS: RefusalReasons = {
  maxPendingDials: 'pending_dials',
  maxInboundConnections: 'cp_to_node_connections',
  maxOutboundConnections: 'node_to_cp_connections',
};
const SERVER_TUNNEL_LIMIT_FLAGS: Partial<Record<TunnelLimitName, string>> = {
  maxInboundConnections: '--max-cp-to-node-connections',
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
  /** Aborted on leaving 'running': wakes maintain() from any wait so it sees the state. */
  private readonly stopping = new AbortController();
  /** maintain(), from start() until it returns (after leaving 'running'). */
  private loop: Promise<void> | undefined;
  /** Set while maintain() waits for a tunnel to go down; a tunnel's close calls it. */
  private wakeMaintain: (() => void) | undefined;
  /** Tunnels up, by serverID: at most one per server; a tunnel leaves on its 'close'. */
  private readonly connections = new Map<string, ServerConnection>();
  /** The serverCount header of the last server connected to (0: none yet). */
  private announcedServers = 0;
  /** What maintain() last aimed at; only it updates this. */
  private expected: ServerCount = { count: 1, from: 'fallback to 1' };
  /** Why the last connect failed ('' once one succeeds), for /readyz. */
  private lastError = '';
  /** Set by start() when a health port is configured; closed by stop(). */
  private health: HealthServer | undefined;
  private readonly listeners = new Set<(tunnel: Tunnel, change: 'up' | 'down') => void>();
  /** More conditions /readyz requires besides a tunnel (e.g. the advertise address in place). */
  private readonly conditions: (() => Readiness)[] = [];

  readonly metrics = new KanalMetrics('agent');
  /** Upstream's agent metrics updated as things happen (the lease counter feeds the lease ones). */
  readonly upstreamMetrics: UpstreamAgentEventMetrics;

  constructor(private readonly opts: ServerTunnelsOptions) {
    this.metrics.gauge('kanal_agent_tunnels', 'Tunnels up to proxy servers', () => this.connections.size);
    this.metrics.gauge(
      'kanal_agent_expected_servers',
      'Proxy servers the agent holds tunnels to: announced by serverCount, or counted by leases',
      () => this.expected.count,
    );
    this.metrics.gauge('kanal_agent_connections_open', 'Tunnelled connections open', () => this.openConnections());
    this.metrics.gauge(
      'kanal_agent_window_growth_bytes',
      'Receive-window growth (beyond the first window) held by tunnelled connections',
      () => {
        let n = 0;
        for (const c of this.connections.values()) n += c.tunnel.stats().windowGrowthBytes;
        return n;
      },
    );
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
    return [...this.connections.values()].map((c) => c.tunnel);
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
    if (n === 0) return { ready: false, detail: `no tunnel to a proxy server${this.lastError ? ` (last error: ${this.lastError})` : ''}` };
    const detail = `${n}/${this.expected.count} server tunnel(s) up: ${[...this.connections.keys()].join(', ')}`;
    // Still ready (control plane -> node works), but say when the node -> control plane direction is not.
    if (!(this.opts.features ?? AGENT_FEATURES).has(Feature.NodeDial)) return { ready: true, detail };
    const without = [...this.connections.values()].filter((c) => !c.tunnel.features.has(Feature.NodeDial)).map((c) => c.serverID);
    if (without.length === 0) return { ready: true, detail };
    const note =
      without.length === n
        ? 'node -> control plane dials unavailable: no connected server supports them (upstream Konnectivity?)'
        : `node -> control plane dials unavailable through ${without.join(', ')} (server does not support them)`;
    return { ready: true, detail: `${detail}; ${note}` };
  }

  stats(): AgentStats {
    return {
      tunnels: [...this.connections.values()].map((c) => ({
        serverID: c.serverID,
        features: formatFeatures(c.tunnel.features),
        ...c.tunnel.stats(),
      })),
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
    if (this.opts.health) {
      this.health = await startHealthServer({
        ...this.opts.health,
        readiness: () => this.readiness(),
        registry: this.metrics.registry,
        log: this.opts.log,
      });
    }
    // stop() during the await above found nothing started yet: the health port is all there is.
    if (!this.transition(['created'], 'running')) {
      await this.health?.close();
      return;
    }
    this.loop = this.maintain();
    this.opts.log.info({ server: `${this.opts.server.host}:${this.opts.server.port}` }, 'kanal agent started');
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
    for (const c of this.connections.values()) c.tunnel.sendDrain();
    const deadline = Date.now() + graceMs;
    while (Date.now() < deadline && this.openConnections() > 0) await sleep(50);
    const left = this.openConnections();
    if (left > 0) this.opts.log.warn({ connections: left }, 'grace period over; closing remaining connections');
    const closing = [...this.connections.values()];
    for (const c of closing) c.close();
    // Let DRAIN and the end of each stream reach the server before the process exits (bounded).
    await Promise.race([Promise.all(closing.map((c) => c.finished)), sleep(2000, undefined, { ref: false })]);
    await this.loop;
    await this.health?.close();
    this.transition(['draining'], 'stopped');
  }

  private openConnections(): number {
    let n = 0;
    for (const c of this.connections.values()) n += c.tunnel.stats().connections;
    return n;
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

  private async maintain(): Promise<void> {
    const backoff = new Backoff(this.opts.reconnect.initialMs, this.opts.reconnect.maxMs);
    const target = formatHostPort(this.opts.server);
    const { reconnect, syncForever } = this.opts;
    const leases = this.opts.serverCount?.leases;
    let lastAttempt = 0;
    while (this.state === 'running') {
      if (this.connections.size >= this.updateExpected()) {
        const probeIn = syncForever ? lastAttempt + reconnect.maxMs - Date.now() : Infinity;
        if (probeIn > 0) {
          // A lease count changes without a tunnel changing: look again every sync interval.
          await this.tunnelLostOrStopping(Math.min(probeIn, leases ? reconnect.initialMs : Infinity));
          continue;
        }
      }
      lastAttempt = Date.now();
      try {
        const conn = await connectToServer({
          target,
          tls: this.opts.server.tls,
          agentID: this.opts.agentID,
          agentIdentifiers: this.opts.agentIdentifiers,
          token: this.opts.token,
          features: this.opts.features ?? AGENT_FEATURES,
          transport: this.opts.transport,
          dialHandler: this.dialForServer,
          limits: this.opts.limits,
          connectTimeoutMs: this.opts.connectTimeoutMs,
          log: this.opts.log,
          // The agent performs control plane -> node dials and requests node -> control plane ones.
          onConnectionClosed: (c) =>
            this.metrics.connectionClosed(c.role === 'performer' ? 'cp_to_node' : 'node_to_cp', c.bytesOut, c.bytesIn),
          onLimit: (limit) => countTunnelLimit(this.metrics, limit, SERVER_TUNNEL_REFUSALS),
          limitFlags: SERVER_TUNNEL_LIMIT_FLAGS,
        });
        this.announcedServers = conn.serverCount;
        const running = this.state === 'running';
        if (!running || this.connections.has(conn.serverID)) {
          // Landed on a server we already hold (HA behind one address): retry later.
          conn.close();
          if (running) this.opts.log.debug({ serverID: conn.serverID }, 'already connected to this server; will retry for the others');
          await sleep(backoff.next(), undefined, { signal: this.stopping.signal }).catch(() => undefined);
          continue;
        }
        this.adopt(conn);
        backoff.reset();
        this.lastError = '';
      } catch (err) {
        this.lastError = errorMessage(err);
        const wait = backoff.next();
        this.opts.log.warn({ server: target, err: this.lastError, retryInMs: wait }, 'cannot connect to proxy server');
        await sleep(wait, undefined, { signal: this.stopping.signal }).catch(() => undefined);
      }
    }
  }

  /** The number of servers to hold tunnels to now; logs each change with its source. */
  private updateExpected(): number {
    const c = serverCount(this.opts.serverCount?.source ?? 'default', this.opts.serverCount?.leases?.(), this.announcedServers);
    if (c.count !== this.expected.count || c.from !== this.expected.from) {
      this.opts.log.info(
        { serverCount: c.count, from: c.from, previous: this.expected.count, tunnels: this.connections.size },
        'server count changed',
      );
    }
    this.expected = c;
    return c.count;
  }

  /** Resolves when a tunnel goes down, the agent stops, or after `timeoutMs` (Infinity: never). */
  private tunnelLostOrStopping(timeoutMs = Infinity): Promise<void> {
    return new Promise<void>((resolve) => {
      const timer = Number.isFinite(timeoutMs) ? setTimeout(() => wake(), timeoutMs) : undefined;
      const wake = (): void => {
        clearTimeout(timer);
        this.stopping.signal.removeEventListener('abort', wake);
        this.wakeMaintain = undefined;
        resolve();
      };
      this.wakeMaintain = wake;
      this.stopping.signal.addEventListener('abort', wake, { once: true });
    });
  }

  private adopt(conn: ServerConnection): void {
    this.connections.set(conn.serverID, conn);
    const features = formatFeatures(conn.tunnel.features);
    this.opts.log.info(
      { serverID: conn.serverID, serverCount: conn.serverCount, features: features || 'none (upstream server)' },
      'tunnel up',
    );
    if ((this.opts.features ?? AGENT_FEATURES).has(Feature.NodeDial) && !conn.tunnel.features.has(Feature.NodeDial)) {
      this.opts.log.warn(
        { serverID: conn.serverID },
        'server does not support node -> control plane dials (upstream Konnectivity?); that direction is unavailable through it',
      );
    }
    for (const l of this.listeners) l(conn.tunnel, 'up');
    conn.tunnel.once('close', (err) => {
      if (this.connections.get(conn.serverID) === conn) this.connections.delete(conn.serverID);
      this.wakeMaintain?.();
      // A tunnel closed by our own stop is planned; any other loss is worth a warning.
      const running = this.state === 'running';
      const level = running ? 'warn' : 'info';
      if (running && err) this.upstreamMetrics.serverFailures.inc({ direction: 'from_server' });
      this.opts.log[level]({ serverID: conn.serverID, reason: err?.message ?? 'stream ended' }, 'tunnel down');
      for (const l of this.listeners) l(conn.tunnel, 'down');
    });
  }
}
