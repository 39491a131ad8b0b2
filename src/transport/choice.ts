/**
 * `--transport`: the one place a name becomes a Transport. Each
 * implementation is imported when chosen, so a process on h2 never loads
 * @grpc/grpc-js (see docs/architecture.md, The transport).
 */
import type { Transport } from './transport.js';

/** The first is the default: gRPC written on node:http2. */
export const TRANSPORT_NAMES = ['h2', 'grpc-js'] as const;

export type TransportName = (typeof TRANSPORT_NAMES)[number];

export function isTransportName(name: string): name is TransportName {
  return TRANSPORT_NAMES.some((n) => n === name);
}

export async function loadTransport(name: TransportName): Promise<Transport> {
  switch (name) {
    case 'h2':
      return (await import('./h2/index.js')).h2Transport;
    case 'grpc-js':
      return (await import('./grpc-js/index.js')).grpcJsTransport;
  }
}
