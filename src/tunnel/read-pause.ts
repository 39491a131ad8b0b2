/**
 * Why a tunnel has stopped reading its stream: HTTP/2 flow control then
 * holds the peer back. Several reasons may hold at once; reading resumes
 * when none is left.
 */
import type { PacketStream } from '../transport/packet-stream.js';

/**
 * A connectID: that connection's local reader is slower than a peer without
 * flow control (docs/limits.md). 'unflowed-stream': the same for all connections
 * together. 'peer-not-reading': the peer leaves what we sent unread.
 */
export type PauseReason = number | 'unflowed-stream' | 'peer-not-reading';

export class ReadPause {
  /** At most one entry per connection of the tunnel, plus the two named reasons. */
  private readonly reasons = new Set<PauseReason>();

  constructor(private readonly stream: Pick<PacketStream, 'pause' | 'resume'>) {}

  get paused(): boolean {
    return this.reasons.size > 0;
  }

  has(reason: PauseReason): boolean {
    return this.reasons.has(reason);
  }

  /** Returns true when `reason` was not holding the stream yet. */
  hold(reason: PauseReason): boolean {
    if (this.reasons.has(reason)) return false;
    this.reasons.add(reason);
    if (this.reasons.size === 1) this.stream.pause();
    return true;
  }

  release(reason: PauseReason): void {
    if (this.reasons.delete(reason) && this.reasons.size === 0) this.stream.resume();
  }
}
