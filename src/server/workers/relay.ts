/**
 * A worker's relay (docs/multi-tenant.md, "Workers"): a connection this
 * worker recognised as a tenant another worker serves goes to that worker
 * whole (handoff.ts), and an agent connection that neither its server name
 * nor a certificate placed is placed by its first request's token
 * (first-request.ts). What the listeners see is the gRPC server wrapped.
 */
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { GrpcServerTransport } from '../../transport/transport.js';
import type { AgentCredential } from '../identity/agent-credential.js';
import { forward, type Handoff } from './handoff.js';
import { readFirstRequest } from './first-request.js';
import type { WorkerPlace } from './worker-env.js';
import type { TenantFrontend } from '../frontends/frontend.js';

/** How long an agent connection placed by its token has for its first request (the HTTP/2 handshake's time, h2/server.ts). */
const FIRST_REQUEST_TIMEOUT_MS = 10_000;

export interface WorkerRelayOptions {
  worker: WorkerPlace;
  /** How many workers share `tenant` (its tenants-file `tenant-workers`, as last applied; 1 for a tenant the file does not have). */
  shareOf(tenant: string): number;
  /** The tenant a token's issuer names, in the directory as last applied. */
  tenantOfToken(authorization: readonly string[]): string | undefined;
  /** Whether any tenant places agents by token (else an unplaced agent stays here). */
  hasTokenIssuers(): boolean;
  /** How the listeners name a peer (listeners.ts peerOf), for the handoff line. */
  peerOf(connection: Duplex): string;
  log: Logger;
}

export class WorkerRelay {
  /** Which owner of a tenant shared by several workers the next relayed connection goes to. */
  private turn = 0;

  constructor(private readonly opts: WorkerRelayOptions) {}

  /** The workers that serve `tenant`, first owner first. */
  owners(tenant: string): number[] {
    return this.opts.worker.owners(tenant, this.opts.shareOf(tenant));
  }

  /** Whether this worker serves `tenant`. */
  owns(tenant: string): boolean {
    return this.ownsShared(tenant, this.opts.shareOf(tenant));
  }

  /** Whether this worker serves `tenant` when `share` workers serve it (a tenants file being applied). */
  ownsShared(tenant: string, share: number): boolean {
    return this.opts.worker.owners(tenant, share).includes(this.opts.worker.index);
  }

  /**
   * Where a connection of another worker's tenant goes: its owner, or for a
   * tenant shared by several, each in turn, so an agent's successive
   * connections reach each of them (it keeps one tunnel per server ID).
   */
  private target(tenant: string): number {
    const owners = this.owners(tenant);
    return owners[this.turn++ % owners.length];
  }

  private peer(connection: Duplex): string {
    return this.opts.peerOf(connection);
  }

  /** The gRPC server as the listeners see it: another worker's tenant's connection is relayed there. */
  wrap<C extends { tenant?: string; credential?: AgentCredential }>(
    grpc: GrpcServerTransport<C>,
    kind: Handoff['kind'],
  ): GrpcServerTransport<C> {
    const w = this.opts.worker;
    return {
      injectConnection: (connection, context) => {
        const tenant = context?.tenant;
        if (tenant === undefined && kind === 'agent' && this.opts.hasTokenIssuers()) {
          this.routeByToken(connection, context, grpc);
          return;
        }
        if (tenant === undefined || this.owns(tenant)) {
          grpc.injectConnection(connection, context);
          return;
        }
        forward(
          connection,
          w.handoffPath(this.target(tenant)),
          { kind, tenant, peer: this.peer(connection), ...(context?.credential ? { credential: context.credential } : {}) },
          this.opts.log,
        );
      },
      close: (graceMs) => grpc.close(graceMs),
    };
  }

  /**
   * An agent connection that neither its server name nor a certificate
   * placed, so its token's issuer will name its tenant. Its first request's
   * token is read (first-request.ts); when that names a tenant another worker
   * serves, the whole connection goes there, marked so that worker judges
   * every stream by its token as this one would have.
   */
  private routeByToken<C extends { tenant?: string; credential?: AgentCredential }>(
    connection: Duplex,
    context: C | undefined,
    grpc: GrpcServerTransport<C>,
  ): void {
    const w = this.opts.worker;
    const log = this.opts.log;
    const peer = this.peer(connection);
    void readFirstRequest(connection, FIRST_REQUEST_TIMEOUT_MS).then((first) => {
      if (first.kind === 'none') {
        log.debug({ peer, why: first.why }, 'closed agent connection before its first request');
        connection.destroy();
        return;
      }
      if (connection.destroyed) return;
      connection.unshift(first.replay);
      const tenant = this.opts.tenantOfToken(first.authorization);
      if (tenant === undefined || this.owns(tenant)) {
        grpc.injectConnection(connection, context);
        connection.resume();
        return;
      }
      const to = this.target(tenant);
      log.debug({ peer, tenant, to }, "agent connection relayed to its token's tenant");
      forward(connection, w.handoffPath(to), { kind: 'agent', tenant, peer, byToken: true }, log);
    });
  }

  /** What serves a frontend connection of another worker's tenant, whichever front door took it: its relay there; undefined for this worker's own. */
  frontend(tenant: string | undefined): Pick<TenantFrontend, 'serve'> | undefined {
    if (tenant === undefined || this.owns(tenant)) return undefined;
    const w = this.opts.worker;
    return {
      serve: (socket, { peer }) => forward(socket, w.handoffPath(this.target(tenant)), { kind: 'frontend', tenant, peer }, this.opts.log),
    };
  }
}
