/** Sizes that bound memory per tunnel and per connection. */
export interface TunnelLimits {
  /** Per-connection receive window granted to a peer that speaks the window extension. */
  windowBytes: number;
  /**
   * With a peer without flow control, bytes buffered for one connection whose
   * local reader is slower than the peer's sender before that connection (and
   * only that one) is closed.
   */
  unflowedBufferBytes: number;
  /** Largest DATA payload we send. */
  maxDataBytes: number;
  /** Dials waiting for an answer, in each direction, per tunnel. */
  maxPendingDials: number;
}

export const DEFAULT_LIMITS: TunnelLimits = {
  windowBytes: 1024 * 1024,
  unflowedBufferBytes: 8 * 1024 * 1024,
  maxDataBytes: 64 * 1024,
  maxPendingDials: 4096,
};
