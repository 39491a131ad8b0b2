/**
 * Performs agent-initiated dials (node -> control plane) for the server,
 * strictly within the allow-list and within the server-wide cap on such
 * connections (each holds a file descriptor here). A refusal dials nothing.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { dialTcp } from '../common/tcp-dial.js';
import { DialError } from '../tunnel/errors.js';
import type { InboundDial } from '../tunnel/tunnel.js';
import type { AllowList } from './allow-list.js';
import type { KanalMetrics } from '../common/metrics.js';
import { ConnectionBudget } from '../common/connection-budget.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';

export class DestinationDialer {
  private readonly noise: RateLimitedLog;

  constructor(
    private readonly allowList: AllowList,
    private readonly timeoutMs: number,
    /** Node -> control plane connections of all agents, being dialled or open (--max-node-to-cp-connections). */
    private readonly budget: ConnectionBudget,
    private readonly log: Logger,
    private readonly metrics?: KanalMetrics,
  ) {
    this.noise = new RateLimitedLog(log, 10_000);
  }

  async dial(agentID: string, dial: InboundDial): Promise<Duplex> {
    const t0 = performance.now();
    if (!this.allowList.allows(dial.address)) {
      this.metrics?.dialDone('node_to_cp', 'forbidden', t0);
      this.metrics?.refusals.inc({ reason: 'destination_not_allowed' });
      this.log.warn(
        { agentID, dialID: String(dial.dialID), address: dial.address, allowed: this.allowList.list() },
        this.allowList.empty ? 'refused node dial: no --allowed-destination configured' : 'refused node dial: destination not on the allow-list',
      );
      throw new DialError('forbidden', `destination ${dial.address} is not allowed by the proxy server`);
    }
    const release = this.budget.take();
    if (!release) {
      this.metrics?.dialDone('node_to_cp', 'exhausted', t0);
      this.metrics?.refusals.inc({ reason: 'node_to_cp_connections' });
      this.noise.warn('budget', { agentID, address: dial.address, limit: this.budget.limit, flag: '--max-node-to-cp-connections' }, 'refused node dial: the server holds as many node -> control plane connections as it may');
      throw new DialError('exhausted', `the proxy server holds its maximum of ${this.budget.limit} node -> control plane connections`);
    }
    let socket;
    try {
      socket = await dialTcp(dial.address, { timeoutMs: this.timeoutMs, signal: dial.signal });
    } catch (err) {
      release();
      this.metrics?.dialDone('node_to_cp', err instanceof DialError ? err.failure : 'refused', t0);
      throw err;
    }
    socket.once('close', release);
    this.metrics?.dialDone('node_to_cp', 'ok', t0);
    this.log.debug({ agentID, dialID: String(dial.dialID), address: dial.address }, 'node dial connected');
    return socket;
  }
}
