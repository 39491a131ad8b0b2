import type { Transport } from '../transport/transport.js';
import { grpcJsTransport } from '../transport/grpc-js/index.js';

export const TRANSPORT_NAMES = ['grpc-js'] as const;

export function selectTransport(name: string): Transport {
  switch (name) {
    case 'grpc-js':
      return grpcJsTransport;
    default:
      throw new Error(`unknown transport ${name}`);
  }
}
