/**
 * How many servers the agent holds tunnels to, kept up to date: the
 * servers' count (server-count.ts, from the last serverCount header and the
 * lease counter) with a log line at each change, and, by name, a
 * disagreement between that count and the addresses dialled, said once
 * (log and /readyz). Also the number of tunnels the agent aims at (docs/ha.md).
 */
import type { Logger } from 'pino';
import { serverCount, type ServerCount, type ServerCountSource } from './server-count.js';

export interface ExpectedServersOptions {
  source: ServerCountSource;
  /** The lease counter's count; absent without --count-server-leases. */
  leases?: () => number;
  log: Logger;
}

/** What the agent holds and dials when the count is looked at again. */
export interface HoldingView {
  /** Tunnels up. */
  tunnels: number;
  /** Several addresses, one tunnel through each. */
  byName: boolean;
  /** The addresses dialled. */
  addresses: () => readonly string[];
  /** Tunnels aimed at (tunnelsAimedAt). */
  aimed: () => number;
}

export class ExpectedServers {
  /** The serverCount header of the last server connected to (0: none yet). */
  private announced = 0;
  /** What the servers' count was last found to be (update() only). */
  private found: ServerCount = { count: 1, from: 'fallback to 1' };
  /** By name: the last "addresses vs count" disagreement logged ('' none), so each is logged once. */
  private disagreement = '';

  constructor(private readonly opts: ExpectedServersOptions) {}

  /** The count last found, and where from. */
  get current(): ServerCount {
    return this.found;
  }

  /** By name: how the servers' count and the addresses disagree ('' when they do not). */
  get mismatch(): string {
    return this.disagreement;
  }

  /** A server just connected to said how many servers there are. */
  announce(serverCount: number): void {
    this.announced = serverCount;
  }

  /** The number of servers to hold tunnels to now; logs each change with its source (by name: and a disagreement with the addresses). */
  update(view: HoldingView): number {
    const c = serverCount(this.opts.source, this.opts.leases?.(), this.announced);
    if (c.count !== this.found.count || c.from !== this.found.from) {
      this.opts.log.info({ serverCount: c.count, from: c.from, previous: this.found.count, tunnels: view.tunnels }, 'server count changed');
    }
    this.found = c;
    this.checkAddresses(view);
    return c.count;
  }

  /** By name: says once when the servers count differently from the addresses dialled. */
  private checkAddresses(view: HoldingView): void {
    if (!view.byName || this.announced === 0) {
      this.disagreement = '';
      return;
    }
    const addresses = view.aimed();
    const { count, from } = this.found;
    const mismatch = count === addresses ? '' : `the servers count ${count} (${from}), ${addresses} address(es) reach distinct servers`;
    if (mismatch && mismatch !== this.disagreement) {
      this.opts.log.warn(
        { serverCount: count, from, addresses: view.addresses() },
        `server count and server addresses disagree: ${mismatch}`,
      );
    }
    this.disagreement = mismatch;
  }
}

/**
 * How many tunnels the agent aims at: the servers' count behind one address;
 * by name, each address not known to reach a server held through another.
 */
export function tunnelsAimedAt(
  byName: boolean,
  servers: number,
  addresses: Iterable<{ reachedHeld: string | undefined }>,
  held: (serverID: string | undefined) => boolean,
): number {
  if (!byName) return servers;
  let n = 0;
  for (const e of addresses) if (!held(e.reachedHeld)) n++;
  return n;
}
