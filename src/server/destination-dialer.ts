/**
 * Performs agent-initiated dials (node -> control plane) for the server,
 * strictly within the allow-list. A refusal dials nothing.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { dialTcp } from '../common/tcp-dial.js';
import { truncateForLog } from '../common/log-safety.js';
import { DialError } from '../tunnel/errors.js';
import type { InboundDial } from '../tunnel/tunnel.js';
import type { AllowList } from './allow-list.js';
import type { KanalMetrics } from '../common/metrics.js';
import type { Refusals } from './refusals.js';

export class DestinationDialer {
  constructor(
    private readonly allowList: AllowList,
    private readonly timeoutMs: number,
    private readonly log: Logger,
    private readonly refusals: Refusals,
    private readonly metrics?: KanalMetrics,
  ) {}

  async dial(agentID: string, dial: InboundDial): Promise<Duplex> {
    const t0 = performance.now();
    if (!this.allowList.allows(dial.address)) {
      this.metrics?.dialDone('node_to_cp', 'forbidden', t0);
      // Keyed by agent: one agent's refusals cannot hide another's.
      this.refusals.refuse(
        'destination_not_allowed',
        `agent ${agentID}`,
        { agentID, dialID: String(dial.dialID), address: dial.address, allowed: this.allowList.list() },
        this.allowList.empty ? 'refused node dial: no --allowed-destination configured' : 'refused node dial: destination not on the allow-list',
      );
      throw new DialError('forbidden', `destination ${truncateForLog(dial.address, 80)} is not allowed by the proxy server`);
    }
    let socket;
    try {
      socket = await dialTcp(dial.address, { timeoutMs: this.timeoutMs, signal: dial.signal });
    } catch (err) {
      this.metrics?.dialDone('node_to_cp', err instanceof DialError ? err.failure : 'refused', t0);
      throw err;
    }
    this.metrics?.dialDone('node_to_cp', 'ok', t0);
    this.log.debug({ agentID, dialID: String(dial.dialID), address: dial.address }, 'node dial connected');
    return socket;
  }
}
