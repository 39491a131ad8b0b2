/**
 * The agent's reconnect loop (docs/ha.md): resolves the server hosts, keeps
 * one loop per address — connect, settle what it reached, wait as
 * ReconnectDelay and the connect schedule say — and resolves names again
 * every reconnect.maxMs (sooner after a failed lookup) to follow servers
 * added and removed.
 */
import type { Logger } from 'pino';
import { Backoff } from '../common/backoff.js';
import { errorMessage } from '../common/error-message.js';
import type { RateLimitedLog } from '../common/rate-limited-log.js';
import type { ServerAddresses, ServerEndpoint } from './server-addresses.js';
import type { ServerConnection } from './server-connection.js';
import { diagnoseConnectError, type ConnectAttempt } from './connect-diagnosis.js';
import { ReconnectDelay } from './reconnect-delay.js';
import type { Wakeups } from './wakeups.js';

/**
 * One address the agent dials and its loop. Invariant: in `endpoints` exactly
 * while the address is resolved; `removed` is aborted when it leaves, after
 * which its loop opens no more tunnels.
 */
export interface EndpointState {
  readonly endpoint: ServerEndpoint;
  readonly removed: AbortController;
  /** Why its last connect failed, with the flag to change (connect-diagnosis.ts; '' once one succeeds). */
  lastError: string;
  /** The server its last connect reached while held through another address (by name: not dialled again until that tunnel goes). */
  reachedHeld: string | undefined;
}

/** What the one decision on a server just connected to did (ServerTunnels.settle). */
export type Settled = 'adopted' | 'already-held' | 'closed';

export interface ReconnectLoopOptions {
  addresses: ServerAddresses;
  reconnect: { initialMs: number; maxMs: number };
  log: Logger;
  wakeups: Wakeups;
  /** Whether the agent runs: the loops end once it does not. */
  running: () => boolean;
  /** One warning per address and cause of connect failure, not one per retry. */
  connectFailures: RateLimitedLog;
  /** Milliseconds until `e`'s loop should connect (0: now; Infinity: not until something changes). */
  untilNextConnect: (e: EndpointState, lastAttempt: number) => number;
  connect: (endpoint: ServerEndpoint) => Promise<ServerConnection>;
  /** What a connect to `endpoint` offers, for the diagnosis of its failure. */
  attempt: (endpoint: ServerEndpoint) => ConnectAttempt;
  /** The one decision on a server just connected to through `e`'s address. */
  settle: (conn: ServerConnection, e: EndpointState) => Settled;
  /** `e`'s address refused a connection (no process listens there). */
  refused: (e: EndpointState) => void;
  /** Whether tunnels wait to resume (retries come faster meanwhile). */
  resuming: () => boolean;
  /** Behind one address: fewer tunnels up than servers counted (a next connect may reach a missing one). */
  missing: () => boolean;
  /** The addresses dialled changed. */
  changed: () => void;
}

export class ReconnectLoop {
  /** The addresses dialled, by target; changed only by reconcile(). */
  readonly endpoints = new Map<string, EndpointState>();
  /** Endpoint loops running, removed addresses' too until they end. */
  private readonly endpointLoops = new Set<Promise<void>>();

  constructor(private readonly opts: ReconnectLoopOptions) {}

  /** By name (several addresses): one tunnel through each. Behind one address: as many as the servers count. */
  get byName(): boolean {
    return this.endpoints.size > 1;
  }

  /** Runs until the agent stops running and every endpoint loop ended. */
  async run(stopped: AbortSignal): Promise<void> {
    const { reconnect, wakeups } = this.opts;
    const lookupRetry = new Backoff(reconnect.initialMs, reconnect.maxMs);
    while (this.opts.running()) {
      const failed = await this.resolve();
      if (!this.opts.addresses.resolvable) break;
      await wakeups.changeOrTimeout(failed ? lookupRetry.next() : reconnect.maxMs, stopped, false);
      if (!failed) lookupRetry.reset();
    }
    // Loops end once stopping (each wakes on the stop); removed ones have ended or will.
    while (this.endpointLoops.size > 0) await Promise.all([...this.endpointLoops]);
  }

  /** One resolution of every host, then reconcile(); true when a lookup failed. */
  private async resolve(): Promise<boolean> {
    const result = await this.opts.wakeups.unlessStopped(this.opts.addresses.resolve());
    if (!result || !this.opts.running()) return false;
    for (const f of result.failures) {
      this.opts.log.warn({ host: f.host, err: f.error }, 'cannot resolve proxy server host; keeping the addresses it had');
    }
    this.reconcile(result.endpoints);
    return result.failures.length > 0;
  }

  /** Makes `endpoints` the addresses dialled: a loop starts for each new one; a gone one's loop ends (its tunnel stays until it closes). */
  private reconcile(endpoints: readonly ServerEndpoint[]): void {
    const wanted = new Set(endpoints.map((e) => e.target));
    let changed = false;
    for (const [target, e] of this.endpoints) {
      if (wanted.has(target)) continue;
      e.removed.abort();
      this.endpoints.delete(target);
      changed = true;
      this.opts.log.info({ address: target }, 'proxy server address no longer resolved; no new tunnel through it');
    }
    for (const endpoint of endpoints) {
      if (this.endpoints.has(endpoint.target)) continue;
      const e: EndpointState = { endpoint, removed: new AbortController(), lastError: '', reachedHeld: undefined };
      this.endpoints.set(endpoint.target, e);
      changed = true;
      const loop = this.maintainEndpoint(e).finally(() => this.endpointLoops.delete(loop));
      this.endpointLoops.add(loop);
    }
    if (!changed) return;
    this.opts.log.info(
      { addresses: [...this.endpoints.keys()], mode: this.byName ? 'one tunnel per address' : 'one address for every server' },
      'proxy server addresses',
    );
    this.opts.changed();
  }

  /**
   * Keeps a tunnel through one address for as long as it is resolved: by
   * name, one tunnel through it; behind one address, tunnels until the
   * servers' count is reached. Waits between connects as ReconnectDelay says.
   */
  private async maintainEndpoint(e: EndpointState): Promise<void> {
    const { wakeups } = this.opts;
    const delay = new ReconnectDelay(this.opts.reconnect);
    const { signal } = e.removed;
    let lastAttempt = 0;
    while (this.opts.running() && !signal.aborted) {
      const wait = this.opts.untilNextConnect(e, lastAttempt);
      if (wait > 0) {
        await wakeups.changeOrTimeout(wait, signal);
        continue;
      }
      lastAttempt = Date.now();
      let conn: ServerConnection;
      try {
        conn = await this.opts.connect(e.endpoint);
      } catch (err) {
        const { cause, message } = diagnoseConnectError(err, this.opts.attempt(e.endpoint));
        e.lastError = message;
        if (refusedConnection(err)) this.opts.refused(e);
        const retryInMs = delay.failed(this.opts.resuming());
        const server = e.endpoint.target;
        this.opts.log.debug({ server, cause, err: errorMessage(err), retryInMs }, 'connect attempt failed');
        // One warning per cause in its words (an empty token file, then a missing one, are two); numbers aside, as grpc-js dates its messages.
        const key = `${server} ${cause} ${message.replace(/\d+/g, '#')}`;
        this.opts.connectFailures.warn(key, { server, cause, err: message }, 'cannot connect to proxy server');
        await wakeups.pause(retryInMs, signal);
        continue;
      }
      e.lastError = '';
      const settled = this.opts.settle(conn, e);
      if (settled === 'adopted') delay.succeeded();
      // Behind one address the next connect may reach another server: soon, while any is missing.
      else if (settled === 'already-held' && !this.byName && this.opts.missing()) await wakeups.pause(delay.reachedHeld(), signal);
      else delay.succeeded();
    }
  }
}

/** True when `err` (or an error it was caused by) is a TCP connection refused. */
export function refusedConnection(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    if ((e as NodeJS.ErrnoException).code === 'ECONNREFUSED') return true;
  }
  return false;
}
