/**
 * The tenants a server serves, each in its room (its Tenant, what it was
 * loaded from, its own Unix socket, what closes its API client), and the
 * reload of the tenants file that opens, updates and closes rooms
 * (docs/multi-tenant.md, "Live changes"; the decision is reload-plan.ts).
 * A server of one cluster has one room, named ONE_CLUSTER.
 */
import type net from 'node:net';
import type { Logger } from 'pino';
import type { LabelledCounter } from '../../domain/metrics.js';
import { errorMessage } from '../../common/error-message.js';
import type { TokenAuthenticator } from '../identity/token-authenticator.js';
import type { Tenant, TenantSettingsOptions } from './tenant.js';
import { sharesOf, TENANTS_CONFIG, type TenantDefinition } from './tenant-definition.js';
import { TenantDirectory, type TlsPolicyOptions } from './tenant-directory.js';
import { logRefusedReload } from './tenants-watch.js';
import { planReload, type Fingerprinted } from './reload-plan.js';

/** The implicit tenant's name: a server without --tenants-config. */
export const ONE_CLUSTER = '';

/** A tenant being served, with what was loaded for it and its own Unix socket. */
export interface Room {
  tenant: Tenant;
  loaded?: TenantDefinition;
  /** Its Unix socket: bound here, or, for a tenant several workers share, bound by their primary and adopted here. */
  uds?: { close(): Promise<void>; adopt?(socket: net.Socket, head: Buffer): void };
  /** Closes what was opened for it (its kube-apiserver client). */
  release?: () => void;
}

/** What a reload of the tenants file changed (names), or why it changed nothing. */
export type ReloadResult = { ok: true; added: string[]; changed: string[]; removed: string[] } | { ok: false; error: string };

export interface TenantRoomsOptions {
  /** Reads the tenants file (ServerOptions.tenants.load). */
  load(): TenantDefinition[];
  policy: TlsPolicyOptions;
  tokenReview?(tenant: TenantDefinition): Promise<{ authenticator: TokenAuthenticator; release: () => void }>;
  /** A tenant of the file, in its own metrics and log lines (KanalServer.tenantFrom). */
  tenantFrom(loaded: TenantDefinition, tokens: TokenAuthenticator | undefined): Tenant;
  /** The tenant's own Unix socket, once the server listens (undefined: none). */
  listenSocket(room: Room): Promise<Room['uds']>;
  /** Whether this process serves `tenant`, shared by `share` workers (a worker: its share of the file). */
  owns(tenant: string, share: number): boolean;
  /** The settings a tenant is updated with in place: its options as this process serves them (KanalServer.servedOptions). */
  settingsOf(loaded: TenantDefinition): TenantSettingsOptions;
  /** Whether a reload may run now (the server listens), and if not, why. */
  refusal(): string | undefined;
  reloads?: LabelledCounter<{ result: 'applied' | 'invalid' }>;
  log: Logger;
}

export class TenantRooms {
  /** Tenant name (ONE_CLUSTER without --tenants-config) -> what serves it. */
  private readonly rooms = new Map<string, Room>();
  /** Whose a connection is; replaced whole on a reload (undefined: one cluster). */
  private dir: TenantDirectory | undefined;
  /** One reload at a time; a request during one sets reloadAgain and is served by one more pass. */
  private reloading: Promise<ReloadResult> | undefined;
  private reloadAgain = false;
  /** How many workers share each tenant of the file as last applied (TenantDefinition.workers). */
  private shares = new Map<string, number>();

  constructor(private readonly opts?: TenantRoomsOptions) {}

  /** A server of one cluster: its one room. */
  static oneCluster(tenant: Tenant): TenantRooms {
    const rooms = new TenantRooms();
    rooms.rooms.set(ONE_CLUSTER, { tenant });
    return rooms;
  }

  get(name: string): Room | undefined {
    return this.rooms.get(name);
  }

  has(name: string): boolean {
    return this.rooms.has(name);
  }

  get size(): number {
    return this.rooms.size;
  }

  values(): IterableIterator<Room> {
    return this.rooms.values();
  }

  tenants(): Tenant[] {
    return [...this.rooms.values()].map((r) => r.tenant);
  }

  /** Names of the tenants served (empty without --tenants-config). */
  names(): string[] {
    return [...this.rooms.keys()].filter((n) => n !== ONE_CLUSTER);
  }

  /** How many workers share `tenant` in the file as last applied (1 for one it does not have). */
  shareOf(tenant: string): number {
    return this.shares.get(tenant) ?? 1;
  }

  /** The directory of the file as last applied (undefined on a server of one cluster). */
  get directory(): TenantDirectory | undefined {
    return this.dir;
  }

  /** The tenants of the file at start (the file was checked whole by load()). */
  async addTenants(list: readonly TenantDefinition[]): Promise<void> {
    const o = this.options();
    this.dir = new TenantDirectory(
      list.map((l) => l.credentials),
      o.policy,
    );
    this.shares = sharesOf(list);
    const own = list.filter((l) => o.owns(l.name, l.workers));
    for (const loaded of own) this.rooms.set(loaded.name, await this.openRoom(loaded));
    o.log.info({ tenants: own.map((l) => l.name) }, `serving ${own.length} tenant(s)`);
  }

  /** The file's tenants read at start (ServerOptions.tenants.load). */
  async addFromFile(): Promise<void> {
    await this.addTenants(this.options().load());
  }

  private async openRoom(loaded: TenantDefinition): Promise<Room> {
    const o = this.options();
    const review = loaded.tokens && (await o.tokenReview?.(loaded));
    const tenant = o.tenantFrom(loaded, review?.authenticator);
    return { tenant, loaded, ...(review ? { release: review.release } : {}) };
  }

  /**
   * Re-reads the tenants file and applies what changed, touching no other
   * tenant: added tenants start, removed ones are closed (one line each), a
   * changed one is closed and started anew. A file that cannot be used
   * changes nothing. One reload at a time; requests during one are merged into the next.
   */
  async reload(): Promise<ReloadResult> {
    if (!this.opts) return { ok: false, error: `this server has no ${TENANTS_CONFIG}` };
    const refusal = this.opts.refusal();
    if (refusal) return { ok: false, error: refusal };
    if (this.reloading) {
      this.reloadAgain = true;
      return this.reloading;
    }
    const run = async (): Promise<ReloadResult> => {
      let result: ReloadResult;
      do {
        this.reloadAgain = false;
        result = await this.applyReload();
      } while (this.reloadAgain && this.opts?.refusal() === undefined);
      return result;
    };
    this.reloading = run().finally(() => (this.reloading = undefined));
    return this.reloading;
  }

  /** Waits for a reload under way (at stop). */
  async settled(): Promise<void> {
    await this.reloading?.catch(() => undefined);
  }

  private async applyReload(): Promise<ReloadResult> {
    const o = this.options();
    let list: TenantDefinition[];
    let directory: TenantDirectory;
    try {
      list = o.load();
      directory = new TenantDirectory(
        list.map((l) => l.credentials),
        o.policy,
        this.dir,
      );
    } catch (err) {
      const error = errorMessage(err);
      logRefusedReload(o.log, err);
      o.reloads?.inc({ result: 'invalid' });
      return { ok: false, error };
    }
    const running = new Map<string, Fingerprinted>();
    for (const [name, room] of this.rooms) if (room.loaded) running.set(name, room.loaded);
    const shares = sharesOf(list);
    const plan = planReload(running, list, (name) => o.owns(name, shares.get(name) ?? 1));
    if (plan.kind === 'refused') return { ok: false, error: plan.error };
    this.shares = shares;
    const next = new Map(list.map((l) => [l.name, l]));
    const { added, removed, changed, inPlace, rebuilt } = plan;
    for (const name of [...removed, ...rebuilt]) await this.closeRoom(name, removed.includes(name) ? 'removed from' : 'changed in');
    for (const name of inPlace) {
      const room = this.rooms.get(name);
      const loaded = next.get(name);
      if (!room || !loaded) continue;
      room.tenant.update(o.settingsOf(loaded));
      room.loaded = loaded;
      room.tenant.log.info(
        { agentTunnels: room.tenant.registry.size },
        'tenant changed: settings applied in place, its agents and connections stay',
      );
    }
    // The listeners' default contexts hold no trust store: the directory is the trust, consulted per connection.
    this.dir = directory;
    for (const name of [...rebuilt, ...added]) {
      const loaded = next.get(name);
      if (!loaded) continue;
      const room = await this.openRoom(loaded);
      this.rooms.set(name, room);
      try {
        room.uds = await o.listenSocket(room);
      } catch (err) {
        room.tenant.log.error(
          { err: errorMessage(err) },
          "cannot listen on the tenant's Unix socket; its agents are served, its kube-apiserver cannot reach it",
        );
      }
      room.tenant.log.info(rebuilt.includes(name) ? 'tenant changed: started anew' : 'tenant added');
    }
    o.reloads?.inc({ result: 'applied' });
    o.log.info({ added, changed, inPlace, removed, tenants: this.rooms.size }, 'tenants file applied');
    return { ok: true, added: [...added], changed: [...changed], removed: [...removed] };
  }

  /** Stops serving a tenant: its socket, its agents' tunnels and its kube-apiserver's streams, in one line. */
  private async closeRoom(name: string, how: string): Promise<void> {
    const room = this.rooms.get(name);
    if (!room) return;
    this.rooms.delete(name);
    await room.uds?.close();
    const { agents, frontendStreams } = { agents: room.tenant.registry.size, frontendStreams: room.tenant.frontendTunnels.size };
    room.tenant.close(new Error(`tenant ${name} was ${how} the tenants file`));
    room.release?.();
    room.tenant.log.info(
      { agentTunnels: agents, frontendStreams },
      `tenant ${how.replace(/ (from|in)$/, '')} the tenants file: its agents and connections closed`,
    );
  }

  /** Closes every room (at stop): its socket, its tenant, its API client. */
  async closeAll(): Promise<void> {
    for (const room of this.rooms.values()) {
      await room.uds?.close();
      room.tenant.close();
      room.release?.();
    }
  }

  private options(): TenantRoomsOptions {
    if (!this.opts) throw new Error('no tenants file on a server of one cluster');
    return this.opts;
  }
}
