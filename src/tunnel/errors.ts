/** Dial failures as exceptions, and their HTTP CONNECT status codes (DESIGN.md section 2). */
import type { DialFailure } from '../domain/dial-result.js';

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
