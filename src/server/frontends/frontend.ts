/**
 * A front door: one protocol the kube-apiserver (or another client) speaks
 * to the server's frontend listener. The listener reads a connection's first
 * bytes (protocol-sniffer.ts), asks the registered doors in order which one
 * they belong to (frontend-registry.ts), and hands the connection to that
 * door's serve(); `--mode` says which doors a listener serves
 * (docs/frontends.md). A door that needs a part in each tenant (its dials,
 * its refusals, its count) builds it with forTenant().
 */
import type net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { GrpcServerTransport } from '../../transport/transport.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import type { Refusals } from '../../domain/refusal-log.js';
import type { BackendDialer } from './backend-dialer.js';
import type { FrontendClients } from '../clients/frontend-client.js';

/** What the listener established about a connection: on a server of many tenants, whose it is. */
export interface FrontendConnection {
  readonly tenant?: string;
  /** Who the client is, read from the connection (client-identity.ts), for the audit log. */
  readonly client?: ClientIdentity;
}

/** What the first bytes of a connection say of it to one door. */
export type Recognition = 'yes' | 'no' | 'more';

/** What a door gets with a connection. */
export interface FrontendContext {
  /** Names the client in logs ("host:port" or "unix:path"). */
  readonly peer: string;
  /** Whose the connection is, and who the client is. */
  readonly connection: FrontendConnection & { readonly client: ClientIdentity };
  /** What is left of the request-head deadline, counted from accept (--frontend-header-timeout). */
  readonly headDeadlineMs: number;
  /** What the server lends its doors. */
  readonly server: FrontendServices;
}

/** One tenant's part of a door: serves that tenant's connections of the door. */
export interface TenantFrontend {
  serve(socket: Duplex, context: FrontendContext): void;
  /** Connections served now. */
  readonly size: number;
  /** The tenant stops: what the door holds for it beyond its clients' connections (idle pooled connections) goes. */
  close?(): void;
}

/** What a tenant lends each door's part in it. */
export interface TenantServices {
  /** Dials through the tenant's agents. */
  readonly dialer: BackendDialer;
  /** Who a client is and what it may reach: doors admit a client, then dial for it (clients/frontend-client.ts). */
  readonly clients: FrontendClients;
  /** The door's own refusal log in the tenant (counted, rate limited, flushed with the tenant). */
  readonly refusals: Refusals;
  readonly log: Logger;
}

/** What the server lends the doors of its listeners. */
export interface FrontendServices {
  /** The process's gRPC server for frontend connections: each stream goes to its tenant's ProxyService. */
  readonly grpc: GrpcServerTransport<FrontendConnection>;
  /**
   * `door`'s part in `tenant` (undefined: the tenant of a server of one cluster), or on a worker
   * what relays the connection to the worker serving that tenant; undefined: the tenant is gone.
   */
  tenantFrontend(tenant: string | undefined, door: string): Pick<TenantFrontend, 'serve'> | undefined;
  readonly log: Logger;
}

export interface Frontend<Name extends string = string> {
  /** Its `--mode` value and its name in logs. */
  readonly name: Name;
  /**
   * What the first bytes of a decrypted connection (at least one) say: 'more' while they could
   * still be this door's. Doors are asked in registration order; the first not to say 'no' decides.
   */
  recognises(firstBytes: Buffer): Recognition;
  /** The door's part in a tenant, built with the tenant, when it has one. */
  forTenant?(tenant: TenantServices): TenantFrontend;
  /** Takes a connection recognised as this door's: paused, its first bytes put back. */
  serve(socket: net.Socket, context: FrontendContext): void;
}
