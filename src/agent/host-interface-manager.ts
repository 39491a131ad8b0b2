/**
 * Owns the host-scoped interface carrying the advertise address: created
 * (or adopted) before the listeners bind, removed after they closed, and
 * only what Kanal created is removed (a link Kanal made carries a marker
 * alias, so an agent restarted after a crash reclaims it).
 */
import type { Logger } from 'pino';
import { ensureHostInterface, removeHostInterface, type HostInterfaceState, type InterfaceKind } from '../../native/host-interface.js';

export const INTERFACE_TYPES = ['dummy', 'bridge', 'none'] as const;
export type InterfaceType = (typeof INTERFACE_TYPES)[number];

export class HostInterfaceManager {
  private state: HostInterfaceState | undefined;

  constructor(
    private readonly name: string,
    private readonly type: InterfaceType,
    private readonly address: string,
    private readonly log: Logger,
  ) {}

  /** Throws NetlinkError with a message that names the cause (e.g. no dummy type). */
  setUp(): void {
    if (this.type === 'none') {
      this.log.info({ address: this.address }, 'using existing address (--bind-interface-type none)');
      return;
    }
    this.state = ensureHostInterface({ name: this.name, kind: this.type as InterfaceKind, address: this.address });
    this.log.info(
      { interface: this.name, kind: this.state.kind, address: this.address, createdLink: this.state.createdLink, addedAddress: this.state.addedAddress, reclaimed: this.state.reclaimed },
      'host interface ready',
    );
  }

  tearDown(): void {
    const state = this.state;
    if (!state) return;
    this.state = undefined;
    try {
      removeHostInterface(state);
      this.log.info({ interface: state.name, removedLink: state.createdLink, removedAddress: state.addedAddress }, 'host interface cleaned up');
    } catch (err) {
      this.log.error({ interface: state.name, err: (err as Error).message }, 'could not clean up host interface');
    }
  }
}
