/**
 * Performs agent-initiated dials (node -> control plane) for the server,
 * strictly within the allow-list. A refusal dials nothing.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import { dialTcp } from '../common/tcp-dial.js';
import { DialError } from '../tunnel/errors.js';
import type { InboundDial } from '../tunnel/tunnel.js';
import type { AllowList } from './allow-list.js';
import type { KanalMetrics } from '../common/metrics.js';

export class DestinationDialer {
  constructor(
    private readonly allowList: AllowList,
    private readonly timeoutMs: number,
    private readonly log: Logger,
    private readonly metrics?: KanalMetrics,
  ) {}

  /** `agent` labels the log lines: the agentID and the credential that authenticated it. */
  async dial(agent: { agentID: string; credential: string }, dial: InboundDial): Promise<Duplex> {
    const t0 = performance.now();
    if (!this.allowList.allows(dial.address)) {
      this.metrics?.dialDone('node_to_cp', 'forbidden', t0);
      this.metrics?.refusals.inc({ reason: 'destination_not_allowed' });
      this.log.warn(
        { ...agent, dialID: String(dial.dialID), address: dial.address, allowed: this.allowList.list() },
        this.allowList.empty ? 'refused node dial: no --allowed-destination configured' : 'refused node dial: destination not on the allow-list',
      );
      throw new DialError('forbidden', `destination ${dial.address} is not allowed by the proxy server`);
    }
    let socket;
    try {
      socket = await dialTcp(dial.address, { timeoutMs: this.timeoutMs, signal: dial.signal });
    } catch (err) {
      this.metrics?.dialDone('node_to_cp', err instanceof DialError ? err.failure : 'refused', t0);
      throw err;
    }
    this.metrics?.dialDone('node_to_cp', 'ok', t0);
    this.log.debug({ ...agent, dialID: String(dial.dialID), address: dial.address }, 'node dial connected');
    return socket;
  }
}
