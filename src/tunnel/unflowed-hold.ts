/**
 * Without the window extension (upstream peers) only pausing the stream stops
 * the peer (docs/mixed-versions.md): at unflowedBufferBytes buffered for one connection's local
 * reader the tunnel stops reading, and resumes once that reader took half of
 * them. Every byte is delivered, however slow the reader; the other
 * connections on the stream wait meanwhile, as they do with upstream.
 */

/** What the hold needs from its tunnel. */
export interface UnflowedHost {
  /** Stop (true) or resume (false) reading the stream on behalf of `connectID`. */
  holdInbound(connectID: number, hold: boolean): void;
  /** Bytes buffered for local readers of this tunnel changed by `delta`. */
  noteUnflowedBytes(delta: number): void;
}

export class UnflowedHold {
  /** The buffered bytes last reported to the host (what the tunnel counts for us). */
  private reported = 0;
  /** True while this connection holds its tunnel's stream paused. */
  private holding = false;

  constructor(
    private readonly host: UnflowedHost,
    private readonly connectID: number,
    private readonly limit: number,
  ) {}

  /** `queued` bytes wait for the local reader now (0 when the connection closed: releases all). */
  update(queued: number): void {
    if (queued !== this.reported) {
      this.host.noteUnflowedBytes(queued - this.reported);
      this.reported = queued;
    }
    if (!this.holding && queued >= this.limit) {
      this.holding = true;
      this.host.holdInbound(this.connectID, true);
    } else if (this.holding && queued < this.limit / 2) {
      this.holding = false;
      this.host.holdInbound(this.connectID, false);
    }
  }
}
