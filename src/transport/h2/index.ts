/**
 * gRPC over node:http2, written for throughput: hand framing, DATA payloads
 * written without copies, large flow-control windows. A drop-in replacement
 * for the grpc-js transport that interoperates with grpc-js and grpc-go.
 */
import type { Transport } from '../transport.js';
import { createH2Channel } from './channel.js';
import { createH2Server } from './server.js';

export const h2Transport: Transport = {
  createServer: createH2Server,
  createChannel: createH2Channel,
};

export { createH2Channel, H2Channel, type H2ChannelOptions } from './channel.js';
export { createH2Server, H2ServerTransport, type H2ServerOptions } from './server.js';
export { H2PacketStream } from './h2-packet-stream.js';
