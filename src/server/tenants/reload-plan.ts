/**
 * What a reload of the tenants file does, decided from the running tenants
 * and the file as read (docs/multi-tenant.md, "Live changes"): a pure
 * function, so each case is tested without a server. A tenant whose entry
 * and files are unchanged (same fingerprint) is left alone; one whose
 * settings alone changed (same identity: its CAs, pins, server names and
 * socket) is updated in place, keeping its agents and connections; any other
 * change closes it and starts it anew. A file that cannot be used is
 * refused whole and changes nothing.
 */
import type { TenantDefinition } from './tenant-definition.js';

/** What the plan compares of a tenant. */
export type Fingerprinted = Pick<TenantDefinition, 'name' | 'fingerprint' | 'identity'>;

export type ReloadPlan =
  | { readonly kind: 'refused'; readonly error: string }
  | {
      readonly kind: 'apply';
      /** In the file, not running here: started. */
      readonly added: readonly string[];
      /** Running, no longer in the file (or no longer this process's): closed. */
      readonly removed: readonly string[];
      /** In the file and running, with another fingerprint (in the file's order): inPlace and rebuilt together. */
      readonly changed: readonly string[];
      /** Settings alone changed: applied in place. */
      readonly inPlace: readonly string[];
      /** Identity changed: closed and started anew. */
      readonly rebuilt: readonly string[];
    };

/**
 * The plan for `running` (name -> what it was loaded from) given the file as
 * read (`next`, or the error reading it gave); `owns` says which tenants this
 * process serves (a worker serves its share).
 */
export function planReload(
  running: ReadonlyMap<string, Fingerprinted>,
  next: readonly Fingerprinted[] | { readonly error: string },
  owns: (tenant: string) => boolean = () => true,
): ReloadPlan {
  if ('error' in next) return { kind: 'refused', error: next.error };
  const wanted = new Map(next.filter((t) => owns(t.name)).map((t) => [t.name, t]));
  const removed = [...running.keys()].filter((n) => !wanted.has(n));
  const added = [...wanted.keys()].filter((n) => !running.has(n));
  const changed = [...wanted.entries()].filter(([n, t]) => {
    const now = running.get(n);
    return now !== undefined && now.fingerprint !== t.fingerprint;
  });
  const inPlace = changed.filter(([n, t]) => running.get(n)?.identity === t.identity).map(([n]) => n);
  const rebuilt = changed.map(([n]) => n).filter((n) => !inPlace.includes(n));
  return { kind: 'apply', added, removed, changed: changed.map(([n]) => n), inPlace, rebuilt };
}
