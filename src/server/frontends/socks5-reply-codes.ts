/**
 * What the server says to a SOCKS5 client: REP codes (RFC 1928 section 6),
 * the method selection (section 3) and the sub-negotiation status (RFC 1929
 * section 2). A dial's failure maps onto the REP code that says the same
 * thing (docs/frontends.md): the SOCKS twin of HTTP_STATUS_FOR_FAILURE.
 */
import type { DialFailure } from '../../domain/dial-result.js';

export const SocksRep = {
  succeeded: 0x00,
  generalFailure: 0x01,
  notAllowed: 0x02,
  networkUnreachable: 0x03,
  hostUnreachable: 0x04,
  connectionRefused: 0x05,
  ttlExpired: 0x06,
  commandNotSupported: 0x07,
  addressTypeNotSupported: 0x08,
} as const;

export type SocksRepCode = (typeof SocksRep)[keyof typeof SocksRep];

export const REP_FOR_FAILURE: Record<DialFailure, SocksRepCode> = {
  // A rule of the client's refused the destination: "connection not allowed by ruleset".
  forbidden: SocksRep.notAllowed,
  // No agent to dial through: the cluster's network cannot be reached.
  'no-backend': SocksRep.networkUnreachable,
  // The name did not resolve inside the cluster.
  unresolved: SocksRep.hostUnreachable,
  refused: SocksRep.connectionRefused,
  // No answer in time: RFC 1928's nearest, as Go's and curl's messages render it.
  timeout: SocksRep.ttlExpired,
  exhausted: SocksRep.generalFailure,
  cancelled: SocksRep.generalFailure,
  'tunnel-closed': SocksRep.generalFailure,
};

/**
 * A reply: VER 5, REP, RSV, then BND.ADDR 0.0.0.0 and BND.PORT 0. The bound
 * address is the server's end of its connection to the destination, which is
 * an agent's socket inside the cluster: it means nothing to the client (and
 * names a node's address), and CONNECT clients (curl, Go) ignore it.
 */
export function socksReply(rep: SocksRepCode): Buffer {
  return Buffer.from([0x05, rep, 0x00, 0x01, 0, 0, 0, 0, 0, 0]);
}

export const SOCKS_SUCCEEDED = socksReply(SocksRep.succeeded);

/** Method selection: the method chosen. */
export function socksMethodChoice(method: number): Buffer {
  return Buffer.from([0x05, method]);
}

/** Method selection: none of the offered methods is acceptable; the client must close (RFC 1928 section 3). */
export const SOCKS_NO_ACCEPTABLE_METHOD = socksMethodChoice(0xff);

/** RFC 1929 section 2: status 0 success; any other is a failure, after which the connection is closed. */
export const SOCKS_AUTH_SUCCESS = Buffer.from([0x01, 0x00]);
export const SOCKS_AUTH_FAILURE = Buffer.from([0x01, 0x01]);
