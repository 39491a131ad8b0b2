/**
 * A tunnel's open connections by connectID, counted by role (dialer: we asked
 * for it; performer: the peer did) for the limits, with the connectIDs this
 * side assigns (agent odd, server even, so the two sides never meet) and
 * those recently gone, whose late packets are dropped quietly.
 */
import type { TunnelConnection } from './connection.js';
import { RecentIds } from './recent-ids.js';

export class ConnectionTable {
  /** At most maxInboundConnections + maxOutboundConnections (the tunnel checks before adding). */
  private readonly byId = new Map<number, TunnelConnection>();
  private dialers = 0;
  private performers = 0;
  private nextConnectID: number;
  /** connectIDs recently closed or answered as unknown. */
  private readonly recentlyGone = new RecentIds(1024);

  constructor(side: 'agent' | 'server') {
    this.nextConnectID = side === 'agent' ? 1 : 2;
  }

  get size(): number {
    return this.byId.size;
  }

  /** Open connections this side asked for. */
  get dialerCount(): number {
    return this.dialers;
  }

  /** Open connections this side performs for the peer. */
  get performerCount(): number {
    return this.performers;
  }

  get(connectID: number): TunnelConnection | undefined {
    return this.byId.get(connectID);
  }

  has(connectID: number): boolean {
    return this.byId.has(connectID);
  }

  /** True when `connectID` has this side's parity: this side performed the dial and assigned it. */
  assignedHere(connectID: number): boolean {
    return connectID % 2 === this.nextConnectID % 2;
  }

  /** A free connectID of this side's parity. */
  allocateConnectID(): number {
    let id = this.nextConnectID;
    while (this.byId.has(id)) id += 2;
    this.nextConnectID = id + 2;
    return id;
  }

  add(conn: TunnelConnection): void {
    this.byId.set(conn.connectID, conn);
    if (conn.role === 'dialer') this.dialers++;
    else this.performers++;
  }

  /** Takes a closed connection out of the table and returns it; an open one stays. */
  removeClosed(connectID: number): TunnelConnection | undefined {
    const conn = this.byId.get(connectID);
    if (!conn || conn.state !== 'closed') return undefined;
    this.byId.delete(connectID);
    if (conn.role === 'dialer') this.dialers--;
    else this.performers--;
    this.recentlyGone.add(connectID);
    return conn;
  }

  /**
   * True the first time a packet names `connectID` that is not open and was
   * not recently: answer each unknown connectID once, so a peer still
   * streaming DATA into a connection that just closed gets no close packet per DATA.
   */
  firstUnknown(connectID: number): boolean {
    if (this.recentlyGone.has(connectID)) return false;
    this.recentlyGone.add(connectID);
    return true;
  }

  /** The open connections now (a copy: closing them changes the table). */
  snapshot(): TunnelConnection[] {
    return [...this.byId.values()];
  }
}
