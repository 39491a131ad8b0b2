import * as grpc from '@grpc/grpc-js';
import type { Duplex } from 'node:stream';
import type { Packet } from '../../wire/packet.js';
import type { GrpcServerTransport, IncomingStream, StreamHandlers } from '../transport.js';
import { GrpcStatus, MAX_STREAMS_PER_CONNECTION } from '../transport.js';
import type { PacketStream } from '../packet-stream.js';
import type { Decoded } from '../decoded.js';
import { agentServiceDefinition, proxyServiceDefinition } from './service-definition.js';
import { fromGrpcMetadata, toGrpcMetadata } from './metadata.js';
import { GrpcJsPacketCall } from './packet-call.js';

type ServerCall = grpc.ServerDuplexStream<Decoded, Packet | Buffer>;

function incoming(call: ServerCall): IncomingStream {
  const metadata = fromGrpcMetadata(call.metadata);
  const peer = call.getPeer();
  return {
    metadata,
    peer,
    accept(headers: Record<string, string>): PacketStream {
      call.sendMetadata(toGrpcMetadata(headers));
      return new GrpcJsPacketCall(call, 'server', metadata, peer);
    },
    reject(code: GrpcStatus, message: string): void {
      call.emit('error', Object.assign(new Error(message), { code, details: message }));
    },
  };
}

export function createGrpcJsServer(
  handlers: StreamHandlers,
  opts: { maxReceiveMessageBytes: number },
): GrpcServerTransport {
  const server = new grpc.Server({
    'grpc.max_receive_message_length': opts.maxReceiveMessageBytes,
    // Agents idle for long periods; never punish their keepalive pings.
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.http2.min_ping_interval_without_data_ms': 1000,
    'grpc.max_concurrent_streams': MAX_STREAMS_PER_CONNECTION,
  });
  const route = (handler: ((s: IncomingStream) => void) | undefined) => (call: ServerCall): void => {
    if (handler) handler(incoming(call));
    else incoming(call).reject(GrpcStatus.UNIMPLEMENTED, 'service not served on this port');
  };
  server.addService(agentServiceDefinition, { Connect: route(handlers.agentConnect) });
  server.addService(proxyServiceDefinition, { Proxy: route(handlers.proxy) });
  const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  return {
    injectConnection(connection: Duplex): void {
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
