/**
 * With resume: connections that closed cleanly here while the peer has not
 * acknowledged all they sent (their last bytes, their FIN). If the stream is
 * lost before it does, the peer's resume entry names them and they are sent
 * again (resume-exchange.ts); an acknowledgement releases them. Bounded in
 * number and bytes: past either bound the oldest is forgotten (the peer
 * acknowledges within a round trip, so only a peer that does not acknowledge
 * reaches them).
 */
import type { WindowPacket } from '../wire/packet.js';
import type { TunnelConnection } from './connection.js';

/** Lingering connections one tunnel keeps at most. */
export const MAX_LINGERING = 1024;

export class LingeringConnections {
  /** Insertion order is age: the first is the oldest. At most MAX_LINGERING entries, `retained` bytes at most `maxBytes` (after add()). */
  private readonly entries = new Map<number, TunnelConnection>();
  private retained = 0;

  constructor(private readonly maxBytes: number) {}

  get byId(): ReadonlyMap<number, TunnelConnection> {
    return this.entries;
  }

  get size(): number {
    return this.entries.size;
  }

  /** Unacknowledged bytes they keep. */
  get bytes(): number {
    return this.retained;
  }

  add(conn: TunnelConnection): void {
    this.entries.set(conn.connectID, conn);
    this.retained += conn.unacknowledgedBytes;
    for (const [id] of this.entries) {
      if (this.entries.size <= MAX_LINGERING && this.retained <= this.maxBytes) break;
      this.drop(id);
    }
  }

  /** The peer acknowledged bytes or the FIN of a connection closed here. */
  acknowledged(p: WindowPacket): void {
    const conn = this.entries.get(p.connectID);
    if (!conn) return;
    const before = conn.unacknowledgedBytes;
    const truthful = conn.receiveWindow(p.increment, p.acknowledged, p.finReceived);
    this.retained -= before - conn.unacknowledgedBytes;
    // A peer that acknowledges what was never sent gets no replay of it either.
    if (!truthful || !conn.lingers) this.drop(p.connectID);
  }

  drop(connectID: number): void {
    const conn = this.entries.get(connectID);
    if (!conn) return;
    this.entries.delete(connectID);
    this.retained -= conn.unacknowledgedBytes;
    conn.releaseRetained();
  }

  clear(): void {
    for (const id of [...this.entries.keys()]) this.drop(id);
  }
}
