/**
 * The peer's dials this side performs: each DIAL_REQ is checked (a handler,
 * the protocol, a fresh dial ID, the limits), handed to the DialHandler with a
 * cancel signal that the peer's DIAL_CLS or the tunnel's close aborts, and
 * answered with DIAL_RSP (docs/protocol.md, docs/limits.md).
 */
import { Cancel } from '../common/cancel.js';
import type { RateLimitedLog } from '../common/rate-limited-log.js';
import { PacketType, type Packet } from '../wire/packet.js';
import { TunnelConnection } from './connection.js';
import type { DialHandler } from './dial-handler.js';
import type { LimitReports } from './limit-reports.js';
import type { DialAllowance } from './dial-allowance.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import { DialError } from './errors.js';
import type { InboundDialFailure } from './tunnel-options.js';
import { splice } from './splice.js';
import { resetSocket } from './socket-reset.js';

export interface InboundDialsOptions {
  noise: RateLimitedLog;
  /** Sends a packet to the peer (nothing while the tunnel is not open). */
  send(packet: Packet): void;
  /** Open, or detached waiting for a resume (a dial that connects meanwhile is kept; its DIAL_RSP is sent again on request). */
  isAlive(): boolean;
  reports: LimitReports;
  /**
   * What the peer's identity may still dial, shared by all its tunnels: the
   * dials and connections maxPendingDials and maxInboundConnections count,
   * and the rate (TunnelLimits.dialRate), taken only by a dial every other check let through.
   */
  allowance: DialAllowance;
  /** The handler now (Tunnel.setDialHandler may change it), or undefined to refuse every dial. */
  handler(): DialHandler | undefined;
  /** Text of the refusal when there is no handler. */
  refuseDialsReason?: string;
  /** Told of each dial not connected: refused, failed or cancelled (the audit log). */
  onFailed?: (failure: InboundDialFailure) => void;
  /** Adds a connection, with a connectID of this side's parity, for a dial that connected. */
  openConnection(dialID: bigint, address: string): TunnelConnection;
}

export class InboundDials {
  /** Counted, with those of the identity's other tunnels, in maxPendingDials and maxInboundConnections. */
  private readonly performing = new Map<bigint, Cancel>();

  constructor(private readonly opts: InboundDialsOptions) {}

  get size(): number {
    return this.performing.size;
  }

  /** DIAL_REQ from the peer. */
  requested(protocol: string, address: string, dialID: bigint): void {
    const { opts } = this;
    const t0 = performance.now();
    /** `limit`: a limit refused it (exhaustion), not the request itself. */
    const refuse = (error: string, limit?: { reason?: RefusalReason }): void => {
      opts.noise.warn('dial-refused', { dialID: String(dialID), address, reason: error }, 'refusing dial request');
      opts.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: 0, error });
      const reason = limit?.reason;
      opts.onFailed?.({ dialID, address, result: limit ? 'exhausted' : 'refused', error, ...(reason ? { reason } : {}), ms: 0 });
    };
    const handler = opts.handler();
    if (!handler) return refuse(opts.refuseDialsReason ?? 'this side does not accept dial requests');
    if (protocol !== 'tcp') return refuse(`unsupported protocol ${JSON.stringify(protocol)}`);
    if (this.performing.has(dialID)) return refuse('duplicate dial ID');
    const held = opts.allowance.holdings();
    const refusal =
      opts.reports.overLimit('maxPendingDials', held.inboundPending, 'dials waiting for an answer') ??
      opts.reports.overLimit(
        'maxInboundConnections',
        held.inboundPending + held.inboundConnections,
        'connections open or being dialled for the peer',
      ) ??
      opts.reports.overRate(opts.allowance.inbound);
    if (refusal) return refuse(refusal.message, refusal);
    const abort = new Cancel();
    this.performing.set(dialID, abort);
    handler({ protocol, address, dialID, signal: abort }).then(
      (endpoint) => {
        this.performing.delete(dialID);
        if (abort.aborted || !opts.isAlive()) {
          // The requester gave up: the endpoint is cut, not finished (docs/frontends.md, "How a connection ends").
          if (endpoint instanceof TunnelConnection) endpoint.close(new Error('dial cancelled'), 'proxy');
          // No error: nobody listens on the endpoint yet, and the reset says it all.
          else resetSocket(endpoint);
          opts.onFailed?.({ dialID, address, result: 'cancelled', error: 'dial cancelled by the requester', ms: performance.now() - t0 });
          return;
        }
        const conn = opts.openConnection(dialID, address);
        conn.dialMs = performance.now() - t0;
        // DIAL_RSP before the splice: the endpoint's first bytes must follow it.
        opts.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: conn.connectID, error: '' });
        splice(endpoint, conn);
      },
      (err: Error) => {
        this.performing.delete(dialID);
        const ms = performance.now() - t0;
        if (abort.aborted || !opts.isAlive()) {
          opts.onFailed?.({ dialID, address, result: 'cancelled', error: 'dial cancelled by the requester', ms });
          return;
        }
        opts.noise.info('dial-failed', { dialID: String(dialID), address, err: err.message }, 'dial failed');
        opts.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: 0, error: err.message });
        const known = err instanceof DialError ? err : undefined;
        const reason = known?.refusal;
        opts.onFailed?.({ dialID, address, result: known?.failure ?? 'refused', error: err.message, ...(reason ? { reason } : {}), ms });
      },
    );
  }

  isPerforming(dialID: bigint): boolean {
    return this.performing.has(dialID);
  }

  /** DIAL_CLS from the peer for a dial we perform; false when it is not one. */
  cancelledByPeer(dialID: bigint): boolean {
    const inbound = this.performing.get(dialID);
    if (!inbound) return false;
    this.performing.delete(dialID);
    inbound.abort();
    return true;
  }

  /** The tunnel closed: every dial being performed is aborted. */
  abortAll(): void {
    for (const [id, abort] of this.performing) {
      this.performing.delete(id);
      abort.abort();
    }
  }
}
