/** Commands understood by the load generator / backend worker (bench/loadgen.ts). */

/**
 * How the client reaches a backend service:
 * - kanal-cp      HTTP CONNECT over the server's Unix socket -> tunnel -> agent -> backend (plain TCP)
 * - kanal-cp-tls  the same, with TLS end to end inside the tunnel (as the KAS talks to kubelets)
 * - kanal-node    TCP to the agent's node-side listener -> tunnel -> server -> backend (plain TCP)
 * - direct-tcp    TCP straight to the backend
 * - direct-tls    TLS straight to the backend
 */
export type Path = 'kanal-cp' | 'kanal-cp-tls' | 'kanal-node' | 'direct-tcp' | 'direct-tls';

/** bulk: byte source/sink chosen by a header; banner: writes a line on accept; http: answers GET. */
export type Service = 'bulk' | 'banner' | 'http';

/**
 * up: client sends, backend counts; down: backend sends, client counts;
 * stall-client: backend sends, client never reads; stall-backend: client sends, backend never reads.
 */
export type FlowMode = 'up' | 'down' | 'stall-client' | 'stall-backend';

export interface BackendPorts {
  bulkTcp: number;
  bulkTls: number;
  bannerTcp: number;
  bannerTls: number;
  httpTcp: number;
  httpTls: number;
}

export interface ClientConfig {
  caPem: string;
  /** The Kanal server's frontend Unix socket. */
  uds: string;
  backendHost: string;
  backend: BackendPorts;
  /** The agent's node-side listeners (node -> control plane), one per service. */
  nodeHost: string;
  node: { bulk: number; banner: number; http: number };
  chunkBytes: number;
}

export interface Counters {
  /** Bytes received / sent by this process on bulk flows since it started. */
  rx: number;
  tx: number;
  /** performance.now() of this process when the counters were read. */
  t: number;
  /** performance.now() of the last received chunk. */
  lastRxAt: number;
  /** Sockets currently open (flows, held connections, accepted connections). */
  open: number;
}

export interface Failures {
  errors: number;
  firstError?: string;
}

export type LoadgenCommands = {
  serve: { args: { host: string; certPem: string; keyPem: string; chunkBytes: number }; result: BackendPorts };
  configure: { args: ClientConfig; result: null };
  counters: { args: null; result: Counters };
  openFlows: { args: { group: string; path: Path; mode: FlowMode; count: number; maxBytesPerFlow: number }; result: { opened: number } };
  stopFlows: { args: { group: string }; result: null };
  dials: { args: { path: Path; n: number }; result: { latenciesMs: number[] } & Failures };
  requests: { args: { path: Path; concurrency: number; durationMs: number; maxRequests: number }; result: { completed: number; elapsedMs: number } & Failures };
  hold: { args: { path: Path; n: number; concurrency: number }; result: { held: number } & Failures };
  release: { args: null; result: null };
  /** Backend: destroys the connections it stopped reading (a stalled reader never sees its peer's FIN). */
  unstall: { args: null; result: { destroyed: number } };
};

/** Bulk header: one mode byte, then the number of bytes the backend may send (u64 BE). */
export const BULK_HEADER_BYTES = 9;
export const BULK_MODE = { sink: 0x55 /* U */, source: 0x44 /* D */, stall: 0x53 /* S */ } as const;
export const BANNER = 'kanal-bench-banner\n';
