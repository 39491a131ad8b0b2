/** Dial failures as exceptions, and their HTTP CONNECT status codes (DESIGN.md section 2). */
import type { DialFailure } from '../domain/dial-result.js';
import type { RefusalReason } from '../domain/refusal-reason.js';

export class DialError extends Error {
  override name = 'DialError';
  /** The DIAL_REQ's ID, once one went to the peer: the audit log's ID, the same in the peer's line. */
  dialID: bigint | undefined;
  constructor(
    readonly failure: DialFailure,
    message: string,
    /** The kanal_refusals_total reason, when a limit or a rule of this proxy refused the dial. */
    readonly refusal?: RefusalReason,
  ) {
    super(message);
  }
}

export const HTTP_STATUS_FOR_FAILURE: Record<DialFailure, number> = {
  'no-backend': 500,
  refused: 502,
  exhausted: 503,
  timeout: 504,
  cancelled: 502,
  'tunnel-closed': 502,
  forbidden: 403,
  unresolved: 502,
};

export class TunnelClosedError extends Error {
  override name = 'TunnelClosedError';
}
