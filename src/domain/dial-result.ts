/**
 * What becomes of a dial through a tunnel: the values of kanal_dials_total's
 * `result` label, and what upstream's dial failure counters are mapped from
 * (upstream-metrics.ts). docs/metrics.md lists them; test/common/metric-labels.test.ts
 * holds the two lists together.
 */

/**
 * Why a dial through a tunnel failed. Frontends map these onto HTTP CONNECT
 * status codes (HTTP_STATUS_FOR_FAILURE, src/tunnel/errors.ts) and gRPC DIAL_RSP errors.
 */
export const DIAL_FAILURES = [
  'no-backend', // nobody to dial through (HTTP 500)
  'refused', // the far side tried and failed (HTTP 502)
  'exhausted', // too many pending dials or connections (HTTP 503)
  'timeout', // no DIAL_RSP, or no TCP connection, in time (HTTP 504)
  'cancelled', // the requester went away
  'tunnel-closed', // the tunnel died while the dial was pending (HTTP 502)
  'forbidden', // destination not allowed (HTTP 403)
  'unresolved', // the name did not resolve inside the cluster (HTTP 502)
] as const;

export type DialFailure = (typeof DIAL_FAILURES)[number];

/** The agent's node -> control plane dials that never reached a tunnel (src/agent/node-listeners.ts). */
export const DIAL_NOT_SENT = [
  'no-tunnel', // no tunnel to a proxy server came up in time
  'unsupported-by-server', // no connected server negotiated node -> control plane dials
] as const;

export const DIAL_RESULTS = ['ok', ...DIAL_FAILURES, ...DIAL_NOT_SENT] as const;

/** kanal_dials_total{result}. */
export type DialResult = (typeof DIAL_RESULTS)[number];

/**
 * The end of a Kanal server's answer to a node -> control plane dial its
 * allow-list refuses (src/server/destinations/destination-dialer.ts). DIAL_RSP
 * carries only an error text, so the agent reads its `forbidden` from it and
 * both sides' metrics and audit lines give the dial one result.
 */
export const NOT_ALLOWED_BY_SERVER = 'is not allowed by the proxy server';

/** What a requester makes of the far side's DIAL_RSP error: `forbidden` when a Kanal server's allow-list refused it, else `refused`. */
export function answeredFailure(error: string): 'forbidden' | 'refused' {
  return error.endsWith(NOT_ALLOWED_BY_SERVER) ? 'forbidden' : 'refused';
}
