/**
 * Server-count Leases as upstream Konnectivity (v0.36) uses them: each server
 * holds `konnectivity-proxy-server-<server-id>` in `--lease-namespace`,
 * labelled with `--lease-label`, held by its server ID, 30 s long and renewed
 * every 15 s (cmd/server/app/server.go); a lease counts while
 * renewTime (else acquireTime) + leaseDurationSeconds is in the future
 * (pkg/util/leases.go IsLeaseValid).
 */

export const LEASE_DURATION_SECONDS = 30;
export const LEASE_RENEW_INTERVAL_MS = 15_000;
export const LEASE_GC_INTERVAL_MS = 15_000;
export const DEFAULT_LEASE_NAMESPACE = 'kube-system';
export const DEFAULT_LEASE_LABEL = 'k8s-app=konnectivity-server';

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/** The Lease a server holds; throws when the server ID cannot be part of an object name. */
export function serverLeaseName(serverId: string): string {
  const name = `konnectivity-proxy-server-${serverId}`;
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) {
    throw new Error(
      `--server-id ${JSON.stringify(serverId)} cannot name a Lease (${name} must be lower-case letters, digits, '-' and '.', at most 253 characters)`,
    );
  }
  return name;
}

/** Milliseconds since the epoch; undefined for a missing or unparsable time. */
export function timeMs(value: Date | string | undefined | null): number | undefined {
  if (value === undefined || value === null) return undefined;
  const ms = new Date(value).getTime();
  return Number.isFinite(ms) ? ms : undefined;
}

/** What validity needs of a Lease, as it comes off the wire (client-node types times as Date; JSON carries strings). */
export interface LeaseTimes {
  spec?: { renewTime?: Date | string | null; acquireTime?: Date | string | null; leaseDurationSeconds?: number | null } | null;
}

/**
 * When the lease stops counting (ms since the epoch), or undefined when it
 * never counts: no renew or acquire time, or no positive duration (upstream
 * would dereference a nil duration; we treat such a lease as expired).
 */
export function leaseExpiresAt(lease: LeaseTimes): number | undefined {
  const spec = lease.spec;
  const from = timeMs(spec?.renewTime) ?? timeMs(spec?.acquireTime);
  const seconds = spec?.leaseDurationSeconds;
  if (from === undefined || typeof seconds !== 'number' || !(seconds > 0)) return undefined;
  return from + seconds * 1000;
}

export function isLeaseValid(lease: LeaseTimes, nowMs: number): boolean {
  const expires = leaseExpiresAt(lease);
  return expires !== undefined && expires > nowMs;
}
