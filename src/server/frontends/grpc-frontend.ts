/**
 * gRPC ProxyService frontend (the KAS's konnectivity-client): the frontend
 * stream is a tunnel on which the server performs dials, each one by
 * dialling through an agent and splicing the two connections. Its front
 * door (frontend.ts) is a connection that opens with the HTTP/2 preface;
 * the process's gRPC server takes it whole and hands each stream to its
 * tenant's ProxyService.
 */
import type { Logger } from 'pino';
import type { IncomingStream } from '../../transport/transport.js';
import { MD_AUTHORIZATION, MD_KANAL_FEATURES, firstValue } from '../../wire/metadata.js';
import { grpcToken } from './proxy-authorization.js';
import { Feature, formatFeatures, intersectFeatures, parseFeatures } from '../../wire/features.js';
import { Tunnel } from '../../tunnel/tunnel.js';
import type { TunnelLimits } from '../../tunnel/limits.js';
import type { BackendDialer } from './backend-dialer.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import { countTunnelLimit } from '../../tunnel/limit-metrics.js';
import type { RefusalReasons } from '../../tunnel/limit-reports.js';
import type { ClientIdentity } from '../../tunnel/connection.js';
import { closeWhenPeerGone } from '../../transport/peer-gone-watch.js';
import type { Frontend } from './frontend.js';
import { ClientRefused, type FrontendClient, type FrontendClients } from '../clients/frontend-client.js';
import { DialError } from '../../tunnel/errors.js';
import { KasOnlyClients } from '../clients/kas-only-clients.js';

const FRONTEND_REFUSALS: RefusalReasons = { maxPendingDials: 'frontend_pending_dials', maxInboundConnections: 'frontend_connections' };

const FRONTEND_FEATURES = new Set([Feature.Window, Feature.HalfClose]);

export interface GrpcFrontendOptions {
  /** Performs the KAS's dials through an agent. */
  dialer: BackendDialer;
  /** Admits each stream's client and dials for it within its rules (clients/frontend-client.ts); default: the KAS alone, through `dialer`. */
  clients?: FrontendClients;
  log: Logger;
  /** Told of each frontend stream's tunnel as it opens (the server counts and closes them). */
  track: (tunnel: Tunnel) => void;
  limits?: Partial<TunnelLimits>;
  metrics?: KanalMetrics;
}

/** `opts.limits` is read for each new stream (a tenant's may change). */
/** A ProxyService stream; its context, when the listener gave one, says who the client is. */
export type FrontendStream = IncomingStream<{ readonly client?: ClientIdentity } | undefined>;

/** `incoming.context`: what the frontend listener knows of the connection, with who the client is (the audit log). */
export function createGrpcFrontend(opts: GrpcFrontendOptions): (incoming: FrontendStream) => void {
  const { log, track, metrics } = opts;
  const clients = opts.clients ?? new KasOnlyClients(opts.dialer);
  return (incoming) => {
    const limits = opts.limits;
    const features = intersectFeatures(parseFeatures(firstValue(incoming.metadata, MD_KANAL_FEATURES)), FRONTEND_FEATURES);
    const headers: Record<string, string> = {};
    if (features.size > 0) headers[MD_KANAL_FEATURES] = formatFeatures(features);
    const stream = incoming.accept(headers);
    const identity = incoming.context?.client ?? { address: incoming.peer };
    // Admitted once per stream, at its first dial; a client no entry admits has each dial refused (DIAL_RSP) with the reason.
    let admitted: Promise<FrontendClient> | undefined;
    const presented = grpcToken(incoming.metadata.get(MD_AUTHORIZATION) ?? []);
    const admit = (): Promise<FrontendClient> =>
      (admitted ??= clients
        .admit({ identity, door: grpcFrontend.name, ...(presented.token ? { token: presented.token } : {}) })
        .catch((err: unknown) => {
          if (!(err instanceof ClientRefused)) throw err;
          // As the HTTP door does: an unusable token is left out, and the refusal says what was wrong with it.
          const hint = presented.problem ? ` (${presented.problem})` : '';
          throw new DialError('forbidden', `${err.message}${hint}`, 'client_unknown');
        }));
    const tunnel = new Tunnel(stream, {
      side: 'server',
      features,
      limits,
      log: log.child({ frontend: 'grpc', peer: incoming.peer }),
      dialHandler: async (dial) => {
        const dialed = await clients.dial(await admit(), dial.address, dial.signal);
        return dialed.via === 'tunnel' ? dialed.conn : dialed.socket;
      },
      onLimit: (limit, reason) => countTunnelLimit(metrics, limit, reason),
      refusalReasons: FRONTEND_REFUSALS,
    });
    track(tunnel);
  };
}

/** The client connection preface of HTTP/2 (RFC 9113 section 3.4). */
const H2_PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');

/** The gRPC front door: a connection whose first bytes are the HTTP/2 preface. */
export const grpcFrontend: Frontend<'grpc'> = {
  name: 'grpc',
  recognises(first) {
    const n = Math.min(first.length, H2_PREFACE.length);
    if (!first.subarray(0, n).equals(H2_PREFACE.subarray(0, n))) return 'no';
    return n === H2_PREFACE.length ? 'yes' : 'more';
  },
  serve(socket, { peer, connection, server }) {
    // Only HTTP/2 sessions can miss a dead peer (see peer-gone-watch.ts); Unix sockets are skipped.
    closeWhenPeerGone(socket, (reason) =>
      server.log.warn({ peer, reason }, 'closing frontend connection: its peer is gone and HTTP/2 had not noticed'),
    );
    server.grpc.injectConnection(socket, connection);
    socket.resume();
  },
};
