/**
 * Sizes and counts that bound memory, file descriptors and time per tunnel
 * (one PacketStream) and per connection. docs/limits.md lists each with its
 * flag and what happens when it is hit.
 */
export interface TunnelLimits {
  /** Per-connection receive window first granted to a peer that speaks the window extension. */
  windowBytes: number;
  /**
   * What that window may grow to for a connection whose reader keeps up at a
   * high rate, so credit round trips do not limit bulk transfers (see
   * ReceiveWindow in receive-window.ts). A reader that falls behind never grows it.
   */
  maxWindowBytes: number;
  /**
   * Window growth (beyond windowBytes) all connections of one tunnel may hold
   * together, so memory per tunnel stays bounded however many connections
   * moved bulk data: once it is spent, further connections keep windowBytes.
   */
  windowGrowthBudgetBytes: number;
  /**
   * With a peer without flow control (upstream Konnectivity, the KAS's
   * konnectivity-client): bytes buffered for one connection whose local
   * reader is slower than the peer's sender at which the tunnel stops reading
   * its stream, as upstream does (never close a connection for being slow:
   * no byte may be lost). Reading resumes once that reader has taken half of them.
   */
  unflowedBufferBytes: number;
  /** The same for all connections of the tunnel together. */
  unflowedStreamBufferBytes: number;
  /**
   * With such a peer, the HTTP/2 receive window of its stream: what it may
   * send while the stream is paused, all of which lands when reading
   * resumes. Smaller means less wait for the other connections on the stream
   * next to a slow reader; larger, more throughput over long round trips.
   */
  unflowedReceiveWindowBytes: number;
  /** Largest DATA payload we send. */
  maxDataBytes: number;
  /** Dials waiting for an answer, in each direction, per tunnel. */
  maxPendingDials: number;
  /**
   * Connections the peer asked this side to dial, being dialled or open (on
   * an agent tunnel at the server: node -> control plane; at the agent:
   * control plane -> node). Further DIAL_REQs are refused.
   */
  maxInboundConnections: number;
  /** Connections this side dialled through the peer, pending or open. Further dials fail with 'exhausted'. */
  maxOutboundConnections: number;
  /**
   * Dials a second in each direction (a token bucket per direction, refilled
   * at this rate up to dialBurst); 0: not limited. A dial over it is refused
   * at once, as for exhaustion, and is never queued.
   */
  dialRate: number;
  /** Dials one direction may make at once before dialRate paces them. */
  dialBurst: number;
  /**
   * Bytes queued towards the peer (sent, not yet taken by it) at which the
   * tunnel stops reading from the peer until it takes them. Bulk DATA
   * stops earlier, at the transport's send buffer (1 MiB; this must stay
   * above it plus maxDataBytes), so only replies and other control packets
   * reach it: a peer that sends requests and does not read the answers.
   */
  pauseReadingQueuedBytes: number;
  /** Bytes queued towards the peer beyond which its stream is closed. */
  maxQueuedBytes: number;
  /**
   * How long reading may stay paused because the peer leaves what we sent
   * unread (pauseReadingQueuedBytes) before its stream is closed. Never
   * applies to pauses for a slow local reader (unflowedBufferBytes).
   */
  peerReadTimeoutMs: number;
}

export type TunnelLimitName = keyof TunnelLimits;

/** Default caps of node -> control plane connections per agent, and of control plane -> node ones. */
export const DEFAULT_NODE_TO_CP_CONNECTIONS = 1024;
export const DEFAULT_CP_TO_NODE_CONNECTIONS = 8192;

export const DEFAULT_LIMITS: TunnelLimits = {
  windowBytes: 1024 * 1024,
  maxWindowBytes: 4 * 1024 * 1024,
  windowGrowthBudgetBytes: 32 * 1024 * 1024,
  unflowedBufferBytes: 256 * 1024,
  unflowedStreamBufferBytes: 8 * 1024 * 1024,
  unflowedReceiveWindowBytes: 512 * 1024,
  maxDataBytes: 64 * 1024,
  maxPendingDials: 1024,
  maxInboundConnections: DEFAULT_CP_TO_NODE_CONNECTIONS,
  maxOutboundConnections: DEFAULT_CP_TO_NODE_CONNECTIONS,
  dialRate: 0,
  dialBurst: 100,
  pauseReadingQueuedBytes: 2 * 1024 * 1024,
  maxQueuedBytes: 8 * 1024 * 1024,
  peerReadTimeoutMs: 60_000,
};

/**
 * Fills what `partial` leaves out from the defaults. A window set without a
 * maximum stays fixed: the default growth is for the default window.
 */
export function resolveLimits(partial: Partial<TunnelLimits> = {}): TunnelLimits {
  const limits = { ...DEFAULT_LIMITS };
  for (const [name, value] of Object.entries(partial) as [TunnelLimitName, number | undefined][]) {
    if (value !== undefined) limits[name] = value;
  }
  if (partial.windowBytes !== undefined && partial.maxWindowBytes === undefined) limits.maxWindowBytes = partial.windowBytes;
  if (limits.maxWindowBytes < limits.windowBytes)
    throw new Error(`maxWindowBytes (${limits.maxWindowBytes}) is below windowBytes (${limits.windowBytes})`);
  if (limits.maxQueuedBytes < limits.pauseReadingQueuedBytes) {
    throw new Error(`maxQueuedBytes (${limits.maxQueuedBytes}) is below pauseReadingQueuedBytes (${limits.pauseReadingQueuedBytes})`);
  }
  return limits;
}
