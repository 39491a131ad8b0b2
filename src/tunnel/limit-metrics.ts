/** Which metric counts a tunnel limit being hit (docs/limits.md names it for each limit). */
import type { KanalMetrics } from '../domain/metrics.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { RecentKind } from '../domain/recent-events.js';
import type { TunnelLimitName } from './limits.js';

/**
 * Counts a tunnel limit being hit (TunnelOptions.onLimit): a refusal
 * (`reason`, from the tunnel's RefusalReasons), a read pause, or a closed
 * stream; also among the last minutes' events (the admin port's /status).
 * Returns what it counted, for the tunnel's own recent events.
 */
export function countTunnelLimit(
  metrics: KanalMetrics | undefined,
  limit: TunnelLimitName,
  reason: RefusalReason | undefined,
): RecentKind | undefined {
  if (!metrics) return undefined;
  let kind: RecentKind | undefined;
  if (reason !== undefined) {
    metrics.refusals.inc({ reason });
    kind = reason;
  } else if (limit === 'unflowedBufferBytes' || limit === 'unflowedStreamBufferBytes') {
    metrics.readPauses.inc({ reason: 'slow_reader' });
    kind = 'read_pause_slow_reader';
  } else if (limit === 'pauseReadingQueuedBytes') {
    metrics.readPauses.inc({ reason: 'peer_not_reading' });
    kind = 'read_pause_peer_not_reading';
  } else if (limit === 'maxQueuedBytes' || limit === 'peerReadTimeoutMs') {
    metrics.streamsClosed.inc({ reason: 'peer_not_reading' });
    kind = 'stream_closed_peer_not_reading';
  }
  if (kind !== undefined) metrics.recent.add(kind);
  return kind;
}
