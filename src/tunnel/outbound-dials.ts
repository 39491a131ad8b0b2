/**
 * Our dials awaiting the peer's answer: a DIAL_REQ went out, and each dial
 * waits, with its timer and its requester's cancel signal, for DIAL_RSP, for
 * the peer's DIAL_CLS, or for the tunnel to close (docs/protocol.md). At most
 * maxPendingDials (Tunnel.dial checks before starting one).
 */
import type { Logger } from 'pino';
import { PacketType, type Packet } from '../wire/packet.js';
import type { TunnelConnection } from './connection.js';
import type { DialOptions } from './dial-handler.js';
import { randomDialID } from './dial-id.js';
import { DialError } from './errors.js';
import { answeredFailure } from '../domain/dial-result.js';
import type { LimitReports } from './limit-reports.js';
import type { DialAllowance } from './dial-allowance.js';

interface PendingDial {
  address: string;
  /** performance.now() as the DIAL_REQ went out. */
  startedAt: number;
  protocol: string;
  resolve(conn: TunnelConnection): void;
  reject(err: Error): void;
  cleanup(): void;
}

export interface OutboundDialsOptions {
  log: Logger;
  /** Sends a packet to the peer (nothing while the tunnel is not open). */
  send(packet: Packet): void;
  reports: LimitReports;
  /**
   * What this side's identity may still ask for, shared by all its tunnels:
   * the dials and connections maxPendingDials and maxOutboundConnections
   * count, and the rate (TunnelLimits.dialRate): over it a dial fails here, before it costs the peer anything.
   */
  allowance: DialAllowance;
  /** Adds the connection the peer opened for a dial, or returns undefined when its connectID is taken. */
  openConnection(connectID: number, dialID: bigint, address: string): TunnelConnection | undefined;
}

export class OutboundDials {
  private readonly pending = new Map<bigint, PendingDial>();

  constructor(private readonly opts: OutboundDialsOptions) {}

  get size(): number {
    return this.pending.size;
  }

  /** Sends DIAL_REQ for `address` unless a limit refuses; settles on the answer, a timeout, the requester's cancel, or the tunnel's close. */
  start(address: string, opts: DialOptions): Promise<TunnelConnection> {
    const { reports, allowance } = this.opts;
    const held = allowance.holdings();
    const refusal =
      reports.overLimit('maxPendingDials', held.outboundPending, 'dials waiting for an answer') ??
      reports.overLimit(
        'maxOutboundConnections',
        held.outboundPending + held.outboundConnections,
        'connections open or being dialled through this tunnel',
      );
    if (refusal) return Promise.reject(new DialError('exhausted', refusal.message, refusal.reason));
    if (opts.signal?.aborted) return Promise.reject(new DialError('cancelled', 'dial cancelled'));
    const throttled = reports.overRate(allowance.outbound);
    if (throttled) return Promise.reject(new DialError('exhausted', throttled.message, throttled.reason));
    let dialID = randomDialID();
    while (this.pending.has(dialID)) dialID = randomDialID();
    return new Promise<TunnelConnection>((resolve, reject) => {
      const cancel = (failure: 'timeout' | 'cancelled', message: string): void => {
        if (!this.pending.has(dialID)) return;
        this.pending.get(dialID)?.cleanup();
        this.pending.delete(dialID);
        this.opts.send({ type: PacketType.DIAL_CLS, random: dialID });
        this.opts.log.debug({ dialID: String(dialID), address }, `dial ${failure}`);
        reject(withDialID(new DialError(failure, message), dialID));
      };
      const timer = setTimeout(() => cancel('timeout', `dial to ${address} timed out after ${opts.timeoutMs} ms`), opts.timeoutMs);
      const onAbort = (): void => cancel('cancelled', 'dial cancelled by requester');
      opts.signal?.addEventListener('abort', onAbort);
      this.pending.set(dialID, {
        address,
        startedAt: performance.now(),
        protocol: opts.protocol ?? 'tcp',
        resolve,
        reject,
        cleanup: () => {
          clearTimeout(timer);
          opts.signal?.removeEventListener('abort', onAbort);
        },
      });
      this.opts.send({ type: PacketType.DIAL_REQ, protocol: opts.protocol ?? 'tcp', address, random: dialID });
    });
  }

  isPending(dialID: bigint): boolean {
    return this.pending.has(dialID);
  }

  /** After a lost stream was replaced (resume): asks again for every dial still waiting; the peer answers each once. */
  requestAgain(): void {
    for (const [dialID, p] of this.pending)
      this.opts.send({ type: PacketType.DIAL_REQ, protocol: p.protocol, address: p.address, random: dialID });
  }

  /** DIAL_RSP: the peer connected (`connectID`) or refused (`error`). */
  answered(dialID: bigint, connectID: number, error: string): void {
    const pending = this.pending.get(dialID);
    if (!pending) {
      if (!error && connectID !== 0) {
        // The dial was cancelled meanwhile: close what the peer opened.
        this.opts.log.debug({ dialID: String(dialID), connectID }, 'DIAL_RSP for a cancelled dial; closing it');
        this.opts.send({ type: PacketType.CLOSE_REQ, connectID });
      }
      return;
    }
    this.pending.delete(dialID);
    pending.cleanup();
    if (error) {
      pending.reject(withDialID(new DialError(answeredFailure(error), error), dialID));
      return;
    }
    const conn = connectID === 0 ? undefined : this.opts.openConnection(connectID, dialID, pending.address);
    if (!conn) {
      this.opts.log.error({ dialID: String(dialID), connectID }, 'peer answered a dial with an unusable connectID');
      pending.reject(withDialID(new DialError('refused', `peer assigned unusable connectID ${connectID}`), dialID));
      return;
    }
    conn.dialMs = performance.now() - pending.startedAt;
    pending.resolve(conn);
  }

  /** DIAL_CLS from the peer for one of our dials; false when it is not ours. */
  closedByPeer(dialID: bigint): boolean {
    const pending = this.pending.get(dialID);
    if (!pending) return false;
    this.pending.delete(dialID);
    pending.cleanup();
    pending.reject(withDialID(new DialError('refused', 'dial closed by peer'), dialID));
    return true;
  }

  /** The tunnel closed: every dial fails with `message`. */
  failAll(message: string): void {
    for (const [id, pending] of this.pending) {
      this.pending.delete(id);
      pending.cleanup();
      pending.reject(withDialID(new DialError('tunnel-closed', message), id));
    }
  }
}

function withDialID(err: DialError, dialID: bigint): DialError {
  err.dialID = dialID;
  return err;
}
