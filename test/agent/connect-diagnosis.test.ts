/**
 * The diagnosis of a failed connect reads this side's errors only: a
 * server's status text never decides the cause (a server that cannot reach
 * its Kubernetes API says "ECONNREFUSED" about that, not about us), while
 * grpc-js's own words for a connection that never came up are read like
 * the socket's. The real failures, through real processes:
 * test/e2e/agent-connect-errors.test.ts.
 */
import test from 'ava';
import { diagnoseConnectError, type ConnectAttempt } from '../../src/agent/connect-diagnosis.js';
import { GrpcStatus, GrpcStatusError } from '../../src/transport/grpc-status.js';

const attempt: ConnectAttempt = {
  target: '10.0.0.1:8091',
  verifyName: 'cp.example',
  clientCertificate: true,
  token: false,
  connectTimeoutMs: 1000,
};

test("a server's status text is its reason, never the cause of our connection", (t) => {
  const server = new GrpcStatusError(
    GrpcStatus.UNAVAILABLE,
    'cannot check the token: cannot reach the Kubernetes API at https://10.0.0.9:6443: connect ECONNREFUSED 10.0.0.9:6443',
  );
  const d = diagnoseConnectError(server, attempt);
  t.is(d.cause, 'other');
  t.is(d.message, `10.0.0.1:8091: ${server.message}`);
});

test("grpc-js's words for a connection that never came up are read as the socket's", (t) => {
  const said = (details: string): string => diagnoseConnectError(new GrpcStatusError(GrpcStatus.UNAVAILABLE, details), attempt).cause;
  t.is(said('No connection established. Last error: connect ECONNREFUSED 10.0.0.1:8091 (2026-11-27T05:55:46.968Z)'), 'refused');
  t.is(said('No connection established. Last error: Error: self-signed certificate in certificate chain.'), 'untrusted');
  t.is(
    said("No connection established. Last error: Error [ERR_TLS_CERT_ALTNAME_INVALID]: Hostname/IP does not match certificate's altnames"),
    'name-mismatch',
  );
});

test('a refusal the server sends is named with the flag to check', (t) => {
  const d = diagnoseConnectError(new GrpcStatusError(GrpcStatus.UNAUTHENTICATED, 'token rejected'), { ...attempt, token: true });
  t.is(d.cause, 'agent-refused');
  t.regex(d.message, /the server refused the agent: token rejected; check the token in --service-account-token-path/);
});
