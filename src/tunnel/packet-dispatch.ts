/**
 * Where each packet from the peer goes: connection packets to their
 * connection in the table, dial packets to the dial bookkeeping, DRAIN to the
 * tunnel (docs/protocol.md). A packet for a connectID not in the table is
 * answered once with a close.
 */
import type { Logger } from 'pino';
import type { RateLimitedLog } from '../common/rate-limited-log.js';
import {
  PacketType,
  type Packet,
  type ResolveRequestPacket,
  type ResolveResponsePacket,
  type ResumeEndPacket,
  type ResumePacket,
  type WindowPacket,
} from '../wire/packet.js';
import type { ConnectionTable } from './connection-table.js';
import type { InboundDials } from './inbound-dials.js';
import type { OutboundDials } from './outbound-dials.js';

export interface PacketDispatchOptions {
  side: 'agent' | 'server';
  connections: ConnectionTable;
  inbound: InboundDials;
  outbound: OutboundDials;
  log: Logger;
  noise: RateLimitedLog;
  /** Sends a packet to the peer (nothing while the tunnel is not open). */
  send(packet: Packet): void;
  /** DRAIN: the peer asks for no new dials. */
  drainRequested(): void;
  /** KANAL_RESUME, KANAL_RESUME_END (resume-exchange.ts). */
  resume(p: ResumePacket | ResumeEndPacket): void;
  /** A DIAL_REQ while resuming: true when it repeats a dial known here (and was handled). */
  requestedAgain(dialID: bigint): boolean;
  /** KANAL_RESOLVE_REQ and KANAL_RESOLVE_RSP (resolve-answers.ts, resolve-requests.ts). */
  resolvePacket(p: ResolveRequestPacket | ResolveResponsePacket): void;
  /** KANAL_WINDOW acknowledging a connection no longer open (it may linger). */
  lingeringWindow(p: WindowPacket): void;
}

export class PacketDispatch {
  private readonly connections: ConnectionTable;

  constructor(private readonly opts: PacketDispatchOptions) {
    this.connections = opts.connections;
  }

  /** Called once per packet: DATA, the first case, touches nothing but the table. */
  packet(p: Packet): void {
    switch (p.type) {
      case PacketType.DATA: {
        const conn = this.connections.get(p.connectID);
        if (!conn) return this.unknownConnection(p.connectID, 'DATA');
        if (p.error) conn.receiveClose(p.error);
        else conn.receiveData(p.data);
        return;
      }
      case PacketType.KANAL_WINDOW: {
        const conn = this.connections.get(p.connectID);
        if (conn) conn.receiveWindow(p.increment, p.acknowledged, p.finReceived);
        // Else it closed just now (normal): an acknowledgement may still release what it keeps.
        else if (p.acknowledged !== undefined || p.finReceived) this.opts.lingeringWindow(p);
        return;
      }
      case PacketType.KANAL_HALF_CLOSE: {
        const conn = this.connections.get(p.connectID);
        if (!conn) return this.unknownConnection(p.connectID, 'KANAL_HALF_CLOSE');
        conn.receiveHalfClose();
        return;
      }
      case PacketType.DIAL_REQ:
        if (this.opts.requestedAgain(p.random)) return;
        return this.opts.inbound.requested(p.protocol, p.address, p.random);
      case PacketType.DIAL_RSP:
        return this.opts.outbound.answered(p.random, p.connectID, p.error);
      case PacketType.CLOSE_REQ: {
        const conn = this.connections.get(p.connectID);
        if (conn) {
          conn.receiveClose('');
          this.opts.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: '' });
        } else {
          this.opts.send({ type: PacketType.CLOSE_RSP, connectID: p.connectID, error: 'unknown connectID' });
        }
        return;
      }
      case PacketType.CLOSE_RSP:
        // Unsolicited (the far endpoint closed) or the answer to our CLOSE_REQ.
        this.connections.get(p.connectID)?.receiveClose(p.error === 'unknown connectID' ? '' : p.error);
        return;
      case PacketType.DIAL_CLS:
        if (this.opts.inbound.cancelledByPeer(p.random)) this.opts.log.debug({ dialID: String(p.random) }, 'peer cancelled its dial');
        else this.opts.outbound.closedByPeer(p.random);
        return;
      case PacketType.DRAIN:
        return this.opts.drainRequested();
      case PacketType.KANAL_RESUME:
      case PacketType.KANAL_RESUME_END:
        return this.opts.resume(p);
      case PacketType.KANAL_RESOLVE_REQ:
      case PacketType.KANAL_RESOLVE_RSP:
        return this.opts.resolvePacket(p);
    }
  }

  private unknownConnection(connectID: number, what: string): void {
    if (!this.connections.firstUnknown(connectID)) return;
    this.opts.noise.warn('unknown-connect-id', { connectID, packet: what }, 'packet for unknown connectID; telling the peer to close it');
    if (this.opts.side === 'server') this.opts.send({ type: PacketType.CLOSE_REQ, connectID });
    else this.opts.send({ type: PacketType.CLOSE_RSP, connectID, error: 'unknown connectID' });
  }
}
