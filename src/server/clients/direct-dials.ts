/**
 * Dials on a tenant's direct routes as the frontends' clients make them:
 * the routes' own dial (direct-routes.ts), counted (direct-metrics.ts),
 * logged when it fails, and audited as a tunnelled connection is — a `dial`
 * record with `via: direct` when it fails, a `direct` record and the
 * `connection ended` line when it ends (docs/operations.md). The KAS's path
 * and a clients policy's both dial here, so neither goes around the audit.
 */
import type net from 'node:net';
import type { Logger } from 'pino';
import type { Registry } from 'prom-client';
import type { CancelSignal } from '../../common/cancel.js';
import { errorMessage } from '../../common/error-message.js';
import { truncateForLog } from '../../common/log-safety.js';
import { RateLimitedLog } from '../../common/rate-limited-log.js';
import { REFUSAL_LOG_INTERVAL_MS } from '../../domain/refusal-log.js';
import type { ConnectionAuditor, DirectConnection } from '../../audit/connection-auditor.js';
import { DialError } from '../../tunnel/errors.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { DirectMetrics } from './direct-metrics.js';
import type { DirectRoutes } from './direct-routes.js';

export interface DirectDialsOptions {
  routes: DirectRoutes;
  /** --destination-dial-timeout now (a reload may change it). */
  timeoutMs: () => number;
  /** The tenant's registry: the metrics are registered on it at the first dial. */
  registry: Registry;
  log: Logger;
  auditor?: ConnectionAuditor;
}

export class DirectDials {
  private metrics: DirectMetrics | undefined;
  private readonly failures: RateLimitedLog;

  constructor(private readonly opts: DirectDialsOptions) {
    this.failures = new RateLimitedLog(opts.log, REFUSAL_LOG_INTERVAL_MS);
  }

  /** No route: every destination goes through an agent. */
  get empty(): boolean {
    return this.opts.routes.empty;
  }

  matches(host: string, port: number): boolean {
    return this.opts.routes.matches(host, port);
  }

  /** Dials `address` (a direct route) for `client`; rejects with the routes' DialError, counted, logged and audited. */
  async dial(address: string, client: ClientIdentity, signal?: CancelSignal): Promise<net.Socket> {
    const metrics = (this.metrics ??= new DirectMetrics(this.opts.registry));
    const t0 = performance.now();
    let socket: net.Socket;
    try {
      socket = await this.opts.routes.dial(address, this.opts.timeoutMs(), signal);
    } catch (err) {
      const failure = err instanceof DialError ? err.failure : 'refused';
      metrics.dialed(failure);
      // The address is the client's choice: its key and field are cut to a host:port's length.
      const shown = truncateForLog(address, 260);
      this.failures.warn(
        `${failure} ${shown}`,
        { address: shown, client: client.address, err: errorMessage(err) },
        'direct-route dial failed',
      );
      this.opts.auditor?.dialFailed({ direction: 'cp_to_node', client, destination: address, error: err, startedAt: t0, via: 'direct' });
      throw err;
    }
    metrics.dialed('ok');
    this.watch(socket, client, address, performance.now() - t0, metrics);
    return socket;
  }

  /** Counts and audits the connection once, as it closes; who ended it is the end whose FIN or error came first. */
  private watch(socket: net.Socket, client: ClientIdentity, destination: string, dialMs: number, metrics: DirectMetrics): void {
    const openedAt = Date.now();
    let first: 'client' | 'destination' | undefined;
    let error: Error | undefined;
    let fins = 0;
    socket.once('end', () => {
      first ??= 'destination';
      fins++;
    });
    socket.once('finish', () => {
      first ??= 'client';
      fins++;
    });
    socket.once('error', (err) => {
      error ??= err;
      first ??= 'destination';
    });
    socket.once('close', () => {
      const ended: DirectConnection = {
        client,
        destination,
        dialMs,
        toDestination: socket.bytesWritten,
        toClient: socket.bytesRead,
        durationMs: Date.now() - openedAt,
        // Destroyed by the proxy without a FIN either way: the client's side went (joinDialed ends both).
        closedBy: first ?? 'client',
        reason: error ? errorMessage(error) : fins === 2 ? 'finished' : 'closed',
      };
      metrics.closed(ended.toDestination, ended.toClient);
      this.opts.auditor?.directEnded(ended);
    });
  }
}
