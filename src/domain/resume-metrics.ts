/**
 * Resume's metrics, the same names on server and agent (docs/metrics.md):
 * tunnels detached, resumed or expired, bytes sent again, how long a
 * resume took, and what is held meanwhile (read at scrape time).
 */
import { Counter, Histogram } from './prom-client.js';
import type { KanalMetrics, LabelledCounter } from './metrics.js';

/** resumed: a new stream took the tunnel over; expired: the resume timeout closed it; refused: a stream named a tunnel it could not take (unknown, another credential, a restarted server). */
export type ResumeResult = 'resumed' | 'expired' | 'refused';

export interface ResumeHeld {
  /** Tunnels waiting for a resume, and their connections. */
  detached(): { tunnels: number; connections: number };
  /** Bytes kept for a replay, detached or not. */
  retainedBytes(): number;
  /** Memory of the process's resend slabs, in use and free (process-wide). */
  slabBytes(): number;
}

export class ResumeMetrics {
  readonly detachedTotal: Counter;
  readonly results: LabelledCounter<{ result: ResumeResult }>;
  readonly replayedBytes: Counter;
  readonly seconds: Histogram;

  constructor(metrics: KanalMetrics, held: ResumeHeld) {
    const registers = [metrics.registry];
    this.detachedTotal = new Counter({
      name: 'kanal_resume_detached_total',
      help: 'Tunnels whose stream was lost while both sides lived; their connections waited for a resume',
      registers,
    });
    this.results = new Counter({
      name: 'kanal_resumes_total',
      help: 'Ends of a detachment, and resume attempts refused (result: resumed, expired, refused)',
      labelNames: ['result'],
      registers,
    });
    this.replayedBytes = new Counter({
      name: 'kanal_resume_replayed_bytes_total',
      help: 'Bytes sent again on a resumed stream (lost in flight with the old one)',
      registers,
    });
    this.seconds = new Histogram({
      name: 'kanal_resume_duration_seconds',
      help: 'Time from losing a stream to resuming on a new one',
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers,
    });
    metrics.gauge('kanal_resume_detached_tunnels', 'Tunnels waiting for a resume', () => held.detached().tunnels);
    metrics.gauge('kanal_resume_detached_connections', 'Connections of tunnels waiting for a resume', () => held.detached().connections);
    metrics.gauge(
      'kanal_resume_retained_bytes',
      'Bytes sent and not yet acknowledged, kept to be sent again after a lost stream (bounded by the windows)',
      () => held.retainedBytes(),
    );
    metrics.gauge(
      'kanal_resume_slab_bytes',
      "Memory of the process's slabs that keep those bytes, in use and free (process-wide: every registry shows the same)",
      () => held.slabBytes(),
    );
  }

  /** Counts a tunnel's detachments, resumes and expiry (once per tunnel). */
  watch(tunnel: {
    on(event: 'detached', l: () => void): unknown;
    on(event: 'resumed', l: (ms: number) => void): unknown;
    on(event: 'resume-expired', l: () => void): unknown;
  }): void {
    tunnel.on('detached', () => this.detachedTotal.inc());
    tunnel.on('resumed', (ms) => {
      this.results.inc({ result: 'resumed' });
      this.seconds.observe(ms / 1000);
    });
    tunnel.on('resume-expired', () => this.results.inc({ result: 'expired' }));
  }
}
