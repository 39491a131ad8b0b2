/**
 * What both sides tell each other when a tunnel's lost stream is replaced
 * (docs/protocol.md, "Resume"). Each side first re-sends DIAL_REQ for its
 * dials still waiting, lists every connection it holds (KANAL_RESUME: what
 * it received of it, how far the peer may send, whether the FIN came), and
 * ends the list (KANAL_RESUME_END); only then does anything else go out.
 * The peer's entry lets a connection resend what was lost and carry on; a
 * connection the peer did not list is gone there and is closed here.
 * Connections closed here that still linger (lingering-connections.ts) are
 * listed too, so the peer waits for their replay rather than closing them.
 *
 * A dial answered just before the loss is known to the side that performed
 * it and not to the one that asked: the asking side's repeated DIAL_REQ
 * finds the connection by its dial ID, and the answer is sent again.
 */
import type { Logger } from 'pino';
import { PacketType, type Packet, type ResumePacket } from '../wire/packet.js';
import type { TunnelConnection } from './connection.js';
import type { ConnectionTable } from './connection-table.js';
import type { InboundDials } from './inbound-dials.js';
import type { OutboundDials } from './outbound-dials.js';
import { debugTrace, StateMachine, type Lifecycle } from '../common/state-machine.js';

export interface ResumeExchangeOptions {
  connections: ConnectionTable;
  inbound: InboundDials;
  outbound: OutboundDials;
  /** Connections closed here whose last bytes or FIN the peer has not acknowledged. */
  lingering: ReadonlyMap<number, TunnelConnection>;
  /** Drops a lingering connection (replayed, or unknown to the peer). */
  forgetLingering(connectID: number): void;
  send(packet: Packet): void;
  log: Logger;
  /** Counts what went out again (kanal_resume_replayed_bytes_total). */
  onReplayed(bytes: number): void;
}

/**
 * Where an exchange is: 'listing' while this side's list goes out (packets
 * from the peer cannot arrive then: the list is sent in one turn), 'waiting'
 * for the peer's KANAL_RESUME_END, 'done' after it. Only end() moves to done.
 */
type ExchangeState = 'listing' | 'waiting' | 'done';

const EXCHANGE: Lifecycle<ExchangeState> = { name: 'resume exchange', moves: { listing: ['waiting'], waiting: ['done'], done: [] } };

const WAITING: readonly ExchangeState[] = ['waiting'];

export class ResumeExchange {
  private readonly state: StateMachine<ExchangeState>;
  /** Connections the peer listed or re-requested: the others are gone there. */
  private readonly confirmed = new Set<number>();
  /** This side's connections by the dial they came from, for a re-sent DIAL_REQ (built on the first). */
  private byDialID: Map<bigint, TunnelConnection> | undefined;

  constructor(private readonly opts: ResumeExchangeOptions) {
    this.state = new StateMachine<ExchangeState>('listing', EXCHANGE, debugTrace(EXCHANGE, opts.log));
  }

  /** Sends this side's list: dials again, one entry per connection, the end. */
  start(): void {
    const { opts } = this;
    opts.outbound.requestAgain();
    // Lingering ones too: the peer may still hold them, waiting for their last bytes or FIN.
    for (const conn of opts.connections.snapshot()) opts.send(conn.resumeEntry());
    for (const conn of opts.lingering.values()) opts.send(conn.resumeEntry());
    opts.send({ type: PacketType.KANAL_RESUME_END });
    this.state.to('waiting');
  }

  get finished(): boolean {
    return this.state.kind === 'done';
  }

  /** The peer's entry for one connection. */
  entry(p: ResumePacket): void {
    const { opts } = this;
    const conn = opts.connections.get(p.connectID);
    if (conn) {
      this.confirmed.add(p.connectID);
      const result = conn.resume(p.received, p.limit, p.finReceived);
      if ('fault' in result) {
        opts.log.warn({ connectID: p.connectID, reason: result.fault }, 'closing connection: its resume entry cannot be true');
        conn.close(new Error(`resume refused: ${result.fault}`), 'proxy');
        return;
      }
      opts.onReplayed(result.resent);
      return;
    }
    // Ours, but not answered here yet: the DIAL_RSP the peer sends again (for our repeated DIAL_REQ) opens it.
    if (opts.outbound.isPending(p.dialID)) return;
    const linger = opts.lingering.get(p.connectID);
    if (linger) {
      const resent = linger.replay(p.received, p.finReceived);
      if (resent >= 0) opts.onReplayed(resent);
      opts.forgetLingering(p.connectID);
      return;
    }
    // Closed here before the stream was lost, and the close did not arrive: say so again.
    opts.log.debug({ connectID: p.connectID }, 'peer resumes a connection closed here; closing it there');
    if (opts.connections.assignedHere(p.connectID))
      opts.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: 'connection closed' });
    else opts.send({ type: PacketType.CLOSE_REQ, connectID: p.connectID });
  }

  /**
   * DIAL_REQ from the peer while waiting for its list: a dial it asked for
   * before the loss. True when handled here (being performed, answered
   * already and answered again, or naming a connection the peer holds, so
   * ignored); false: a dial not seen before, perform it.
   */
  dialRequested(dialID: bigint): boolean {
    if (this.opts.inbound.isPerforming(dialID)) return true;
    this.byDialID ??= new Map(
      this.opts.connections
        .snapshot()
        .filter((c) => c.role === 'performer')
        .map((c) => [c.dialID, c]),
    );
    const conn = this.byDialID.get(dialID);
    if (!conn) return false;
    // Only a connection still waiting for the peer's word can be one it never heard of; asking twice changes nothing.
    if (!conn.suspended || this.confirmed.has(conn.connectID)) return true;
    this.confirmed.add(conn.connectID);
    this.opts.send({ type: PacketType.DIAL_RSP, random: dialID, connectID: conn.connectID, error: '' });
    // The peer opens it afresh: nothing of ours arrived, and it grants a first window.
    const result = conn.resume(0, conn.limits.windowBytes, false);
    if ('fault' in result) {
      // It acknowledged bytes of this connection before, so it did hear of it: the peer's word cannot be true.
      this.opts.log.warn({ connectID: conn.connectID, reason: result.fault }, 'closing connection: its dial was asked for again');
      conn.close(new Error(`resume refused: ${result.fault}`), 'proxy');
    }
    return true;
  }

  /** KANAL_RESUME_END: every connection the peer holds was listed; the others are closed here. */
  end(): void {
    if (!this.state.from(WAITING, 'done')) return;
    for (const conn of this.opts.connections.snapshot()) {
      if (!this.confirmed.has(conn.connectID) && conn.suspended) {
        this.opts.log.info(
          { connectID: conn.connectID, dialID: String(conn.dialID), address: conn.address },
          'connection closed: the peer no longer holds it (it closed while the tunnel was down)',
        );
        conn.close(new Error('the peer no longer holds this connection'), 'proxy');
      }
    }
    this.byDialID = undefined;
    // The peer did not list these: it has all of them.
    for (const connectID of [...this.opts.lingering.keys()]) this.opts.forgetLingering(connectID);
  }
}
