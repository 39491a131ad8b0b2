/** The two gRPC services (AgentService/Connect, ProxyService/Proxy) as grpc-js method definitions with Kanal's codec. */
import type * as grpc from '@grpc/grpc-js';
import { encodePacket } from '../../wire/codec.js';
import type { Packet } from '../../wire/packet.js';
import { AGENT_SERVICE_CONNECT, PROXY_SERVICE_PROXY } from '../../wire/metadata.js';
import { decodeOrExplain, type Decoded } from '../decoded.js';

/** A packet, or one GrpcJsPacketCall already encoded (to count its bytes): passed through. */
export function serializePacket(p: Packet | Buffer): Buffer {
  return Buffer.isBuffer(p) ? p : encodePacket(p);
}

function method(path: string): grpc.MethodDefinition<Decoded, Packet | Buffer> {
  return {
    path,
    requestStream: true,
    responseStream: true,
    requestSerialize: (p: Decoded) => encodePacket(p as Packet),
    requestDeserialize: (b: Buffer) => decodeOrExplain(b),
    responseSerialize: serializePacket,
    responseDeserialize: (b: Buffer) => decodeOrExplain(b) as Packet,
    originalName: path.split('/')[2] ?? path,
  };
}

export const agentServiceDefinition: grpc.ServiceDefinition = { Connect: method(AGENT_SERVICE_CONNECT) };
export const proxyServiceDefinition: grpc.ServiceDefinition = { Proxy: method(PROXY_SERVICE_PROXY) };
