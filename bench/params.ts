/** Run sizes of the three modes. */
export type Mode = 'smoke' | 'quick' | 'full';

export interface Params {
  /** Interleaved repetitions of every measurement. */
  reps: number;
  warmupMs: number;
  measureMs: number;
  chunkBytes: number;
  /** Section 1b (suite-transport.ts): bytes carried by one timed run of each transport pairing. */
  transportBytes: number;
  /** Safety bound on bytes a flow may send: this rate times the run's length. */
  capBytesPerSecond: number;
  /** Untimed bulk runs of every proxied path and direction first (0 or 1), so JIT compilation lands in no timed run. */
  bulkWarmupRuns: number;
  /** Dials per path (pooled over reps). */
  dials: number;
  /** Dials at a time in the concurrent dial runs. */
  dialConcurrency: number;
  /**
   * Dials through Kanal's CP->node path before any dial is timed (each other
   * path gets a fifth): V8 keeps optimising the dial path for about 3,000 dials.
   */
  dialWarmup: number;
  /** Dials timed on a freshly started pair of each product (the cold start). */
  coldDials: number;
  /** Fresh pairs of each product started and timed to ready (section 5). */
  startRuns: number;
  requestMs: number;
  requestConcurrency: number;
  idleConnections: number;
  agents: number;
  /** Agents per helper process. */
  agentsPerSwarm: number;
  /** Isolation: time for the stalled connection to fill the tunnel before measuring. */
  stallFillMs: number;
  profileMs: number;
  /** Churn soak (--only soak, --full): connections of each phase per product, and how often RSS and heap are read. */
  soakConnections: number;
  soakEvery: number;
  /** Handshakes to the agent port at a time, and how long the valid ones stay open (ms). */
  soakHandshakeConcurrency: number;
  soakHoldMs: number;
  /** Short tunnelled connections at a time. */
  soakTunnelConcurrency: number;
  /**
   * Tenants (section 7): the two scales, many small tenants (tenantsMany tenants of
   * tenantsManyAgents agents) and fewer big ones (tenantsFew of tenantsFewAgents).
   */
  tenantsMany: number;
  tenantsManyAgents: number;
  tenantsFew: number;
  tenantsFewAgents: number;
  /** Sequential dials timed per measured tenant and repetition (idle, and next to other tenants' dials). */
  tenantDials: number;
  /**
   * How long RSS is watched (its lowest reading kept) after each step of the scale runs: a little
   * over the server's memory reclaimer period (src/common/memory-reclaimer.ts, 10 s), so every
   * reading comes after the collection and malloc_trim a step's growth calls for.
   */
  tenantSettleMs: number;
  /** Fairness: tenant A's dialling lanes (its dial flood) and its bulk download flows. */
  tenantFloodConcurrency: number;
  tenantBulkFlows: number;
  /**
   * Workers (7f): tenants loaded at once on a server of `--workers 1` and one of `--workers 2`
   * (named so that they spread evenly over 2 workers), and each one's dialling lanes; each
   * downloads over tenantBulkFlows flows.
   */
  tenantWorkersTenants: number;
  tenantWorkersLanes: number;
  /** Section 8 (suite-reconnect.ts, --only reconnect, --full): repetitions of each HA setup and of each cut. */
  reconnectReps: number;
  /** HA: servers behind the balancer, agents, servers restarted in turn per repetition, and the bound on every wait (ms). */
  reconnectServers: number;
  reconnectAgents: number;
  reconnectRestarts: number;
  reconnectTimeoutMs: number;
  /** Cut: tunnelled connections carried across it, and how long the relay stays cut (ms). */
  reconnectConnections: number;
  reconnectCutMs: number;
  /**
   * Section 9a (suite-scrape.ts, --only scrape, --full): targets scraped, each once per interval,
   * over this many intervals after a warm-up round, repeated scrapeReps times per case; page size.
   */
  scrapeTargets: number;
  scrapeIntervalMs: number;
  scrapeRounds: number;
  scrapeReps: number;
  scrapeBodyBytes: number;
}

/** The soak's memory goal: RSS growth from the first reading to the end of a phase, per process. */
export const SOAK_GOAL_MIB = 16;

/** Section 8's sizes in quick and full; --smoke restarts one server and carries 50 connections. */
/**
 * Section 9a's sizes. Full is the load: 1,000 targets every 15 s (67 scrapes/s). Quick
 * keeps that rate with fewer targets on a compressed interval (200 every 3 s): the same requests
 * per second through the proxy, a fifth of the connections, a fifth of the wait.
 */
const SCRAPE = { scrapeBodyBytes: 10 * 1024 } satisfies Partial<Params>;

const RECONNECT = {
  reconnectServers: 3,
  reconnectAgents: 4,
  reconnectRestarts: 3,
  reconnectTimeoutMs: 90_000,
  reconnectConnections: 1000,
  reconnectCutMs: 5000,
} satisfies Partial<Params>;

/** The soak's parameters: the same in every mode but --smoke's counts. */
const SOAK = {
  soakConnections: 100_000,
  soakEvery: 5_000,
  soakHandshakeConcurrency: 50,
  soakHoldMs: 200,
  soakTunnelConcurrency: 32,
} satisfies Partial<Params>;

export const PARAMS: Record<Mode, Params> = {
  smoke: {
    reps: 1,
    warmupMs: 100,
    measureMs: 300,
    chunkBytes: 256 * 1024,
    transportBytes: 4 * 1024 * 1024,
    capBytesPerSecond: 3e9,
    bulkWarmupRuns: 0,
    dials: 10,
    dialConcurrency: 8,
    dialWarmup: 20,
    coldDials: 20,
    startRuns: 1,
    requestMs: 200,
    requestConcurrency: 16,
    idleConnections: 40,
    agents: 6,
    agentsPerSwarm: 500,
    stallFillMs: 100,
    profileMs: 1000,
    tenantsMany: 20,
    tenantsManyAgents: 3,
    tenantsFew: 5,
    tenantsFewAgents: 6,
    tenantDials: 20,
    tenantSettleMs: 300,
    tenantFloodConcurrency: 16,
    tenantBulkFlows: 8,
    tenantWorkersTenants: 2,
    tenantWorkersLanes: 8,
    ...SOAK,
    soakConnections: 2_000,
    soakEvery: 500,
    ...RECONNECT,
    reconnectReps: 1,
    reconnectRestarts: 1,
    reconnectConnections: 50,
    ...SCRAPE,
    scrapeTargets: 10,
    scrapeIntervalMs: 500,
    scrapeRounds: 2,
    scrapeReps: 1,
  },
  quick: {
    reps: 3,
    // Long enough for the receive windows to grow and for a run to span
    // several scheduler hiccups of a shared 2-core machine.
    warmupMs: 300,
    measureMs: 1200,
    chunkBytes: 256 * 1024,
    transportBytes: 256 * 1024 * 1024,
    capBytesPerSecond: 3e9,
    bulkWarmupRuns: 1,
    dials: 300,
    dialConcurrency: 8,
    dialWarmup: 3_000,
    coldDials: 1_000,
    startRuns: 5,
    requestMs: 400,
    requestConcurrency: 16,
    idleConnections: 2000,
    agents: 100,
    agentsPerSwarm: 500,
    stallFillMs: 300,
    profileMs: 3000,
    // Not the full sizes: with every tenant's agents CA the same certificate, each agent handshake
    // costs the server a signature check per tenant (tenant-directory.ts), ~12 agents/s at 1,000 tenants.
    tenantsMany: 200,
    tenantsManyAgents: 3,
    tenantsFew: 50,
    tenantsFewAgents: 10,
    tenantDials: 200,
    tenantSettleMs: 11_000,
    tenantFloodConcurrency: 128,
    tenantBulkFlows: 8,
    tenantWorkersTenants: 2,
    tenantWorkersLanes: 64,
    ...SOAK,
    ...RECONNECT,
    reconnectReps: 2,
    ...SCRAPE,
    scrapeTargets: 200,
    scrapeIntervalMs: 3000,
    scrapeRounds: 3,
    scrapeReps: 2,
  },
  full: {
    reps: 5,
    warmupMs: 500,
    measureMs: 3000,
    chunkBytes: 256 * 1024,
    transportBytes: 1024 * 1024 * 1024,
    capBytesPerSecond: 3e9,
    bulkWarmupRuns: 1,
    dials: 2000,
    dialConcurrency: 8,
    dialWarmup: 5_000,
    coldDials: 2_000,
    startRuns: 10,
    requestMs: 2000,
    requestConcurrency: 16,
    idleConnections: 10_000,
    agents: 1000,
    agentsPerSwarm: 250,
    stallFillMs: 500,
    profileMs: 5000,
    tenantsMany: 1000,
    tenantsManyAgents: 3,
    tenantsFew: 100,
    tenantsFewAgents: 30,
    tenantDials: 500,
    tenantSettleMs: 11_000,
    tenantFloodConcurrency: 128,
    tenantBulkFlows: 8,
    tenantWorkersTenants: 4,
    tenantWorkersLanes: 64,
    ...SOAK,
    ...RECONNECT,
    reconnectReps: 3,
    ...SCRAPE,
    scrapeTargets: 1000,
    scrapeIntervalMs: 15_000,
    scrapeRounds: 4,
    scrapeReps: 2,
  },
};
