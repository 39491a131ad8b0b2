/**
 * Owns the host-scoped interface carrying the advertise address: taken (owner
 * lock), created or adopted before the listeners bind, watched and restored
 * while the agent runs, removed after the listeners closed. Only what Kanal
 * created is removed (a link Kanal made carries a marker alias, so an agent
 * restarted after a crash reclaims it), and never while another live agent
 * owns it (the owner lock, native/owner-lock.ts, is checked before anything else).
 */
import type { Logger } from 'pino';
import {
  ensureHostInterface,
  inspectHostInterface,
  removeHostInterface,
  type HostInterfaceState,
  type InterfaceKind,
} from '../../native/host-interface.js';
import { acquireOwnerLock, OwnerLockHeldError, type OwnerLock } from '../../native/owner-lock.js';
import type { Readiness } from '../common/health-server.js';
import type { KanalMetrics } from '../domain/metrics.js';
import { AddressWatch } from './address-watch.js';
import { BIND_ADDRESS, BIND_INTERFACE_TYPE, bindProblem, describeBindProblem } from './bind-probe.js';
import { errorMessage } from '../common/error-message.js';

// The setting these messages name, spelt once here: the agent's table (src/agent/settings.ts) imports this module, so it cannot import the table back.
const BIND_INTERFACE = '--bind-interface';

export const INTERFACE_TYPES = ['dummy', 'bridge', 'none'] as const;
export type InterfaceType = (typeof INTERFACE_TYPES)[number];

export interface HostInterfaceOptions {
  name: string;
  type: InterfaceType;
  address: string;
  /** Told to a second agent that finds the owner lock taken. */
  agentID: string;
  log: Logger;
  metrics: KanalMetrics;
}

export class HostInterfaceManager {
  /** What ensureHostInterface last reported; undefined before setUp, after tearDown, and with type none. */
  private state: HostInterfaceState | undefined;
  /** Held from before the first kernel change until after the last one. */
  private locks: OwnerLock[] = [];
  private watch: AddressWatch | undefined;

  constructor(private readonly opts: HostInterfaceOptions) {}

  /**
   * Takes the owner locks, creates or reclaims the link and address, and starts
   * watching them. Throws with a message naming the flags when another live
   * agent owns them, or when the kernel refuses (e.g. no dummy type).
   */
  async setUp(): Promise<void> {
    const { name, type, address, log } = this.opts;
    if (type === 'none') {
      log.info({ address }, `using existing address (${BIND_INTERFACE_TYPE} none)`);
      await this.startWatch(address, async () => {
        const code = await bindProblem(address);
        return code ? [describeBindProblem(address, code)] : [];
      });
      return;
    }
    await this.lock();
    let s: HostInterfaceState;
    try {
      s = this.ensure();
    } catch (err) {
      await this.unlock();
      throw err;
    }
    log.info(
      { interface: name, kind: s.kind, address, createdLink: s.createdLink, addedAddress: s.addedAddress, reclaimed: s.reclaimed },
      'host interface ready',
    );
    await this.startWatch(
      `${address} on ${name}`,
      () => Promise.resolve(inspectHostInterface({ name, address })),
      () => void this.ensure(),
    );
  }

  readiness(): Readiness {
    return this.watch?.readiness() ?? { ready: true, detail: 'no advertise address' };
  }

  /** Which interface and address it keeps, and whether they are in place, for the admin port's /status. */
  snapshot(): { name: string; type: InterfaceType; address: string; ready: boolean; detail: string } {
    const { name, type, address } = this.opts;
    return { name, type, address, ...this.readiness() };
  }

  async tearDown(): Promise<void> {
    this.watch?.stop();
    this.watch = undefined;
    const state = this.state;
    this.state = undefined;
    if (state) {
      try {
        removeHostInterface(state);
        this.opts.log.info(
          { interface: state.name, removedLink: state.createdLink, removedAddress: state.addedAddress },
          'host interface cleaned up',
        );
      } catch (err) {
        this.opts.log.error({ interface: state.name, err: errorMessage(err) }, 'could not clean up host interface');
      }
    }
    await this.unlock();
  }

  /**
   * Creates or repairs link, address and up state. Ownership is recomputed each
   * time (a link re-created here carries the marker; an operator's link that
   * replaced ours does not), so tearDown removes exactly what Kanal made.
   */
  private ensure(): HostInterfaceState {
    this.state = ensureHostInterface({ name: this.opts.name, kind: this.opts.type as InterfaceKind, address: this.opts.address });
    return this.state;
  }

  private async startWatch(what: string, inspect: () => Promise<string[]>, restore?: () => void): Promise<void> {
    this.watch = new AddressWatch({ what, inspect, restore, log: this.opts.log, metrics: this.opts.metrics });
    await this.watch.start();
  }

  private async lock(): Promise<void> {
    const owner = { pid: process.pid, agentID: this.opts.agentID };
    try {
      for (const resource of [`interface ${this.opts.name}`, `address ${this.opts.address}`])
        this.locks.push(await acquireOwnerLock(resource, owner));
    } catch (err) {
      await this.unlock();
      if (!(err instanceof OwnerLockHeldError)) throw err;
      throw new Error(
        `${BIND_INTERFACE} ${this.opts.name} ${BIND_ADDRESS} ${this.opts.address}: ${err.message}; ` +
          `this agent changes nothing and exits. Stop the other agent first, or give this one another ${BIND_INTERFACE} and ${BIND_ADDRESS}`,
        { cause: err },
      );
    }
  }

  private async unlock(): Promise<void> {
    const locks = this.locks.splice(0);
    await Promise.all(locks.map((l) => l.release()));
  }
}
