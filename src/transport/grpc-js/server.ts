/** The grpc-js server side: the agent and proxy services' calls handed to their handlers as PacketStreams. */
import * as grpc from '@grpc/grpc-js';
import type { Duplex } from 'node:stream';
import type { Packet } from '../../wire/packet.js';
import type { GrpcServerTransport, IncomingStream, ServerTransportOptions, StreamHandlers } from '../transport.js';
import { MAX_STREAMS_PER_CONNECTION } from '../transport.js';
import { GrpcStatus } from '../grpc-status.js';
import type { PacketStream } from '../packet-stream.js';
import type { Decoded } from '../decoded.js';
import { MIN_KEEPALIVE_INTERVAL_MS } from '../liveness.js';
import { agentServiceDefinition, proxyServiceDefinition } from './service-definition.js';
import { fromGrpcMetadata, toGrpcMetadata } from './metadata.js';
import { GrpcJsPacketCall } from './packet-call.js';

type ServerCall = grpc.ServerDuplexStream<Decoded, Packet | Buffer>;

function incoming<C>(call: ServerCall, context: C | undefined): IncomingStream<C> {
  const metadata = fromGrpcMetadata(call.metadata);
  const peer = call.getPeer();
  return {
    metadata,
    peer,
    context,
    accept(headers: Record<string, string>): PacketStream {
      call.sendMetadata(toGrpcMetadata(headers));
      return new GrpcJsPacketCall(call, 'server', metadata, peer);
    },
    reject(code: GrpcStatus, message: string): void {
      call.emit('error', Object.assign(new Error(message), { code, details: message }));
    },
  };
}

/**
 * grpc-js names a call's peer `${remoteAddress}:${remotePort}` of the session's
 * socket (server-interceptors.ts, getPeer); the same key taken from the
 * injected socket finds the context it was injected with. Undefined for
 * sockets without an address (Unix sockets), which then carry no context.
 */
function peerKey(connection: Duplex): string | undefined {
  const s = connection as Duplex & { remoteAddress?: string; remotePort?: number };
  return s.remoteAddress && s.remotePort ? `${s.remoteAddress}:${s.remotePort}` : undefined;
}

/**
 * The secondary transport. Its server keepalive is grpc-js's own: a PING
 * unanswered for `keepalive.timeoutMs` closes the connection; grpc-js gives
 * no hook for probes on demand, so streams here have no `liveness`.
 */
export function createGrpcJsServer<C = undefined>(handlers: StreamHandlers<C>, opts: ServerTransportOptions): GrpcServerTransport<C> {
  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxReceiveMessageBytes,
    // Agents idle for long periods; never punish their keepalive pings.
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 1000,
    ...(opts.keepalive
      ? {
          'grpc.keepalive_time_ms': Math.max(MIN_KEEPALIVE_INTERVAL_MS, opts.keepalive.intervalMs),
          'grpc.keepalive_timeout_ms': opts.keepalive.timeoutMs,
        }
      : {}),
    'grpc.max_concurrent_streams': opts.maxConcurrentStreams ?? MAX_STREAMS_PER_CONNECTION,
  });
  /** Contexts of the open connections, by peerKey(). */
  const contexts = new Map<string, C>();
  const route =
    (handler: ((s: IncomingStream<C>) => void) | undefined) =>
    (call: ServerCall): void => {
      const stream = incoming(call, contexts.get(call.getPeer()));
      if (handler) handler(stream);
      else stream.reject(GrpcStatus.UNIMPLEMENTED, 'service not served on this port');
    };
  server.addService(agentServiceDefinition, { Connect: route(handlers.agentConnect) });
  server.addService(proxyServiceDefinition, { Proxy: route(handlers.proxy) });
  const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  return {
    injectConnection(connection: Duplex, context?: C): void {
      const key = peerKey(connection);
      if (key !== undefined && context !== undefined) {
        contexts.set(key, context);
        connection.once('close', () => contexts.delete(key));
      }
      injector.injectConnection(connection);
    },
    close(graceMs: number): Promise<void> {
      injector.drain(graceMs);
      return new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          injector.destroy();
          server.forceShutdown();
          resolve();
        }, graceMs);
        server.tryShutdown(() => {
          clearTimeout(timer);
          injector.destroy();
          resolve();
        });
      });
    },
  };
}
