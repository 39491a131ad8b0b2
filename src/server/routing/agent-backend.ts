/**
 * One agent tunnel as routing sees it. Declared here, below the registry
 * (agent-registry.ts) that admits and holds these and the router that picks
 * among them, so neither has to import the other for it.
 */
import type { Tunnel } from '../../tunnel/tunnel.js';
import type { Liveness } from '../../transport/liveness.js';
import type { AgentIdentifiers } from '../../wire/agent-identifiers.js';
import type { AgentCredential } from '../identity/agent-credential.js';

export interface AgentBackend {
  /** The label the agent announced (upstream's agentID). */
  agentID: string;
  /** What authenticated the connection: the agent's identity. */
  credential: AgentCredential;
  identifiers: AgentIdentifiers;
  tunnel: Tunnel;
  /** PING liveness of the connection, where the transport checks it. */
  liveness?: Liveness;
  peer: string;
  connectedAt: Date;
}
