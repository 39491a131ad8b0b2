/**
 * Why the agent cannot open a tunnel to a server, said as the cause and the
 * flag (or file) to change. One diagnosis for `kanal agent --check`
 * (preflight-server.ts) and for the running agent's log and /readyz
 * (server-tunnels.ts): an error from the socket, TLS, HTTP/2 or the server's
 * gRPC status, whichever transport raised it.
 */
import { isIP } from 'node:net';
import { GrpcStatus, GrpcStatusError } from '../transport/grpc-status.js';
import { ALPN_NOT_H2, CLOSED_AFTER_TLS_HANDSHAKE } from '../transport/connect-stage.js';
import { FLAG } from './settings.js';

// The server's settings these hints name, spelt once here: the agent may not import the server's table (test/packaging/layers.ts).
const AGENT_PORT = '--agent-port';
const CLUSTER_CA_CERT = '--cluster-ca-cert';
export const ALLOW_UNAUTHENTICATED_AGENTS = '--allow-unauthenticated-agents';

export type ConnectCause =
  | 'refused'
  | 'timeout'
  | 'dns'
  | 'unreachable'
  | 'untrusted'
  | 'name-mismatch'
  | 'credentials-refused'
  | 'agent-refused'
  | 'not-tls'
  | 'alpn'
  | 'other';

export interface Diagnosis {
  /** What kind of failure: the agent logs each change of cause once (server-tunnels.ts). */
  readonly cause: ConnectCause;
  /** The cause and what to change, for a log line, /readyz or the --check list. */
  readonly message: string;
}

/** What the agent tried: the address, the name the certificate is checked against, the credentials it offered. */
export interface ConnectAttempt {
  /** host:port dialled. */
  target: string;
  /** --tls-server-name, else the host given. */
  verifyName: string;
  clientCertificate: boolean;
  token: boolean;
  connectTimeoutMs: number;
}

/** Node's and OpenSSL's codes for a certificate chain the CA does not verify (X509_V_ERR_* as Node names them). */
const UNTRUSTED = /CERT|SELF_SIGNED|ISSUER|SIGNATURE|VERIFY|CHAIN/;

/** The same in OpenSSL's words, which grpc-js passes on without the code. */
const UNTRUSTED_TEXT =
  /self-signed certificate|unable to (get local issuer|verify the first) certificate|certificate has expired|certificate is not yet valid|certificate signature failure/;

interface Link {
  code: string;
  message: string;
  /** The message when this side wrote it (a socket's, TLS's, the transport's), '' for the server's status text: a server's words never decide the cause. */
  local: string;
  err: Error;
}

/**
 * Whether `e`'s message is this side's: not a status the server sent. grpc-js
 * puts a connection that never came up in an UNAVAILABLE status of its own
 * ("No connection established. Last error: ...", its load balancer's words).
 */
function isLocal(e: Error): boolean {
  return !(e instanceof GrpcStatusError) || e.cause !== undefined || e.message.startsWith('No connection established');
}

/** The error and its causes (bounded), outermost first. */
function chain(err: unknown): Link[] {
  const links: Link[] = [];
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 6; e = e.cause, depth++) {
    const code: unknown = (e as NodeJS.ErrnoException).code;
    links.push({ code: typeof code === 'string' ? code : '', message: e.message, local: isLocal(e) ? e.message : '', err: e });
  }
  if (links.length === 0) links.push({ code: '', message: String(err), local: String(err), err: new Error(String(err)) });
  return links;
}

/** The names a certificate carries, from Node's altname error (its `cert`), for the message. */
function altNames(err: Error): string | undefined {
  const cert: unknown = Reflect.get(err, 'cert');
  const san: unknown = cert && typeof cert === 'object' ? Reflect.get(cert, 'subjectaltname') : undefined;
  return typeof san === 'string' && san !== '' ? san : undefined;
}

function nameMismatch(a: ConnectAttempt, err: Error): string {
  const names = altNames(err);
  const carries = names ? ` (it carries ${names})` : '';
  const ipNote =
    isIP(a.verifyName) !== 0
      ? `; an IP address is checked against the certificate's IP SANs only, so the certificate must carry IP ${a.verifyName}, or set ${FLAG['tls-server-name']} to a DNS name it carries`
      : `; set ${FLAG['tls-server-name']} to a name it carries, or reissue the server's certificate with ${a.verifyName}`;
  return `${a.target}: the server certificate is not valid for ${a.verifyName}${carries}${ipNote}`;
}

function credentialsRefused(a: ConnectAttempt): string {
  const why = a.clientCertificate
    ? `it refused the agent certificate: is ${FLAG['agent-cert']} signed by a CA in the server's ${CLUSTER_CA_CERT} (and, where the server pins roles, does it match --agent-client-subject)?`
    : a.token
      ? `it requires a client certificate (${FLAG['agent-cert']}, ${FLAG['agent-key']}) besides the token: the server has ${CLUSTER_CA_CERT}`
      : `it requires a client certificate (${FLAG['agent-cert']}, ${FLAG['agent-key']}) or a token (${FLAG['service-account-token-path']}), unless started with ${ALLOW_UNAUTHENTICATED_AGENTS}`;
  return `${a.target}: the server closed the connection right after the TLS handshake: ${why}`;
}

function agentRefused(a: ConnectAttempt, err: GrpcStatusError): string {
  const fix = a.token
    ? `check the token in ${FLAG['service-account-token-path']}: the server's --agent-namespace, --agent-service-account and --authentication-audience must match it`
    : `the server authenticates agents by service account token: give ${FLAG['service-account-token-path']}`;
  const said = err.message || 'unauthenticated';
  // A Kanal server's reason names the agent flag already; upstream's says less.
  return `${a.target}: the server refused the agent: ${said}${/--[a-z]/.test(said) ? '' : `; ${fix}`}`;
}

/** The innermost message, without the wrappers that say nothing ("The pending stream has been canceled"). */
function innermost(links: readonly Link[]): string {
  return links[links.length - 1].message.trim().replace(/\s+/g, ' ');
}

export function diagnoseConnectError(err: unknown, a: ConnectAttempt): Diagnosis {
  const links = chain(err);
  // grpc-js reports a socket's failure in its message only ("No connection established. Last error: connect ECONNREFUSED ...").
  const has = (code: string): Link | undefined => links.find((l) => l.code === code || new RegExp(`\\b${code}\\b`).test(l.local));
  const status = links.find((l) => l.err instanceof GrpcStatusError)?.err as GrpcStatusError | undefined;
  const said = (cause: ConnectCause, message: string): Diagnosis => ({ cause, message });
  if (has('ECONNREFUSED'))
    return said(
      'refused',
      `${a.target}: connection refused, nothing listens there: check ${FLAG['proxy-server-host']} and ${FLAG['proxy-server-port']} (the server's ${AGENT_PORT}), and that the kanal server runs`,
    );
  if (has('ETIMEDOUT') || has('TIMEOUT') || status?.code === GrpcStatus.DEADLINE_EXCEEDED)
    return said(
      'timeout',
      `${a.target}: no answer within ${a.connectTimeoutMs} ms (${FLAG['connect-timeout']}): a firewall, a wrong ${FLAG['proxy-server-host']} or ${FLAG['proxy-server-port']}, or the server is down`,
    );
  const dns = has('ENOTFOUND') ?? has('EAI_AGAIN');
  if (dns)
    return said('dns', `${a.target}: cannot resolve the host name (${dns.code}): check ${FLAG['proxy-server-host']} and this node's DNS`);
  const route = has('EHOSTUNREACH') ?? has('ENETUNREACH');
  if (route)
    return said(
      'unreachable',
      `${a.target}: no route to the server (${route.code}): check ${FLAG['proxy-server-host']} and this node's network`,
    );
  const altname = has('ERR_TLS_CERT_ALTNAME_INVALID') ?? links.find((l) => /does not match certificate's altnames/.test(l.local));
  if (altname) return said('name-mismatch', nameMismatch(a, altname.err));
  const alpn = has(ALPN_NOT_H2) ?? links.find((l) => /NO_APPLICATION_PROTOCOL/.test(l.code));
  if (alpn)
    return said(
      'alpn',
      `${a.target}: the server did not agree on HTTP/2 in ALPN (${alpn.message}): is ${FLAG['proxy-server-port']} a kanal or Konnectivity agent port? A load balancer in between must pass ALPN h2 through (or route by ${FLAG['alpn-proto']})`,
    );
  if (links.some((l) => /WRONG_VERSION_NUMBER|PACKET_LENGTH_TOO_LONG|wrong version number/i.test(`${l.code} ${l.local}`)))
    return said(
      'not-tls',
      `${a.target} does not speak TLS: is ${FLAG['proxy-server-port']} the server's ${AGENT_PORT} (not its health, admin or frontend port)?`,
    );
  const untrusted = links.find((l) => l.code !== '' && UNTRUSTED.test(l.code)) ?? links.find((l) => UNTRUSTED_TEXT.test(l.local));
  if (untrusted)
    return said(
      'untrusted',
      `${a.target}: the server certificate is not trusted (${untrusted.code ? `${untrusted.message}, ${untrusted.code}` : untrusted.message}): ${FLAG['ca-cert']} must hold the CA that signed the server's certificate (its --cluster-cert)`,
    );
  if (has(CLOSED_AFTER_TLS_HANDSHAKE)) return said('credentials-refused', credentialsRefused(a));
  if (status?.code === GrpcStatus.UNAUTHENTICATED) return said('agent-refused', agentRefused(a, status));
  if (status && status.code !== GrpcStatus.UNAVAILABLE && status.code !== GrpcStatus.UNKNOWN)
    return said(
      'agent-refused',
      `${a.target}: the server refused the agent stream (${GrpcStatus[status.code] ?? status.code}): ${status.message}`,
    );
  if (has('ECONNRESET'))
    return said(
      'other',
      `${a.target}: the server reset the connection during the TLS handshake (ECONNRESET): a front that refuses this client, or a server that refused its credentials (${FLAG['agent-cert']}, the server's ${CLUSTER_CA_CERT})`,
    );
  return said('other', `${a.target}: ${innermost(links)}`);
}
