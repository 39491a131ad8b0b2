import type { Transport } from '../transport/transport.js';
import { grpcJsTransport } from '../transport/grpc-js/index.js';
import { h2Transport } from '../transport/h2/index.js';

/** The first is the default: gRPC written on node:http2 (see docs/architecture.md, The transport). */
export const TRANSPORT_NAMES = ['h2', 'grpc-js'] as const;

export function selectTransport(name: string): Transport {
  switch (name) {
    case 'h2':
      return h2Transport;
    case 'grpc-js':
      return grpcJsTransport;
    default:
      throw new Error(`unknown transport ${name}`);
  }
}
