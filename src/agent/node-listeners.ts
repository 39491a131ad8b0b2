/**
 * Node -> control plane (KEP-2025): listens on the advertise address for
 * each --target and carries every accepted connection to the server over a
 * tunnel that negotiated the direction. A connection that finds no usable
 * tunnel waits a bounded time, then is closed; with only upstream servers
 * it is refused at once, since they would silently drop the dial.
 */
import net from 'node:net';
import type { Logger } from 'pino';
import { Feature } from '../wire/features.js';
import type { Tunnel } from '../tunnel/tunnel.js';
import { splice } from '../tunnel/splice.js';
import { formatHostPort } from '../common/host-port.js';
import { DialError } from '../tunnel/errors.js';
import { listenError } from '../common/listen-error.js';
import type { Target } from './target.js';
import { DEFAULT_LIMITS } from '../tunnel/limits.js';
import type { ServerTunnels } from './server-tunnels.js';
import { Cancel } from '../common/cancel.js';
import { FLAG } from './settings.js';

export interface NodeListenersOptions {
  bindAddress: string;
  targets: readonly Target[];
  tunnelWaitMs: number;
  dialTimeoutMs: number;
  agent: ServerTunnels;
  log: Logger;
}

export interface NodeListenerStats {
  listeners: number;
  waiting: number;
  active: number;
}

export class NodeListeners {
  private readonly servers: net.Server[] = [];
  private readonly sockets = new Set<net.Socket>();
  private waiting = 0;
  private nextTunnel = 0;
  private readonly tunnelWaiters = new Set<() => void>();

  constructor(private readonly opts: NodeListenersOptions) {
    opts.agent.onTunnelChange((_t, change) => {
      if (change !== 'up') return;
      for (const wake of [...this.tunnelWaiters]) wake();
    });
  }

  stats(): NodeListenerStats {
    return { listeners: this.servers.length, waiting: this.waiting, active: this.sockets.size - this.waiting };
  }

  /** Where it listens (each --target) and what it carries now, for the admin port's /status. */
  snapshot(): {
    bindAddress: string;
    targets: { listen: string; destination: string }[];
    listening: boolean;
    waiting: number;
    active: number;
  } {
    const { bindAddress, targets } = this.opts;
    const { waiting, active } = this.stats();
    return {
      bindAddress,
      targets: targets.map((t) => ({ listen: formatHostPort({ host: bindAddress, port: t.localPort }), destination: t.destination })),
      listening: this.servers.length > 0,
      waiting,
      active,
    };
  }

  /** Binds every target; fails as a whole (closing what was bound) if one cannot bind. */
  async start(): Promise<void> {
    for (const target of this.opts.targets) {
      const server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true }, (socket) => this.accept(socket, target));
      try {
        await new Promise<void>((resolve, reject) => {
          server.once('error', reject);
          server.listen({ host: this.opts.bindAddress, port: target.localPort }, () => {
            server.off('error', reject);
            resolve();
          });
        });
      } catch (err) {
        this.stopAccepting();
        const address = formatHostPort({ host: this.opts.bindAddress, port: target.localPort });
        throw listenError(err, address, `${FLAG['bind-address']}, --target ${target.localPort}:${target.destination}`);
      }
      server.on('error', (err) => this.opts.log.error({ err: err.message }, 'listener error'));
      this.servers.push(server);
      this.opts.log.info(
        { listen: formatHostPort({ host: this.opts.bindAddress, port: target.localPort }), destination: target.destination },
        'node listener ready',
      );
    }
  }

  /**
   * Closes the listening sockets; accepted connections continue. Does not wait
   * for them: net.Server's close callback would, and a kubelet's watch keeps
   * its connection open for minutes, past any grace period.
   */
  stopAccepting(): void {
    for (const server of this.servers.splice(0)) server.close();
  }

  /** Closes everything, listeners and connections. */
  close(): void {
    this.stopAccepting();
    for (const s of this.sockets) s.destroy();
    for (const wake of [...this.tunnelWaiters]) wake();
  }

  private usableTunnels(): Tunnel[] {
    return this.opts.agent.tunnels().filter((t) => t.isOpen && t.features.has(Feature.NodeDial));
  }

  private pickTunnel(): Tunnel | undefined {
    const usable = this.usableTunnels();
    if (usable.length === 0) return undefined;
    return usable[this.nextTunnel++ % usable.length];
  }

  private waitForTunnel(socket: net.Socket): Promise<Tunnel | undefined> {
    const now = this.pickTunnel();
    // Waiting sockets hold descriptors with no tunnel to bound them: as many as a tunnel's pending dials.
    if (now || this.opts.agent.tunnels().length > 0 || this.waiting >= DEFAULT_LIMITS.maxPendingDials) return Promise.resolve(now);
    this.waiting++;
    return new Promise<Tunnel | undefined>((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.tunnelWaiters.delete(wake);
        socket.off('close', done);
        this.waiting--;
        resolve(this.pickTunnel());
      };
      const wake = (): void => done();
      const timer = setTimeout(done, this.opts.tunnelWaitMs);
      this.tunnelWaiters.add(wake);
      socket.once('close', done);
    });
  }

  private accept(socket: net.Socket, target: Target): void {
    const peer = formatHostPort({ host: socket.remoteAddress ?? 'unknown', port: socket.remotePort ?? 0 });
    const accepted = performance.now();
    const client = { address: peer };
    const { auditor } = this.opts.agent;
    const log = this.opts.log.child({ peer, destination: target.destination });
    this.sockets.add(socket);
    socket.on('error', () => undefined);
    const abort = new Cancel();
    socket.on('close', () => {
      this.sockets.delete(socket);
      abort.abort();
    });
    this.waitForTunnel(socket)
      .then((tunnel) => {
        if (socket.destroyed) return undefined;
        if (!tunnel) {
          const haveTunnels = this.opts.agent.tunnels().length > 0;
          const result = haveTunnels ? 'unsupported-by-server' : 'no-tunnel';
          this.opts.agent.metrics.dialDone('node_to_cp', result, performance.now());
          const message = haveTunnels
            ? 'refused node connection: no connected server supports node -> control plane dials (upstream Konnectivity server?)'
            : `refused node connection: no tunnel to a proxy server within ${this.opts.tunnelWaitMs} ms`;
          log.warn(message);
          auditor.dialFailed({
            direction: 'node_to_cp',
            client,
            destination: target.destination,
            error: message,
            startedAt: accepted,
            result,
          });
          socket.destroy();
          return undefined;
        }
        const t0 = performance.now();
        const party = this.opts.agent.partyOf(tunnel);
        return tunnel.dial(target.destination, { timeoutMs: this.opts.dialTimeoutMs, signal: abort }).then(
          (conn) => {
            conn.client = client;
            this.opts.agent.metrics.dialDone('node_to_cp', 'ok', t0);
            if (socket.destroyed) {
              conn.close();
              return;
            }
            log.debug({ connectID: conn.connectID, dialID: String(conn.dialID) }, 'node connection tunnelled');
            splice(socket, conn);
          },
          (err: unknown) => {
            auditor.dialFailed({ direction: 'node_to_cp', party, client, destination: target.destination, error: err, startedAt: t0 });
            throw err;
          },
        );
      })
      .catch((err: Error) => {
        this.opts.agent.metrics.dials.inc({ direction: 'node_to_cp', result: err instanceof DialError ? err.failure : 'refused' });
        log.warn({ err: err.message }, 'node connection refused by the server');
        socket.destroy();
      });
  }
}
