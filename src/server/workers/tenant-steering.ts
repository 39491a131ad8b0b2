/**
 * Which of a tenant's workers takes each of its connections, for a tenant
 * of a tenants file shared by several workers (its `tenant-workers`,
 * docs/multi-tenant.md "Workers"): the rules of a server of one cluster
 * (cluster-steering.ts) over the tenant's owners, with the agents each
 * owner holds of this tenant. A tenant served whole by one worker needs
 * none of it.
 */
import { ClusterSteering } from './cluster-steering.js';

/** Peer addresses whose turn one tenant remembers (a forgotten one starts again at the next turn). */
const MAX_HOSTS_PER_TENANT = 4096;

interface Shared {
  /** The tenant's owners, first owner first; positions in the steering are indexes here. */
  owners: readonly number[];
  steering: ClusterSteering;
}

export class TenantSteering {
  /** Only tenants shared by several workers, and only those of the file as last read (retain()). */
  private readonly shared = new Map<string, Shared>();
  /** The agents each worker holds of each of its tenants, as it last reported. */
  private readonly held = new Map<number, ReadonlyMap<string, number>>();

  /** Worker `index` holds these agents of its tenants now. */
  agentsOf(index: number, tenants: readonly [string, number][]): void {
    this.held.set(index, new Map(tenants));
  }

  /** Worker `index` ended: its tunnels are gone with it. */
  gone(index: number): void {
    this.held.delete(index);
  }

  /** Forgets the tenants the file no longer has. */
  retain(names: ReadonlySet<string>): void {
    for (const name of this.shared.keys()) if (!names.has(name)) this.shared.delete(name);
  }

  /** The worker for an agent connection of `tenant` from `host`, among `ready` (undefined: none of its owners ready). */
  agent(tenant: string, owners: readonly number[], ready: readonly number[], host: string): number | undefined {
    const s = this.of(tenant, owners);
    const at = s.steering.agent(positions(owners, ready), host);
    return at === undefined ? undefined : owners[at];
  }

  /** The worker for a frontend connection of `tenant`: one of its owners holding the most of its agents, in turn. */
  frontend(tenant: string, owners: readonly number[], ready: readonly number[]): number | undefined {
    const s = this.of(tenant, owners);
    owners.forEach((w, at) => s.steering.agentsOf(at, this.held.get(w)?.get(tenant) ?? 0));
    const at = s.steering.frontend(positions(owners, ready));
    return at === undefined ? undefined : owners[at];
  }

  private of(tenant: string, owners: readonly number[]): Shared {
    let s = this.shared.get(tenant);
    if (!s || s.owners.length !== owners.length || s.owners.some((w, i) => w !== owners[i])) {
      s = { owners: [...owners], steering: new ClusterSteering(owners.length, MAX_HOSTS_PER_TENANT) };
      this.shared.set(tenant, s);
    }
    return s;
  }
}

/** The positions in `owners` of the workers in `ready`. */
function positions(owners: readonly number[], ready: readonly number[]): number[] {
  const out: number[] = [];
  owners.forEach((w, at) => {
    if (ready.includes(w)) out.push(at);
  });
  return out;
}
