/**
 * How far a client connection got before it failed, for the agent's
 * diagnosis (src/agent/connect-diagnosis.ts): a server that closes the
 * connection right after the TLS handshake, before its HTTP/2 SETTINGS, has
 * refused the client's credentials. A Kanal server verifies the client
 * certificate after the handshake so it can log why (src/server/listeners.ts);
 * with TLS 1.3 the client's handshake is done before the server judges it
 * (RFC 8446, section 4.4.2), so nothing else tells the agent.
 */

/** The `code` of the error a channel gives for a connection closed between the TLS handshake and HTTP/2. */
export const CLOSED_AFTER_TLS_HANDSHAKE = 'KANAL_CLOSED_AFTER_TLS_HANDSHAKE';

/** The error for a connection closed after the TLS handshake and before the peer's HTTP/2 SETTINGS; `cause`: the socket's error, if any. */
export function closedAfterTlsHandshake(cause?: Error): Error {
  const err = new Error('the server closed the connection right after the TLS handshake', cause ? { cause } : undefined);
  return Object.assign(err, { code: CLOSED_AFTER_TLS_HANDSHAKE });
}

/** The error for a TLS server that chose no HTTP/2 in ALPN (`got`: what it chose, `false` for none). */
export function alpnNotH2(got: string | false | null): Error {
  return Object.assign(new Error(`server did not negotiate HTTP/2 via ALPN (got ${String(got)})`), { code: ALPN_NOT_H2 });
}

export const ALPN_NOT_H2 = 'KANAL_ALPN_NOT_H2';
