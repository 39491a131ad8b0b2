/** Which metric counts a tunnel limit being hit (docs/limits.md names it for each limit). */
import type { KanalMetrics } from '../domain/metrics.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { TunnelLimitName } from './limits.js';

/** Counts a tunnel limit being hit (TunnelOptions.onLimit): a refusal (`reason`), a read pause, or a closed stream. */
export function countTunnelLimit(metrics: KanalMetrics | undefined, limit: TunnelLimitName, reason: RefusalReason | undefined): void {
  if (!metrics) return;
  if (reason !== undefined) metrics.refusals.inc({ reason });
  else if (limit === 'unflowedBufferBytes' || limit === 'unflowedStreamBufferBytes') metrics.readPauses.inc({ reason: 'slow_reader' });
  else if (limit === 'pauseReadingQueuedBytes') metrics.readPauses.inc({ reason: 'peer_not_reading' });
  else if (limit === 'maxQueuedBytes' || limit === 'peerReadTimeoutMs') metrics.streamsClosed.inc({ reason: 'peer_not_reading' });
}
