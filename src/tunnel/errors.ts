/**
 * Why a dial through a tunnel failed. Frontends map these onto HTTP CONNECT
 * status codes (DESIGN.md section 2) and gRPC DIAL_RSP errors.
 */
export type DialFailure =
  | 'no-backend' // nobody to dial through (HTTP 500)
  | 'refused' // the far side tried and failed (HTTP 502)
  | 'exhausted' // too many pending dials (HTTP 503)
  | 'timeout' // no DIAL_RSP in time (HTTP 504)
  | 'cancelled' // the requester went away
  | 'tunnel-closed' // the tunnel died while the dial was pending (HTTP 502)
  | 'forbidden'; // destination not allowed (HTTP 403)

export class DialError extends Error {
  override name = 'DialError';
  constructor(
    readonly failure: DialFailure,
    message: string,
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
};

export class TunnelClosedError extends Error {
  override name = 'TunnelClosedError';
}
