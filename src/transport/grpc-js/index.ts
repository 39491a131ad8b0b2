import type { Transport } from '../transport.js';
import { createGrpcJsServer } from './server.js';
import { createGrpcJsChannel } from './channel.js';

export const grpcJsTransport: Transport = {
  createServer: createGrpcJsServer,
  createChannel: createGrpcJsChannel,
};
