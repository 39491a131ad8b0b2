import type { Transport } from '../transport/transport.js';

/** The first is the default: gRPC written on node:http2 (see docs/architecture.md, The transport). */
export const TRANSPORT_NAMES = ['h2', 'grpc-js'] as const;

/**
 * Loads only the chosen implementation: @grpc/grpc-js (with its 65 modules)
 * stays out of a process that runs on h2 (docs/memory.md, #15).
 */
export async function selectTransport(name: string): Promise<Transport> {
  switch (name) {
    case 'h2':
      return (await import('../transport/h2/index.js')).h2Transport;
    case 'grpc-js':
      return (await import('../transport/grpc-js/index.js')).grpcJsTransport;
    default:
      throw new Error(`unknown transport ${name}`);
  }
}
