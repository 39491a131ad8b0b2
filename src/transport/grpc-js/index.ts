/** `--transport grpc-js`: @grpc/grpc-js with Kanal's codec, the reference beside h2 (docs/architecture.md, "The transport"). */
import type { Transport } from '../transport.js';
import { createGrpcJsServer } from './server.js';
import { createGrpcJsChannel } from './channel.js';

export const grpcJsTransport: Transport = {
  createServer: createGrpcJsServer,
  createChannel: createGrpcJsChannel,
};

export { createGrpcJsServer } from './server.js';
export { createGrpcJsChannel, openGrpcJsStream, type GrpcJsChannel } from './channel.js';
export { GrpcJsPacketCall } from './packet-call.js';
export { agentServiceDefinition, proxyServiceDefinition } from './service-definition.js';
