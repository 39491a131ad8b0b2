/**
 * When one address's reconnect loop connects next (reconnect-loop.ts),
 * given what the agent holds (docs/ha.md). By name: not while a tunnel is
 * held through the address, or the server it reached is held through
 * another. Behind one address: not while the servers' count is reached —
 * with --sync-forever, a connect per reconnect.maxMs still (to learn of new
 * servers from their serverCount headers); with leases, a look per sync
 * interval (a lease count changes without a tunnel changing).
 */

export interface ConnectScheduleView {
  /** Several addresses, one tunnel through each (else one address for every server). */
  byName: boolean;
  /** By name: a tunnel is held through this address, or the server its last connect reached is held through another. */
  covered: boolean;
  /** Tunnels up. */
  tunnels: number;
  /** The servers' count (server-count.ts). */
  servers: number;
  syncForever: boolean;
  /** Whether the count comes from a lease counter (--count-server-leases). */
  leases: boolean;
  reconnect: { initialMs: number; maxMs: number };
  /** When this loop last connected (ms since the epoch; 0: never), and now. */
  lastAttempt: number;
  now: number;
}

/** Milliseconds until the loop should connect (0: now; Infinity: not until something changes). */
export function untilNextConnect(v: ConnectScheduleView): number {
  if (v.byName) return v.covered ? Infinity : 0;
  if (v.tunnels < v.servers) return 0;
  const probeIn = v.syncForever ? v.lastAttempt + v.reconnect.maxMs - v.now : Infinity;
  if (probeIn <= 0) return 0;
  return Math.min(probeIn, v.leases ? v.reconnect.initialMs : Infinity);
}
