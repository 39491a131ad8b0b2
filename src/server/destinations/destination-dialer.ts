/**
 * Performs agent-initiated dials (node -> control plane) for the server,
 * strictly within the allow-list and within the server-wide cap on such
 * connections (each holds a file descriptor here). A refusal dials nothing.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { dialTcp } from '../../tunnel/tcp-dial.js';
import { truncateForLog } from '../../common/log-safety.js';
import { DialError } from '../../tunnel/errors.js';
import type { InboundDial } from '../../tunnel/tunnel.js';
import type { AllowList } from './allow-list.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import type { ConnectionBudget } from '../../domain/connection-budget.js';
import type { DialingAgent, Refusals } from '../../domain/refusal-log.js';
import { isQuotaRefusal, type DialQuota } from '../../domain/dial-quota.js';
import { NOT_ALLOWED_BY_SERVER } from '../../domain/dial-result.js';

export interface DestinationDialerOptions {
  allowList: AllowList;
  /** How long a TCP connect may take (--destination-dial-timeout). */
  timeoutMs: number;
  /** Node -> control plane connections of all agents, being dialled or open (--max-node-to-cp-connections). */
  budget: ConnectionBudget;
  log: Logger;
  refusals: Refusals;
  metrics?: KanalMetrics;
  /** The tenant's share of the server (tenants/tenant-quota.ts); absent: a server of one cluster. */
  quota?: DialQuota;
}

export class DestinationDialer {
  private readonly allowList: AllowList;
  private timeoutMs: number;
  private readonly budget: ConnectionBudget;
  private readonly log: Logger;
  private readonly refusals: Refusals;
  private readonly metrics: KanalMetrics | undefined;
  private readonly quota: DialQuota | undefined;

  constructor(opts: DestinationDialerOptions) {
    this.allowList = opts.allowList;
    this.timeoutMs = opts.timeoutMs;
    this.budget = opts.budget;
    this.log = opts.log;
    this.refusals = opts.refusals;
    this.metrics = opts.metrics;
    this.quota = opts.quota;
  }

  /** A tenant's --destination-dial-timeout changed in its file (its allow-list is replaced in place). */
  configure(o: { timeoutMs: number }): void {
    this.timeoutMs = o.timeoutMs;
  }

  /** Whether a dial to `address` (host:port) would pass the allow-list: what an agent's --target is told at connect. */
  allows(address: string): boolean {
    return this.allowList.allows(address);
  }

  /** `agent` labels the log lines: the agentID and the credential that authenticated it. */
  async dial(agent: DialingAgent, dial: InboundDial): Promise<Duplex> {
    const t0 = performance.now();
    if (!this.allowList.allows(dial.address)) {
      this.metrics?.dialDone('node_to_cp', 'forbidden', t0);
      this.refusals.refuseAgent(
        'destination_not_allowed',
        agent,
        { dialID: String(dial.dialID), address: dial.address, allowed: this.allowList.list() },
        this.allowList.empty
          ? 'refused node dial: no --allowed-destination configured'
          : 'refused node dial: destination not on the allow-list',
      );
      throw new DialError(
        'forbidden',
        `destination ${truncateForLog(dial.address, 80)} ${NOT_ALLOWED_BY_SERVER}`,
        'destination_not_allowed',
      );
    }
    const ticket = this.quota?.take();
    if (ticket && isQuotaRefusal(ticket)) {
      this.metrics?.dialDone('node_to_cp', 'exhausted', t0);
      this.refusals.refuseAgent(ticket.reason, agent, { address: dial.address }, "refused node dial: over the tenant's limits");
      throw new DialError('exhausted', ticket.message, ticket.reason);
    }
    const release = this.budget.take();
    if (!release) {
      ticket?.done();
      this.metrics?.dialDone('node_to_cp', 'exhausted', t0);
      this.refusals.refuseAgent(
        'node_to_cp_connections',
        agent,
        { address: dial.address, limit: this.budget.limit, flag: '--max-node-to-cp-connections' },
        'refused node dial: the server holds as many node -> control plane connections as it may',
      );
      throw new DialError(
        'exhausted',
        `the proxy server holds its maximum of ${this.budget.limit} node -> control plane connections`,
        'node_to_cp_connections',
      );
    }
    let socket;
    try {
      socket = await dialTcp(dial.address, { timeoutMs: this.timeoutMs, signal: dial.signal });
    } catch (err) {
      release();
      ticket?.done();
      this.metrics?.dialDone('node_to_cp', err instanceof DialError ? err.failure : 'refused', t0);
      throw err;
    }
    ticket?.connected();
    socket.once('close', () => {
      release();
      ticket?.done();
    });
    this.metrics?.dialDone('node_to_cp', 'ok', t0);
    this.log.debug(
      { agentID: agent.agentID, credential: agent.credential, dialID: String(dial.dialID), address: dial.address },
      'node dial connected',
    );
    return socket;
  }
}
