/**
 * Where the server's refusals go: each one is counted
 * (kanal_refusals_total{reason}) and logged as a warning, at most once per
 * interval per peer and reason, then with the number suppressed, so a flood
 * of refusals costs a bounded number of log lines (docs/frontends.md, "Logs:
 * bounded and rate-limited").
 */
import type { Logger } from 'pino';
import type { KanalMetrics } from './metrics.js';
import { RateLimitedLog } from '../common/rate-limited-log.js';
import { truncateForLog } from '../common/log-safety.js';
import type { RefusalReason } from './refusal-reason.js';
import type { RecentEvents } from './recent-events.js';

export const REFUSAL_LOG_INTERVAL_MS = 10_000;

/**
 * The host part of "host:port", "[v6]:port" or "v6:port": a peer that
 * reconnects from another port is still the same peer. Anything else (a
 * Unix socket, an agentID) is a key as it is.
 */
export function peerHost(peer: string): string {
  const m = /^\[([^\]]*)\]:\d+$/.exec(peer) ?? /^([^:]*):\d+$/.exec(peer) ?? /^(.*:.*):\d+$/.exec(peer);
  return m?.[1] ?? peer;
}

/** An agent as its node -> control plane dials name it: the credential that authenticated it and the agentID it announced. */
export interface DialingAgent {
  agentID: string;
  credential: string;
  /** The agent's tunnel's recent refusals (the admin port's /status), if kept. */
  recent?: RecentEvents;
}

/** One refusal of a network peer, as Refusals.refuse logs and counts it. */
export interface PeerRefusal {
  reason: RefusalReason;
  /** "host:port" or "unix:path": the log is rate-limited per host. */
  peer: string;
  /** Logged with the line. */
  fields: Record<string, unknown>;
  message: string;
  /** A finer cause (a parser error code, a TLS alert): refusals differing in it are logged apart. */
  detail?: string;
}

/** Where refusals of peers are recorded besides the log (the audit log). */
export interface RefusalAudit {
  refused(refusal: PeerRefusal): void;
}

export class Refusals {
  private readonly log: RateLimitedLog;

  constructor(
    log: Logger,
    private readonly metrics?: KanalMetrics,
    intervalMs = REFUSAL_LOG_INTERVAL_MS,
    /** Every refusal of a peer is audited, none suppressed (the audit log drops lines only when it cannot keep up). */
    private readonly audit?: RefusalAudit,
  ) {
    this.log = new RateLimitedLog(log, intervalMs);
  }

  /**
   * Counts a refusal of a network peer ("host:port", "unix:path"); logs it
   * unless this peer's host had one for `reason` (and `detail`) within the interval.
   */
  refuse(refusal: PeerRefusal): void {
    const { reason, peer, fields, message, detail = '' } = refusal;
    this.metrics?.refusals.inc({ reason });
    this.metrics?.recent.add(reason);
    this.audit?.refused(refusal);
    this.log.warn(
      `${reason} ${truncateForLog(peerHost(peer), 64)} ${truncateForLog(detail, 64)}`,
      { peer, refusal: reason, ...fields },
      message,
    );
  }

  /** Counts a refusal of an agent's dial (audited with the dial: TunnelOptions.onInboundDialFailed); logs it unless this agent had one for `reason` within the interval (one agent's refusals cannot hide another's). */
  refuseAgent(reason: RefusalReason, agent: DialingAgent, fields: Record<string, unknown>, message: string): void {
    this.metrics?.refusals.inc({ reason });
    this.metrics?.recent.add(reason);
    agent.recent?.add(reason);
    this.log.warn(
      `${reason} agent ${truncateForLog(agent.credential, 64)} ${truncateForLog(agent.agentID, 64)}`,
      { agentID: agent.agentID, credential: agent.credential, refusal: reason, ...fields },
      message,
    );
  }

  /** Logs the counts still suppressed (at shutdown). */
  flush(): void {
    this.log.flush();
  }
}
