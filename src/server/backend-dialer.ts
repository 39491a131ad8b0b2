/**
 * Dials through some agent on behalf of a frontend (the KAS). Shared by the
 * HTTP CONNECT and gRPC frontends so both route and fail the same way.
 */
import type { Logger } from 'pino';
import { DialError } from '../tunnel/errors.js';
import type { TunnelConnection } from '../tunnel/connection.js';
import type { AgentRegistry } from './agent-registry.js';
import type { KanalMetrics } from '../common/metrics.js';

export class BackendDialer {
  constructor(
    private readonly registry: AgentRegistry,
    private readonly timeoutMs: number,
    private readonly log: Logger,
    private readonly metrics?: KanalMetrics,
  ) {}

  async dial(address: string, signal?: AbortSignal): Promise<TunnelConnection> {
    const t0 = performance.now();
    const backend = await this.registry.pickVerified();
    if (!backend) {
      this.metrics?.dialDone('cp_to_node', 'no-backend', t0);
      this.log.warn({ address }, 'no agent available for dial');
      throw new DialError('no-backend', 'no agent is connected to this proxy server');
    }
    const started = Date.now();
    try {
      const conn = await backend.tunnel.dial(address, { timeoutMs: this.timeoutMs, signal });
      this.metrics?.dialDone('cp_to_node', 'ok', t0);
      this.log.debug({ agentID: backend.agentID, credential: backend.credential.subject, address, connectID: conn.connectID, dialID: String(conn.dialID), ms: Date.now() - started }, 'dial established');
      return conn;
    } catch (err) {
      const failure = err instanceof DialError ? err.failure : 'refused';
      this.metrics?.dialDone('cp_to_node', failure, t0);
      // An agent that lets a dial time out may be gone without a FIN: check now rather than at the next keepalive (#11).
      if (failure === 'timeout') this.registry.verify(backend);
      const level = failure === 'cancelled' ? 'debug' : 'warn';
      this.log[level]({ agentID: backend.agentID, credential: backend.credential.subject, address, failure, err: (err as Error).message, ms: Date.now() - started }, 'dial failed');
      throw err;
    }
  }
}
