/** Sizes that bound memory per tunnel and per connection. */
export interface TunnelLimits {
  /** Per-connection receive window first granted to a peer that speaks the window extension. */
  windowBytes: number;
  /**
   * What that window may grow to for a connection whose reader keeps up at a
   * high rate, so credit round trips do not limit bulk transfers (see
   * TunnelConnection.growWindow). A reader that falls behind never grows it.
   */
  maxWindowBytes: number;
  /**
   * Window growth (beyond windowBytes) all connections of one tunnel may hold
   * together, so memory per tunnel stays bounded however many connections
   * moved bulk data: once it is spent, further connections keep windowBytes.
   */
  windowGrowthBudgetBytes: number;
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
  maxWindowBytes: 4 * 1024 * 1024,
  windowGrowthBudgetBytes: 32 * 1024 * 1024,
  unflowedBufferBytes: 8 * 1024 * 1024,
  maxDataBytes: 64 * 1024,
  maxPendingDials: 4096,
};

/**
 * Fills what `partial` leaves out from the defaults. A window set without a
 * maximum stays fixed: the default growth is for the default window.
 */
export function resolveLimits(partial: Partial<TunnelLimits> = {}): TunnelLimits {
  const limits = { ...DEFAULT_LIMITS, ...partial };
  if (partial.windowBytes !== undefined && partial.maxWindowBytes === undefined) limits.maxWindowBytes = partial.windowBytes;
  if (limits.maxWindowBytes < limits.windowBytes) throw new Error(`maxWindowBytes (${limits.maxWindowBytes}) is below windowBytes (${limits.windowBytes})`);
  return limits;
}
