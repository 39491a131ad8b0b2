/**
 * The local side of a tunnelled connection: where the peer's bytes go and
 * what hands over the bytes for the peer. A socket (splice.ts), or in a relay
 * the partner connection; until one is attached, EarlyEnd keeps what arrives.
 */

/** How a connection ended, for its local end: let what is queued reach the reader, or drop it. */
export type LocalClose = 'flush' | 'abort';

export interface LocalEnd {
  /** Delivers the peer's bytes; the end calls the connection's taken() as its reader takes them. */
  deliver(chunk: Buffer): void;
  /** Bytes delivered that its reader has not taken yet (bounded by the receive window). */
  readonly undeliveredBytes: number;
  /** The peer sent its FIN: finish after what is queued. */
  peerEnded(): void;
  /** The connection is gone; `error` says why when it failed. */
  connectionClosed(how: LocalClose, error?: Error): void;
  /** The connection sent some of what this end handed over, or can take more again (see TunnelConnection.ready). */
  sendProgress(): void;
}

/** Keeps what arrives before a local end is attached (a DIAL_RSP and DATA in one read), bounded by the receive window. */
export class EarlyEnd implements LocalEnd {
  private readonly chunks: Buffer[] = [];
  private bytes = 0;
  private ended = false;
  private closure: { how: LocalClose; error?: Error } | undefined;

  deliver(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.bytes += chunk.length;
  }

  get undeliveredBytes(): number {
    return this.bytes;
  }

  peerEnded(): void {
    this.ended = true;
  }

  connectionClosed(how: LocalClose, error?: Error): void {
    this.closure = { how, error };
  }

  sendProgress(): void {}

  /** Hands everything kept, in order, to the end attached now. */
  replayInto(end: LocalEnd): void {
    for (const chunk of this.chunks) end.deliver(chunk);
    this.chunks.length = 0;
    this.bytes = 0;
    if (this.ended) end.peerEnded();
    if (this.closure) end.connectionClosed(this.closure.how, this.closure.error);
  }
}
