/**
 * Why a connection, stream or dial was refused: the values of
 * kanal_refusals_total's `reason` label, on the server (src/domain/refusal-log.ts
 * and the tunnels' limits) and on the agent (its tunnels' limits).
 * docs/metrics.md lists them; test/common/metric-labels.test.ts holds the two lists together.
 */
export const REFUSAL_REASONS = [
  // Server, agent port: the connection (listeners.ts)
  'agent_tls_handshake',
  'agent_certificate',
  'agent_role',
  // Server, agent port: the stream's token (token-authenticator.ts, one per TokenRefusalKind)
  'agent_token_no_token',
  'agent_token_malformed',
  'agent_token_rejected',
  'agent_token_wrong_audience',
  'agent_token_wrong_identity',
  'agent_token_unavailable',
  // Server, agent port: the stream's metadata and admission (agent-service.ts, agent-registry.ts)
  'agent_metadata',
  'agent_credential_full',
  'agent_tunnels_full',
  'agent_admissions_busy',
  // Server, an agent's tunnel: its limits (--max-*-per-agent)
  'agent_pending_dials',
  'agent_node_to_cp_connections',
  'agent_cp_to_node_connections',
  // Server and agent, a tunnel's dial rate, either direction (--dial-rate-per-agent, --dial-rate)
  'throttled',
  // Server and agent, a connection: the peer's credit or resume limit beyond the protocol's largest window
  'window_beyond_maximum',
  // Server, an agent's connections shed: the process holds more than --memory-budget and this agent the most
  'memory_budget',
  // Server, frontend: the connection (listeners.ts)
  'frontend_tls_handshake',
  'frontend_certificate',
  'frontend_role',
  'frontend_timeout',
  'frontend_protocol',
  // Server, frontend: the CONNECT request (http-connect-frontend.ts, backend-dialer.ts)
  'frontend_header_timeout',
  'frontend_bad_request',
  'frontend_method',
  'frontend_bad_authority',
  'frontend_bad_address',
  // Server, the SOCKS5 door (socks5-frontend.ts): a malformed head, an admission refused, a command other than CONNECT
  'socks5_bad_greeting',
  'socks5_bad_request',
  'socks5_auth',
  'socks5_command',
  // Server, a gRPC frontend stream: its limits
  'frontend_pending_dials',
  'frontend_connections',
  // Server, frontend clients (clients:): admission, destination rules, a client's own limits
  'client_unknown',
  'client_forbidden',
  'client_connections',
  'client_pending_dials',
  'client_dial_rate',
  // Server, node -> control plane dials (destination-dialer.ts)
  'destination_not_allowed',
  'node_to_cp_connections',
  // Server with --tenants-config: which tenant a peer belongs to (tenants/tenant-directory.ts)
  'agent_tenant_unknown',
  'agent_tenant_ambiguous',
  'agent_tenant_mismatch',
  'agent_tenant_full',
  'frontend_tenant_unknown',
  'frontend_tenant_ambiguous',
  // Server with --tenants-config: a tenant's own limits (tenants/tenant-quota.ts)
  'tenant_connections',
  'tenant_pending_dials',
  'tenant_dial_rate',
  // Server, a frontend client's own limits (clients/client-quota.ts)
  'client_connections',
  'client_pending_dials',
  'client_dial_rate',
  // Server with --workers: the primary, a connection it could not take to read its ClientHello (workers/primary.ts)
  'client_hello_backlog',
  // Agent, a tunnel to a server: its limits (node_to_cp_connections as above, counted by the agent)
  'pending_dials',
  'cp_to_node_connections',
  // Server and agent, the health and admin ports (common/http-listener.ts: --http-max-connections, --http-idle-timeout)
  'http_port_full',
  'http_port_idle',
] as const;

export type RefusalReason = (typeof REFUSAL_REASONS)[number];
