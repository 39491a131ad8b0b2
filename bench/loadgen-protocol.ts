/** Commands understood by the load generator / backend worker (bench/loadgen.ts). */

/** Whose server and agent carry a tunnelled path: Kanal's, or upstream Konnectivity's (proxy-server, proxy-agent). */
export type Product = 'kanal' | 'upstream';

/**
 * How the client reaches a backend service:
 * - kanal-cp         HTTP CONNECT over the server's Unix socket -> tunnel -> agent -> backend (plain TCP)
 * - kanal-cp-tls     the same, with TLS end to end inside the tunnel (as the KAS talks to kubelets)
 * - kanal-node       TCP to the agent's node-side listener -> tunnel -> server -> backend (plain TCP)
 * - kanal-socks5     SOCKS5 CONNECT (RFC 1928) to the server's SOCKS5 door (ClientConfig.socks5) -> tunnel -> agent -> backend
 * - upstream-cp      as kanal-cp, through upstream's proxy-server (--mode http-connect) and proxy-agent
 * - upstream-cp-tls  as kanal-cp-tls, through upstream's
 * - direct-tcp       TCP straight to the backend
 * - direct-tls       TLS straight to the backend
 */
export type Path =
  'kanal-cp' | 'kanal-cp-tls' | 'kanal-node' | 'kanal-socks5' | 'upstream-cp' | 'upstream-cp-tls' | 'direct-tcp' | 'direct-tls';

/** The product whose processes carry `path`; undefined for the direct paths. */
export function productOf(path: Path): Product | undefined {
  if (path.startsWith('kanal-')) return 'kanal';
  if (path.startsWith('upstream-')) return 'upstream';
  return undefined;
}

/**
 * bulk: byte source/sink chosen by a header; echo: echoes what it reads (a dial is
 * measured to the first byte echoed: the client speaks first, as an HTTP client does,
 * so upstream's CONNECT race with a backend that speaks first cannot touch the figures);
 * http: answers GET.
 */
export type Service = 'bulk' | 'echo' | 'http';

/**
 * up: client sends, backend counts; down: backend sends, client counts;
 * stall-client: backend sends, client never reads; stall-backend: client sends, backend never reads.
 */
export type FlowMode = 'up' | 'down' | 'stall-client' | 'stall-backend';

export interface BackendPorts {
  bulkTcp: number;
  bulkTls: number;
  echoTcp: number;
  echoTls: number;
  httpTcp: number;
  httpTls: number;
}

export interface ClientConfig {
  caPem: string;
  /** Each product's server frontend Unix socket (HTTP CONNECT); upstream's only when it runs. */
  uds: Partial<Record<Product, string>>;
  backendHost: string;
  backend: BackendPorts;
  /** The agent's node-side listeners (node -> control plane), one per service. */
  nodeHost: string;
  node: { bulk: number; echo: number; http: number };
  chunkBytes: number;
  /** Kanal's SOCKS5 door (section 9b): its Unix socket or TCP listener, and the RFC 1929 credentials offered if it asks. */
  socks5?: { address: { uds: string } | { host: string; port: number }; username: string; password: string };
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

/**
 * What the churn soak does to a server's agent port, one connection each:
 * mtls: a valid agent certificate, half the HTTP/2 client preface, closed after holdMs;
 * tcp: connect and close, no TLS byte; no-cert: TLS without a client certificate;
 * rogue: TLS with an agent certificate from a CA the server does not trust.
 */
export type HandshakeKind = 'mtls' | 'tcp' | 'no-cert' | 'rogue';

/** The mix the soak repeats: mostly the case that leaked (mtls), 70/10/10/10. */
export const HANDSHAKE_MIX: readonly HandshakeKind[] = ['mtls', 'mtls', 'mtls', 'mtls', 'mtls', 'mtls', 'mtls', 'tcp', 'no-cert', 'rogue'];

export interface HandshakeTarget {
  host: string;
  port: number;
  caPem: string;
  agentCertPem: string;
  agentKeyPem: string;
  rogueCertPem: string;
  rogueKeyPem: string;
}

/**
 * Short tunnelled connections of the soak: request (GET, answer, close),
 * half (close right after the CONNECT's 200), refused (CONNECT to a closed port: 502).
 */
export type ChurnKind = 'request' | 'half' | 'refused';

/** 80/10/10. */
export const CHURN_MIX: readonly ChurnKind[] = [
  'request',
  'request',
  'request',
  'request',
  'request',
  'request',
  'request',
  'request',
  'half',
  'refused',
];

export interface FloodResult extends Failures {
  /** Dials echoed. */
  ok: number;
  /** Dials the proxy answered with a status other than 200, by status ("503": 12). */
  refused: Record<string, number>;
  elapsedMs: number;
}

/** Connections of a soak batch by how they ended, e.g. "mtls held" or "refused 502". */
export type Outcomes = Record<string, number>;

export type LoadgenCommands = {
  serve: { args: { host: string; certPem: string; keyPem: string; chunkBytes: number }; result: BackendPorts };
  configure: { args: ClientConfig; result: null };
  counters: { args: null; result: Counters };
  /** Fails when a flow has not opened (connected, CONNECT answered) within openTimeoutMs (default 15 s). */
  openFlows: {
    args: { group: string; path: Path; mode: FlowMode; count: number; maxBytesPerFlow: number; openTimeoutMs?: number };
    result: { opened: number };
  };
  stopFlows: { args: { group: string }; result: null };
  /**
   * `n` dials, `concurrency` at a time; latency = open (+ CONNECT) -> one byte written and echoed.
   * `uds`: CONNECT over this Unix socket rather than the configured product's (one tenant's own socket).
   */
  dials: {
    args: { path: Path; n: number; concurrency: number; uds?: string };
    result: { latenciesMs: number[]; elapsedMs: number } & Failures;
  };
  /**
   * Dials (as `dials` does) as fast as `concurrency` lanes can until stopFlood: a tenant's dial
   * flood. `uds`: the sockets the lanes take in turn (tenants' own); absent, the configured one.
   */
  startFlood: { args: { id: string; path: Path; concurrency: number; uds?: string[] }; result: null };
  /** Stops a flood once its dials in flight have ended; `refused`: CONNECT answers other than 200, by status. */
  stopFlood: { args: { id: string }; result: FloodResult };
  requests: {
    args: { path: Path; concurrency: number; durationMs: number; maxRequests: number };
    result: { completed: number; elapsedMs: number } & Failures;
  };
  hold: { args: { path: Path; n: number; concurrency: number }; result: { held: number } & Failures };
  release: { args: null; result: null };
  /** Connections `from` .. `from + n - 1` of the HANDSHAKE_MIX to a server's agent port, `concurrency` at a time. */
  handshakes: {
    args: { target: HandshakeTarget; from: number; n: number; concurrency: number; holdMs: number };
    result: { outcomes: Outcomes; elapsedMs: number } & Failures;
  };
  /** Connections `from` .. `from + n - 1` of the CHURN_MIX along a CONNECT path; `refusedPort`: a backend port nothing listens on. */
  churn: {
    args: { path: Path; from: number; n: number; concurrency: number; refusedPort: number };
    result: { outcomes: Outcomes; elapsedMs: number } & Failures;
  };
  /** Backend: destroys the connections it stopped reading (a stalled reader never sees its peer's FIN). */
  unstall: { args: null; result: { destroyed: number } };
  /** Destroys every socket the worker has open (what a proxy left open that it should have closed). */
  closeAll: { args: null; result: { destroyed: number } };
};

/** Bulk header: one mode byte, then the number of bytes the backend may send (u64 BE). */
export const BULK_HEADER_BYTES = 9;
export const BULK_MODE = { sink: 0x55 /* U */, source: 0x44 /* D */, stall: 0x53 /* S */ } as const;
