/**
 * The tunnels the agent holds, by server: up (at most one per server), and
 * detached — their stream lost, their connections waiting for a resume
 * (docs/protocol.md) — until the tunnel resumes or closes. Follows each
 * tunnel's 'detached', 'resume-expired' and 'close' and moves it between the two.
 */
import type { Logger } from 'pino';
import type { Tunnel } from '../tunnel/tunnel.js';
import { sentBytesSlabs } from '../tunnel/slab-pool.js';
import type { KanalMetrics } from '../domain/metrics.js';
import { ResumeMetrics } from '../domain/resume-metrics.js';
import type { ServerConnection } from './server-connection.js';

/** A tunnel the agent holds, and the address it came through. */
export interface HeldTunnel {
  conn: ServerConnection;
  /** The endpoint's target ("host:port") it was opened to. */
  address: string;
}

export interface HeldTunnelsOptions {
  metrics: KanalMetrics;
  log: Logger;
  resumeTimeoutMs: number | undefined;
  /** Whether the agent runs: a loss then is unplanned (a warning and a server failure), else expected (info). */
  running: () => boolean;
  /** A tunnel up was lost while running (upstream's server_connection_failure_count). */
  serverFailure: () => void;
  /** A tunnel that was up is not any more (detached or closed). */
  down: (tunnel: Tunnel) => void;
  /** A tunnel left the up or detached table: loops waiting for a change look again. */
  changed: () => void;
}

export class HeldTunnels {
  /** Tunnels up, by serverID: at most one per server; a tunnel leaves on its 'close' or 'detached'. */
  readonly up = new Map<string, HeldTunnel>();
  /** Tunnels whose stream was lost, waiting to resume, by serverID; each leaves on its resume or 'close'. */
  readonly detached = new Map<string, HeldTunnel>();
  readonly resumeMetrics: ResumeMetrics;

  constructor(private readonly opts: HeldTunnelsOptions) {
    this.resumeMetrics = new ResumeMetrics(opts.metrics, {
      detached: () => ({ tunnels: this.detached.size, connections: sum(this.detached.values(), (t) => t.stats().connections) }),
      retainedBytes: () => sum(this.up.values(), (t) => t.retainedBytes()) + sum(this.detached.values(), (t) => t.retainedBytes()),
      slabBytes: () => sentBytesSlabs.bytes,
    });
  }

  /** A tunnel new or resumed through `address`: held up, and (new) followed until it closes. */
  hold(conn: ServerConnection, address: string): void {
    if (this.detached.get(conn.serverID)?.conn.tunnel === conn.tunnel) this.detached.delete(conn.serverID);
    this.up.set(conn.serverID, { conn, address });
    if (!conn.resumed) this.watch(conn.tunnel, conn.serverID);
  }

  /** Whether a tunnel to `serverID` is up. */
  holds(serverID: string | undefined): boolean {
    return serverID !== undefined && this.up.has(serverID);
  }

  /** Whether a tunnel is up through `address`. */
  through(address: string): boolean {
    for (const h of this.up.values()) if (h.address === address) return true;
    return false;
  }

  /** The detached tunnels by the resume token their server gave, to be named on the next stream. */
  resumable(): Map<string, Tunnel> {
    return new Map([...this.detached.values()].flatMap((h) => (h.conn.resumeToken ? [[h.conn.resumeToken, h.conn.tunnel] as const] : [])));
  }

  /**
   * A server that answered without resuming the tunnel we hold detached
   * for it (same serverID) no longer has it: restarted, or its timeout
   * passed. Its connections are closed now, not at our timeout.
   */
  forgottenBy(conn: ServerConnection): void {
    const lost = this.detached.get(conn.serverID);
    if (!lost || lost.conn.tunnel === conn.tunnel) return;
    this.resumeMetrics.results.inc({ result: 'refused' });
    this.opts.log.warn(
      { serverID: conn.serverID, connections: lost.conn.tunnel.stats().connections },
      'server no longer holds the tunnel (restarted?); its connections are closed',
    );
    lost.conn.tunnel.close(new Error(`server ${conn.serverID} no longer holds the tunnel (restarted?)`));
  }

  /** `address` refuses connections and its server is known gone with it: the tunnels detached through it are closed. */
  refusedThrough(address: string): void {
    for (const lost of [...this.detached.values()]) {
      if (lost.address !== address) continue;
      this.opts.log.warn(
        { serverID: lost.conn.serverID, address: lost.address, connections: lost.conn.tunnel.stats().connections },
        'server refuses connections (its process is gone); the connections of its tunnel are closed',
      );
      lost.conn.tunnel.close(new Error(`server ${lost.conn.serverID} at ${lost.address} refuses connections`));
    }
  }

  /** Tunnelled connections open through the tunnels up. */
  openConnections(): number {
    return sum(this.up.values(), (t) => t.stats().connections);
  }

  /** What a graceful stop waits for: open connections, and dials either way that will become ones. */
  inFlight(): number {
    return sum(this.up.values(), (t) => {
      const st = t.stats();
      return st.connections + st.pendingDials + st.inboundDials;
    });
  }

  /** Receive-window growth held by the connections of the tunnels up. */
  windowGrowthBytes(): number {
    return sum(this.up.values(), (t) => t.stats().windowGrowthBytes);
  }

  /** Follows a new tunnel through its losses, resumes and close (once per tunnel: a resume keeps the listeners). */
  private watch(tunnel: Tunnel, serverID: string): void {
    this.resumeMetrics.watch(tunnel);
    const isHeld = (m: Map<string, HeldTunnel>): HeldTunnel | undefined => {
      const h = m.get(serverID);
      return h?.conn.tunnel === tunnel ? h : undefined;
    };
    tunnel.on('detached', (err) => {
      const held = isHeld(this.up);
      if (!held) return;
      this.up.delete(serverID);
      this.detached.set(serverID, held);
      if (this.opts.running()) this.opts.serverFailure();
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
      this.opts.down(tunnel);
      this.opts.changed();
    });
    tunnel.on('resume-expired', () =>
      this.opts.log.warn({ serverID, connections: tunnel.stats().connections }, 'tunnel not resumed in time; its connections are closed'),
    );
    tunnel.once('close', (err) => {
      const held = isHeld(this.up);
      const wasUp = held !== undefined;
      if (held) this.up.delete(serverID);
      const detached = isHeld(this.detached);
      if (detached) this.detached.delete(serverID);
      this.opts.changed();
      // A tunnel closed by our own stop is planned; any other loss is worth a warning.
      const running = this.opts.running();
      const level = running ? 'warn' : 'info';
      if (running && err && wasUp) this.opts.serverFailure();
      this.opts.log[level]({ serverID, address: (held ?? detached)?.address, reason: err?.message ?? 'stream ended' }, 'tunnel down');
      if (wasUp) this.opts.down(tunnel);
    });
  }
}

function sum(held: Iterable<HeldTunnel>, of: (tunnel: Tunnel) => number): number {
  let n = 0;
  for (const h of held) n += of(h.conn.tunnel);
  return n;
}
