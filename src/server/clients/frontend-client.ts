/**
 * Who a frontend client is and what it may reach (docs/frontends.md): every
 * front door (HTTP CONNECT and forward proxy, gRPC, SOCKS5) asks its tenant's
 * FrontendClients to admit a connection's client from what the door read of
 * it (certificate, Unix peer, a token it presented), then to dial for that
 * client. The rules, limits, name resolution and direct routes all live
 * behind dial(), so every door refuses and counts the same way.
 */
import type net from 'node:net';
import type { CancelSignal } from '../../common/cancel.js';
import type { TunnelConnection, ClientIdentity } from '../../tunnel/connection.js';
import type { ResolvedName } from '../../tunnel/name-resolution.js';

/** A client once admitted: its name (a `clients:` entry, or the kube-apiserver's), and its connection's identity. */
export interface FrontendClient {
  /** The name in logs, audit records and metrics' `client` label. */
  readonly name: string;
  readonly identity: ClientIdentity;
}

/** What a door read of a connection's client. */
export interface ClientCredentials {
  readonly identity: ClientIdentity;
  /** A bearer token the client presented (Proxy-Authorization: Bearer; a SOCKS5 password, RFC 1929). */
  readonly token?: string;
  /** The door's name (frontend-registry.ts). */
  readonly door: string;
}

/** Admission refused: `status` 407 when presenting a credential would help, 403 when this one may not. */
export class ClientRefused extends Error {
  override name = 'ClientRefused';
  constructor(
    readonly status: 403 | 407,
    message: string,
  ) {
    super(message);
  }
}

/** A destination dialled for a client: through a tunnel, or (a direct route) by the server itself. */
export type Dialed = { readonly via: 'tunnel'; readonly conn: TunnelConnection } | { readonly via: 'direct'; readonly socket: net.Socket };

/** Dials through some agent of the tenant (frontends/backend-dialer.ts), as the clients' dials end. */
export interface AgentDialer {
  /** `routeHost`: the host the agent is picked for, when not the address's (a name dialled by an address it resolved to). */
  dial(address: string, signal: CancelSignal | undefined, client: ClientIdentity, routeHost?: string): Promise<TunnelConnection>;
  /** Resolves `name` inside the cluster through an agent picked as for a dial to it. */
  resolve(name: string, signal?: CancelSignal): Promise<ResolvedName>;
}

/** One tenant's frontend clients. */
export interface FrontendClients {
  /** Who the client is; rejects with ClientRefused naming what to present or why not. */
  admit(credentials: ClientCredentials, signal?: CancelSignal): Promise<FrontendClient>;
  /**
   * Dials `address` (host:port; a name is resolved inside the cluster) for `client`, within its rules
   * and limits; rejects with a DialError ('forbidden' names the rule, 'unresolved' the name and resolver).
   */
  dial(client: FrontendClient, address: string, signal?: CancelSignal): Promise<Dialed>;
}
