/**
 * Past the transport's send buffer only replies and control packets are
 * sent (bulk DATA waits for 'drain'). A peer that makes us answer and does
 * not read the answers is not read from either, and loses its stream
 * if that does not stop it (maxQueuedBytes, pauseReadingQueuedBytes,
 * peerReadTimeoutMs: docs/limits.md). No deadlock between two Kanal peers:
 * each reads all the time, so neither queue reaches this point first.
 */
import type { Logger } from 'pino';
import type { RateLimitedLog } from '../common/rate-limited-log.js';
import { GrpcStatus, GrpcStatusError } from '../transport/grpc-status.js';
import type { PacketStream } from '../transport/packet-stream.js';
import type { LimitReports } from './limit-reports.js';
import type { TunnelLimitName, TunnelLimits } from './limits.js';
import type { ReadPause } from './read-pause.js';

export interface PeerReadGuardOptions {
  stream: PacketStream;
  limits: TunnelLimits;
  readPause: ReadPause;
  reports: LimitReports;
  log: Logger;
  noise: RateLimitedLog;
  isOpen(): boolean;
  /** Ends the tunnel with `error` (Tunnel.close). */
  close(error: Error): void;
}

export class PeerReadGuard {
  /** Closes the stream when the peer leaves our packets unread too long (limits.peerReadTimeoutMs). */
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: PeerReadGuardOptions) {}

  /** The transport refused more: close the stream past maxQueuedBytes, stop reading past pauseReadingQueuedBytes. */
  sendRefused(): void {
    const { stream, limits, readPause, reports } = this.opts;
    const queued = stream.queuedBytes;
    if (queued > limits.maxQueuedBytes) {
      this.closeStalledPeer('maxQueuedBytes', `${queued} bytes queued for it, limit ${limits.maxQueuedBytes}`);
      return;
    }
    if (queued < limits.pauseReadingQueuedBytes || !readPause.hold('peer-not-reading')) return;
    reports.reached('pauseReadingQueuedBytes');
    this.opts.noise.warn(
      'peer-not-reading',
      { queuedBytes: queued, ...reports.flagOf('pauseReadingQueuedBytes') },
      'peer does not read what we send: stopped reading from it until it does',
    );
    const timeout = limits.peerReadTimeoutMs;
    this.timer = setTimeout(
      () => this.closeStalledPeer('peerReadTimeoutMs', `it left ${stream.queuedBytes} bytes unread for ${timeout} ms`),
      timeout,
    );
    this.timer.unref();
  }

  /** The transport drained: the peer reads again. */
  drained(): void {
    if (this.opts.readPause.has('peer-not-reading')) {
      clearTimeout(this.timer);
      this.opts.readPause.release('peer-not-reading');
    }
  }

  /** The tunnel closed. */
  stop(): void {
    clearTimeout(this.timer);
  }

  private closeStalledPeer(limit: TunnelLimitName, why: string): void {
    if (!this.opts.isOpen()) return;
    this.opts.reports.reached(limit);
    this.opts.log.warn(
      { peer: this.opts.stream.peer, ...this.opts.reports.flagOf(limit) },
      `closing stream: the peer does not read (${why})`,
    );
    this.opts.close(new GrpcStatusError(GrpcStatus.RESOURCE_EXHAUSTED, `peer does not read its stream: ${why}`));
  }
}
