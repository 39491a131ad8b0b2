/**
 * Who an agent is (docs/trust-model.md): what authenticated its connection. The agentID an
 * agent announces is only a label; the registry groups and bounds agents by
 * credential, so one node's certificate cannot pose as other nodes.
 *
 * - A client certificate is identified by its issuer and subject, not by its
 *   key or serial: a certificate renewed by the same CA for the same subject
 *   (kubelet-style rotation) is the same credential, as the CA vouches for
 *   the subject. The issuer is part of it so that two trusted CAs cannot
 *   vouch for each other's names.
 * - Without authentication (--allow-unauthenticated-agents) the only thing
 *   the server knows is the peer's address: agents are keyed by it.
 * - A service account token is identified by the account (name and
 *   uid) and the pod it is bound to: a projected token names its pod, so
 *   each DaemonSet pod is its own credential (one agent per pod with the
 *   default --max-agents-per-credential) while its rotated tokens stay the
 *   same credential. A token bound to no pod is the account alone.
 */
import type { X509Certificate } from 'node:crypto';
import type { AgentTokenIdentity } from './token-authenticator.js';

export interface AgentCredential {
  /** Exact identity: connections with equal keys are the same principal. */
  readonly key: string;
  /** Readable form for logs and refusals. */
  readonly subject: string;
}

/** Longest subject written to a log line (a CA-signed name can still be long). */
const MAX_SUBJECT_CHARS = 200;

/** A certificate's distinguished name on one line, bounded. */
export function oneLine(dn: string): string {
  const s = dn.replace(/\n/g, ', ');
  return s.length > MAX_SUBJECT_CHARS ? `${s.slice(0, MAX_SUBJECT_CHARS)}…` : s;
}

export function certificateCredential(cert: X509Certificate): AgentCredential {
  return { key: `x509\n${cert.issuer}\n\n${cert.subject}`, subject: `${oneLine(cert.subject)} (issuer ${oneLine(cert.issuer)})` };
}

export function unauthenticatedCredential(remoteAddress: string): AgentCredential {
  return { key: `address\n${remoteAddress}`, subject: `unauthenticated peer ${remoteAddress}` };
}

export function tokenCredential(id: AgentTokenIdentity): AgentCredential {
  const pod = id.podName === undefined ? '' : ` pod ${id.podName}${id.nodeName === undefined ? '' : ` on node ${id.nodeName}`}`;
  return { key: `token\n${id.username}\n${id.uid}\n${id.podUid ?? id.podName ?? ''}`, subject: oneLine(`${id.username}${pod}`) };
}

/**
 * What the agent port established about a connection before any stream:
 * who authenticated it (absent: a token on each stream decides) and, on a
 * server of many tenants, whose it is (absent: the tenant is named by the
 * stream's token, or the server has one cluster).
 */
export interface AgentConnection {
  readonly credential?: AgentCredential;
  readonly tenant?: string;
  /** The client's address when the connection was relayed from another worker (the stream's own peer is then the relay). */
  readonly peer?: string;
}
