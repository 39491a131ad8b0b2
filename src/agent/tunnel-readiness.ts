/**
 * The agent's /readyz (docs/operations.md): ready with a tunnel to a proxy
 * server, and each further condition (e.g. the advertise address in place).
 * The detail says what is held and, when something is amiss but the agent is
 * still ready, what: an address without a tunnel, targets a server refuses,
 * servers that take no node -> control plane dials.
 */
import type { Readiness } from '../common/health-server.js';
import { refusedTargetMessage, type Target } from './target.js';

/** A tunnel up, as readiness reads it. */
export interface ReadyTunnel {
  serverID: string;
  /** The address it came through. */
  address: string;
  /** Whether its server takes node -> control plane dials. */
  nodeDial: boolean;
  /** The --target listeners whose destination its server refuses. */
  refusedTargets: readonly Target[];
}

/** An address dialled, as readiness reads it. */
export interface ReadyAddress {
  target: string;
  /** Why its last connect failed ('' once one succeeded). */
  lastError: string;
  /** The server its last connect reached while held through another address. */
  reachedHeld: string | undefined;
}

export interface TunnelReadinessView {
  /** Tunnels up, one per server. */
  tunnels: readonly ReadyTunnel[];
  addresses: readonly ReadyAddress[];
  /** Several addresses, one tunnel through each. */
  byName: boolean;
  /** Tunnels aimed at (expected-servers.ts). */
  aimed: number;
  /** By name: how the servers' count and the addresses disagree (''). */
  countMismatch: string;
  /** Whether this agent offers node -> control plane dials. */
  nodeDial: boolean;
}

export function tunnelReadiness(v: TunnelReadinessView): Readiness {
  const n = v.tunnels.length;
  if (n === 0) {
    const lastError = v.addresses.map((e) => e.lastError).find((e) => e !== '');
    return { ready: false, detail: `no tunnel to a proxy server${lastError ? ` (last error: ${lastError})` : ''}` };
  }
  // Behind one address every tunnel shares it; by name each names its own.
  const held = v.tunnels.map((h) => (v.byName ? `${h.serverID} (${h.address})` : h.serverID));
  let detail = `${n}/${v.aimed} server tunnel(s) up: ${held.join(', ')}`;
  if (v.byName) detail += addressesReadiness(v);
  // Still ready (control plane -> node works, and the other targets), but say which targets a server refuses.
  for (const h of v.tunnels) for (const t of h.refusedTargets) detail += `; ${refusedTargetMessage(t, h.serverID)}`;
  // Still ready (control plane -> node works), but say when the node -> control plane direction is not.
  if (!v.nodeDial) return { ready: true, detail };
  const without = v.tunnels.filter((h) => !h.nodeDial).map((h) => h.serverID);
  if (without.length === 0) return { ready: true, detail };
  const note =
    without.length === n
      ? 'node -> control plane dials unavailable: no connected server supports them (upstream Konnectivity?)'
      : `node -> control plane dials unavailable through ${without.join(', ')} (server does not support them)`;
  return { ready: true, detail: `${detail}; ${note}` };
}

/** Ready when every part is; the details of all, in order. */
export function allReady(parts: readonly Readiness[]): Readiness {
  return { ready: parts.every((r) => r.ready), detail: parts.map((r) => r.detail).join('; ') };
}

/** By name: the addresses without a tunnel and why, and a count the servers give that differs. */
function addressesReadiness(v: TunnelReadinessView): string {
  const through = new Set(v.tunnels.map((h) => h.address));
  const notes: string[] = [];
  for (const e of v.addresses) {
    if (through.has(e.target)) continue;
    const held = e.reachedHeld && v.tunnels.find((h) => h.serverID === e.reachedHeld);
    if (held) notes.push(`${e.target} reaches ${e.reachedHeld}, held through ${held.address}`);
    else notes.push(`no tunnel through ${e.target}${e.lastError ? ` (last error: ${e.lastError})` : ''}`);
  }
  if (v.countMismatch) notes.push(v.countMismatch);
  return notes.map((note) => `; ${note}`).join('');
}
