/**
 * What a server of many tenants tells a peer that has not proven it belongs
 * to one (docs/multi-tenant.md, "What a tenant can and cannot see or do"):
 * one text per failure class, the same whether the tenant the peer named
 * (by server name, token issuer or certificate) exists or not, so that no
 * answer maps a name, an issuer or a CA to a tenant. Why it was refused goes
 * to the server's log, which may name the tenant. A peer that proved
 * membership (a certificate its tenant verified, a token its tenant's
 * kube-apiserver reviewed) is told more. Refusals at the TLS layer say
 * nothing at all: the connection is closed.
 */
import { GrpcStatus } from '../../transport/grpc-status.js';

/** An agent stream's credentials (client certificate, service account token) did not authenticate it for any tenant, or could not be checked now. */
export const AGENT_NOT_AUTHENTICATED = {
  code: GrpcStatus.UNAUTHENTICATED,
  message:
    "this server did not accept the agent's credentials (client certificate or service account token), or could not check them now; its log says why",
} as const;

/** Every text the agent port may send to an unproven peer of a shared server (a test checks the refusal paths use nothing else). */
export const UNPROVEN_PEER_REFUSALS: readonly string[] = [AGENT_NOT_AUTHENTICATED.message];
