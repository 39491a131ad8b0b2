/** What a Tunnel is given (its side, features, limits, dial handler, hooks) and what it reports. */
import type { Logger } from 'pino';
import type { FeatureSet } from '../wire/features.js';
import type { TunnelConnection } from './connection.js';
import type { DialHandler } from './dial-handler.js';
import type { TunnelLimitName, TunnelLimits } from './limits.js';
import type { RefusalReasons } from './limit-reports.js';
import type { TunnelSnapshot } from '../domain/status-document.js';
import type { RefusalReason } from '../domain/refusal-reason.js';
import type { DialFailure } from '../domain/dial-result.js';
import type { DialAllowance } from './dial-allowance.js';
import type { ConnectionAccounts } from '../domain/retention-ledger.js';
import type { ResolveHandler } from './name-resolution.js';

export type { TunnelSnapshot };

export interface TunnelOptions {
  /** 'agent' assigns odd connectIDs, 'server' even ones. */
  side: 'agent' | 'server';
  features: FeatureSet;
  log: Logger;
  limits?: Partial<TunnelLimits>;
  /**
   * The dial rates and counts of the identity this tunnel belongs to, shared
   * with its other tunnels (dial-allowances.ts): a reconnect or a second
   * stream starts with what the others left. Absent: the tunnel's own.
   */
  allowance?: DialAllowance;
  /** Performs dials requested by the peer; absent means every DIAL_REQ is refused. */
  dialHandler?: DialHandler;
  /**
   * With the resolve feature: resolves the names the peer asks for
   * (KANAL_RESOLVE_REQ; the agent's resolver). Absent: each is answered with an error.
   */
  resolveHandler?: ResolveHandler;
  /** Text of the refusal when there is no dial handler. */
  refuseDialsReason?: string;
  /** Called once per connection when it leaves the table (for metrics). */
  onConnectionClosed?: (conn: TunnelConnection) => void;
  /** Called each time a limit refuses a dial (with its refusal reason), pauses reading or closes the stream (for metrics). */
  onLimit?: (limit: TunnelLimitName, reason: RefusalReason | undefined) => void;
  /** The flag that sets each limit, named in log lines so an operator knows what to raise. */
  limitFlags?: Partial<Record<TunnelLimitName, string>>;
  /** The kanal_refusals_total reason of each dial-refusing limit, for this kind of tunnel. */
  refusalReasons?: RefusalReasons;
  /**
   * A dial the peer asked for that was not connected: refused (by a limit:
   * `reason`), failed, or timed out (for the audit log; DIAL_RSP told the peer).
   */
  onInboundDialFailed?: (dial: InboundDialFailure) => void;
  /**
   * With the resume feature: how long a lost stream's connections wait for
   * reattach() before they are closed (0 or absent: a lost stream closes the
   * tunnel, as without the feature).
   */
  resumeTimeoutMs?: number;
  /** Bytes sent again on a resumed stream (metrics). */
  onReplayed?: (bytes: number) => void;
  /** Where each connection charges what it holds (the server's ledger: the agent's account); absent: not charged. */
  accounts?: ConnectionAccounts;
  /** A connection closed for the peer's protocol fault, with its kanal_refusals_total reason (metrics). */
  onPeerFault?: (reason: RefusalReason) => void;
}

/** A refusal is data, not an Error: a peer flooding refused DIAL_REQs must not cost a stack trace each. */
export interface InboundDialFailure {
  dialID: bigint;
  address: string;
  result: DialFailure;
  /** What the peer was told (DIAL_RSP's error), or why it was not told (cancelled). */
  error: string;
  /** Set when a limit or a rule of this side refused it. */
  reason?: RefusalReason;
  /** From DIAL_REQ to the refusal or failure. */
  ms: number;
}

export interface TunnelStats {
  connections: number;
  pendingDials: number;
  inboundDials: number;
  /** Window growth its connections hold now (see TunnelLimits.windowGrowthBudgetBytes). */
  windowGrowthBytes: number;
  /** True while the tunnel does not read its stream (a slow local reader, or a peer that does not read). */
  readPaused: boolean;
  /** True while the stream is lost and the tunnel waits for a resume. */
  detached: boolean;
}

export interface TunnelEvents {
  'drain-requested': [];
  /** The stream was lost; connections wait for reattach() (resume). */
  detached: [error: Error];
  /** No new stream came within the resume timeout; 'close' follows. */
  'resume-expired': [];
  /** A new stream is under the tunnel, `detachedMs` after the loss. */
  resumed: [detachedMs: number];
  close: [error: Error | undefined];
}
