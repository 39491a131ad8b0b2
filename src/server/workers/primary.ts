/**
 * The primary of a server with several workers (`--workers`,
 * docs/multi-tenant.md "Workers"). One Node process is one event loop; a
 * server of many tenants spreads them over worker processes, each serving
 * the tenants ownerOf() gives it. The primary binds the shared ports, reads
 * each connection's ClientHello for its server name and hands the socket to
 * the worker of that name's tenant (any worker when there is none: that one
 * recognises the tenant by certificate and relays it, workers/handoff.ts).
 * A server of one cluster instead makes every worker a server of its own to
 * the agents (cluster-steering.ts picks the worker of each connection, no
 * byte read). The primary serves health and the workers' metrics together,
 * and starts a worker that died again without touching the others.
 */
import net from 'node:net';
import type { ChildProcess } from 'node:child_process';
import type { Logger } from 'pino';
import { Counter } from '../../domain/prom-client.js';
import { mergeExpositions } from '../../common/metrics-text.js';
import { startHealthServer, type HealthServer, type Readiness } from '../../common/health-server.js';
import { listenError } from '../../common/listen-error.js';
import type { KanalMetrics } from '../../domain/metrics.js';
import { Refusals } from '../../domain/refusal-log.js';
import { MAX_HELLO_BYTES, readClientHello } from './client-hello.js';
import { asToPrimary, type ToPrimary, type ToWorker } from './messages.js';
import { StateMachine, type Lifecycle } from '../../common/state-machine.js';
import { listenUnix, type UnixSocketFile, type UnixSocketOptions } from '../frontends/unix-socket.js';
import { ClusterSteering } from './cluster-steering.js';
import { TenantSteering } from './tenant-steering.js';
import { formatHostPort } from '../../common/host-port.js';
import { stopReading } from './stop-reading.js';
import { errorMessage } from '../../common/error-message.js';

/** What a Unix socket is bound with: two equal keys, the same socket. */
function socketKey(uds: UnixSocketOptions): string {
  return JSON.stringify([uds.path, uds.mode, uds.gid, uds.deleteExisting]);
}

/** How long a client may take to send its ClientHello (the listeners' handshake timeout). */
export const HELLO_TIMEOUT_MS = 15_000;
/** How long a worker has to stop after SIGTERM (its agents' tunnels closed, as a single process does) before it is killed. */
export const WORKER_STOP_GRACE_MS = 10_000;
/** A worker that does not answer a request within this long is left out of that answer. */
const REQUEST_TIMEOUT_MS = 3_000;
/** How often the workers' readiness (their tenants' agents) is asked for. */
const POLL_MS = 2_000;
/** Restart delays of a worker that keeps dying: doubling from the first to the last. */
const RESTART_DELAY_MS = { first: 500, last: 30_000 };
/** A worker that lived this long starts its next restart from the first delay. */
const STABLE_AFTER_MS = 60_000;

/**
 * One worker process. Its state moves starting -> ready -> (gone -> starting ...)
 * and to stopped once the primary stops; only transition() changes it, along
 * WORKER_LIFECYCLE. Invariant: `child` is set in starting and ready, and unset otherwise.
 */
type WorkerState = { kind: 'starting' } | { kind: 'ready'; since: number } | { kind: 'gone'; restartAt: number } | { kind: 'stopped' };

/** A worker starts from stopped (at first, or after it ended: gone); it may end (gone) before it was ready. */
const WORKER_LIFECYCLE: Lifecycle<WorkerState> = {
  name: 'worker',
  moves: {
    stopped: ['starting'],
    starting: ['ready', 'gone', 'stopped'],
    ready: ['gone', 'stopped'],
    gone: ['starting', 'stopped'],
  },
};

interface Worker {
  index: number;
  readonly machine: StateMachine<WorkerState>;
  child?: ChildProcess;
  /** Delay of the next restart. */
  delayMs: number;
  timer?: NodeJS.Timeout;
  pending: Map<number, (reply: Extract<ToPrimary, { type: 'reply' }> | undefined) => void>;
  /** Resolved by the first 'ready' of the current process. */
  onReady?: () => void;
  /**
   * Sockets sent to this worker whose send has not completed: Node passes
   * one handle at a time per channel and queues the rest until the worker
   * acknowledges (lib/internal/child_process.js), and a worker that dies
   * leaves the queued ones with nobody; they are closed when it ends.
   */
  readonly handing: Set<net.Socket>;
}

/** How a server of many tenants routes by server name (absent: a server of one cluster). */
export interface PrimaryTenants {
  /** The tenant a server name picks (the tenants file's server-name), read afresh for every connection. */
  tenantOfServerName(name: string): string | undefined;
  /** The workers that serve `tenant` (workers/owner.ts, its `tenant-workers` in the file as last read), first owner first. */
  owners(tenant: string): readonly number[];
  /** The tenants of the file as last read (`/readyz?tenant=` tells an unknown one from one not yet applied). */
  tenantNames(): ReadonlySet<string>;
}

/** How the command line names the settings behind the options below, for listen errors and refusals (the assembly passes its table's names). */
export interface PrimaryFlags {
  agent: string;
  frontend: string;
  health: string;
  maxPendingHellos: string;
  maxPendingHellosPerHost: string;
}

/** A plain listener of one cluster (HTTP proxy, SOCKS5) the primary binds for its workers; ServerOptions.frontend.extra, in its order. */
export interface PrimaryExtraListener {
  /** The flags that bind it, for a listen error. */
  flags: string;
  uds?: UnixSocketOptions;
  plain?: { host: string; port: number };
}

export interface PrimaryOptions {
  count: number;
  /** Starts worker `index` (the CLI knows the command line and the runtime's form). */
  spawn(index: number): ChildProcess;
  agent: { host: string; port: number };
  frontend?: { host: string; port: number };
  /** One cluster's frontend on a Unix socket (--uds-name): bound here, each connection handed to a worker. */
  uds?: UnixSocketOptions;
  /** One cluster's plain listeners, each connection handed to a worker as the frontend's are. */
  extra?: readonly PrimaryExtraListener[];
  health?: { host: string; port: number };
  /** A server of many tenants; without, one cluster whose every worker serves every agent. */
  tenants?: PrimaryTenants;
  /** The Unix sockets of the tenants shared by several workers (bound here, each connection handed to one of them), by tenant. */
  tenantSockets?: ReadonlyMap<string, UnixSocketOptions>;
  /** Connections read for their ClientHello at once (--max-pending-client-hellos); beyond, a new one is closed and counted. */
  maxPendingHellos: number;
  /** The same from one peer address (--max-pending-client-hellos-per-host): one host cannot take every place. */
  maxPendingHellosPerHost: number;
  flags: PrimaryFlags;
  metrics: KanalMetrics;
  log: Logger;
}

export class WorkerPool {
  private readonly workers: Worker[];
  private readonly servers: net.Server[] = [];
  /** Sockets the primary still holds: accepted, their ClientHello not yet read (at most maxPendingHellos). */
  private readonly sockets = new Set<net.Socket>();
  /** Of `sockets`, how many each peer address holds (an entry only while it holds one). */
  private readonly pendingByHost = new Map<string, number>();
  private readonly refusals: Refusals;
  private health: HealthServer | undefined;
  private nextRequest = 1;
  private roundRobin = 0;
  /** One cluster: which worker takes each connection. */
  private readonly steering: ClusterSteering | undefined;
  /** Tenants: which of a tenant's workers takes each connection, for a tenant shared by several. */
  private readonly tenantSteering: TenantSteering | undefined;
  private readonly udsFiles: UnixSocketFile[] = [];
  /** The shared tenants' sockets bound now; `key` is what they were bound with (a change binds anew). */
  private readonly tenantUds = new Map<string, { key: string; server: net.Server; file: UnixSocketFile }>();
  /** Reloads one after another: each releases and binds tenants' sockets around the workers' own reload. */
  private reloading: Promise<void> = Promise.resolve();
  private stopping = false;
  /** Each worker's /readyz detail (its tenants), polled every POLL_MS so /readyz answers at once. */
  private readonly details = new Map<number, string>();
  /** Each worker's tenants' own readiness (`/readyz?tenant=`), polled with the details. */
  private readonly tenantReadiness = new Map<number, ReadonlyMap<string, Readiness>>();
  private poll: NodeJS.Timeout | undefined;
  private readonly restarts: Counter<'worker'>;
  /** Ports as bound (0 asked: the kernel's choice). */
  agentPort = 0;
  frontendPort = 0;
  /** Each plain listener's address as bound, in PrimaryOptions.extra's order. */
  readonly extraAddresses: string[] = [];

  constructor(private readonly opts: PrimaryOptions) {
    this.workers = Array.from({ length: opts.count }, (_, index) => ({
      index,
      machine: new StateMachine<WorkerState>({ kind: 'stopped' }, WORKER_LIFECYCLE, (from, to) =>
        opts.log.debug({ worker: index, from: from.kind, to: to.kind }, 'worker state'),
      ),
      delayMs: RESTART_DELAY_MS.first,
      pending: new Map(),
      handing: new Set(),
    }));
    this.restarts = new Counter({
      name: 'kanal_worker_restarts_total',
      help: 'Workers started again after they ended unexpectedly',
      labelNames: ['worker'],
      registers: [opts.metrics.registry],
    });
    this.refusals = new Refusals(opts.log, opts.metrics);
    this.steering = opts.tenants ? undefined : new ClusterSteering(opts.count);
    this.tenantSteering = opts.tenants ? new TenantSteering() : undefined;
    opts.metrics.gauge('kanal_workers_ready', 'Workers serving now', () => this.workers.filter((w) => w.machine.kind === 'ready').length);
  }

  /** /metrics of the whole server: the primary's and every worker's that answers. */
  get metricsSource(): { contentType: KanalMetrics['registry']['contentType']; metrics: () => Promise<string> } {
    return { contentType: this.opts.metrics.registry.contentType, metrics: () => this.metrics() };
  }

  get healthPort(): number {
    return this.health?.port ?? 0;
  }

  /** Starts every worker, waits until each is ready, then binds the shared ports and health. */
  async start(): Promise<void> {
    await Promise.all(this.workers.map((w) => this.startWorker(w)));
    this.agentPort = await this.listen(this.opts.agent, 'agent', this.opts.flags.agent);
    if (this.opts.frontend) this.frontendPort = await this.listen(this.opts.frontend, 'frontend', this.opts.flags.frontend);
    if (this.opts.uds) await this.listenUnix(this.opts.uds, { type: 'connection', port: 'frontend', head: '' });
    for (const [index, extra] of (this.opts.extra ?? []).entries()) await this.listenExtra(extra, index);
    for (const [tenant, uds] of this.opts.tenantSockets ?? []) await this.listenTenantSocket(tenant, uds);
    const health = this.opts.health;
    if (health) {
      this.health = await startHealthServer({
        ...health,
        readiness: (query) => this.readiness(query),
        registry: this.metricsSource,
        log: this.opts.log,
      }).catch((err: unknown) => {
        throw listenError(err, `${health.host}:${health.port}`, this.opts.flags.health);
      });
    }
    this.poll = setInterval(() => void this.pollReadiness(), POLL_MS);
    this.poll.unref();
    await this.pollReadiness();
    this.opts.log.info({ workers: this.workers.length, agentPort: this.agentPort }, 'kanal server started with workers');
  }

  /** A stopped worker's late news (a 'ready' after the stop) changes nothing; any other move is WORKER_LIFECYCLE's. */
  private transition(w: Worker, next: WorkerState): void {
    if (w.machine.is('stopped') && next.kind !== 'starting') return;
    w.machine.to(next);
  }

  private startWorker(w: Worker): Promise<void> {
    const child = this.opts.spawn(w.index);
    w.child = child;
    this.transition(w, { kind: 'starting' });
    const ready = new Promise<void>((resolve, reject) => {
      w.onReady = resolve;
      child.once('exit', (code, signal) => reject(new Error(`worker ${w.index} ended before it was ready (${signal ?? `code ${code}`})`)));
    });
    child.on('message', (raw: unknown) => {
      const m = asToPrimary(raw);
      if (!m) return;
      if (m.type === 'agents') {
        this.steering?.agentsOf(w.index, m.count);
        this.tenantSteering?.agentsOf(w.index, m.tenants);
        return;
      }
      if (m.type === 'ready') {
        this.transition(w, { kind: 'ready', since: Date.now() });
        w.onReady?.();
        w.onReady = undefined;
        this.opts.log.info({ worker: w.index, pid: child.pid }, 'worker ready');
        return;
      }
      const resolve = w.pending.get(m.id);
      w.pending.delete(m.id);
      resolve?.(m);
    });
    child.once('exit', (code, signal) => this.ended(w, child, code, signal));
    return ready;
  }

  /** A worker ended: at a stop, as asked; otherwise it is started again after its delay. */
  private ended(w: Worker, child: ChildProcess, code: number | null, signal: NodeJS.Signals | null): void {
    if (w.child !== child) return;
    w.child = undefined;
    this.steering?.gone(w.index);
    this.tenantSteering?.gone(w.index);
    for (const socket of w.handing) socket.destroy();
    w.handing.clear();
    for (const resolve of w.pending.values()) resolve(undefined);
    w.pending.clear();
    if (this.stopping) {
      this.transition(w, { kind: 'stopped' });
      return;
    }
    const was = w.machine.state;
    const lived = was.kind === 'ready' ? Date.now() - was.since : 0;
    if (lived > STABLE_AFTER_MS) w.delayMs = RESTART_DELAY_MS.first;
    const delay = w.delayMs;
    w.delayMs = Math.min(RESTART_DELAY_MS.last, w.delayMs * 2);
    this.transition(w, { kind: 'gone', restartAt: Date.now() + delay });
    this.restarts.inc({ worker: String(w.index) });
    this.opts.log.error(
      { worker: w.index, code, signal, restartInMs: delay },
      "worker ended; its tenants' connections are gone until it is back, the other workers' are untouched",
    );
    w.timer = setTimeout(() => {
      w.timer = undefined;
      if (this.stopping) return;
      this.startWorker(w).catch((err: Error) => this.opts.log.error({ worker: w.index, err: err.message }, 'worker did not start'));
    }, delay);
  }

  /** One cluster's Unix socket frontend: its connections go to the workers as the TCP frontend's do, each as `message` says. */
  private async listenUnix(uds: UnixSocketOptions, message: ToWorker): Promise<string> {
    const server = net.createServer({ pauseOnConnect: true, allowHalfOpen: true }, (socket) => this.handToFrontend(socket, message));
    const file = await listenUnix(server, uds);
    this.udsFiles.push(file);
    server.on('error', (err) => this.opts.log.error({ err: err.message }, 'listener error'));
    this.servers.push(server);
    return `unix://${file.path}`;
  }

  /**
   * The Unix socket of a tenant shared by several workers: one file, so
   * bound here, each connection handed unread to one of its workers holding
   * the most of its agents, as its TCP frontend connections are.
   */
  private async listenTenantSocket(tenant: string, uds: UnixSocketOptions): Promise<void> {
    const server = net.createServer({ pauseOnConnect: true, allowHalfOpen: true }, (socket) => {
      if (this.stopping) {
        socket.destroy();
        return;
      }
      const owners = this.opts.tenants?.owners(tenant) ?? [];
      this.handTo(this.tenantSteering?.frontend(tenant, owners, this.readyIndexes()), socket, {
        type: 'connection',
        port: 'tenant-uds',
        tenant,
      });
    });
    const file = await listenUnix(server, uds);
    if (this.stopping) {
      // stop() ran while this bound: it closed the sockets it knew of.
      server.close();
      file.release();
      return;
    }
    server.on('error', (err) => this.opts.log.error({ tenant, err: err.message }, 'listener error'));
    this.tenantUds.set(tenant, { key: socketKey(uds), server, file });
    this.opts.log.info({ tenant, uds: file.path }, "tenant's Unix socket ready, its connections spread over the workers that share it");
  }

  /** Stops listening on a shared tenant's socket; connections handed on stay with their workers. */
  private closeTenantSocket(tenant: string): void {
    const bound = this.tenantUds.get(tenant);
    if (!bound) return;
    this.tenantUds.delete(tenant);
    // Not waited for: Node counts the sockets handed to a worker as the listener's until the worker closes them.
    bound.server.close();
    bound.file.release();
  }

  /** One cluster's plain listener `index` (HTTP proxy, SOCKS5): bound here, each connection handed on unread. */
  private async listenExtra(extra: PrimaryExtraListener, index: number): Promise<void> {
    const message: ToWorker = { type: 'connection', port: 'extra', index };
    let address: string;
    if (extra.uds) address = await this.listenUnix(extra.uds, message);
    else if (extra.plain) {
      const port = await this.listen(extra.plain, message, extra.flags);
      address = formatHostPort({ host: extra.plain.host, port });
    } else return;
    this.extraAddresses[index] = address;
    this.opts.log.info({ address, listener: extra.flags }, 'frontend listener ready, its connections spread over the workers');
  }

  /** A frontend connection of one cluster: to one of the workers holding the most agents (cluster-steering.ts). */
  private handToFrontend(socket: net.Socket, message: ToWorker): void {
    if (this.stopping) socket.destroy();
    else this.handTo(this.steering?.frontend(this.readyIndexes()), socket, message);
  }

  /** Binds `where`; its connections go to accept(), or with a plain listener's `message` straight to a worker. */
  private async listen(where: { host: string; port: number }, port: 'agent' | 'frontend' | ToWorker, flags: string): Promise<number> {
    const server = net.createServer({ pauseOnConnect: true, allowHalfOpen: port !== 'agent' }, (socket) =>
      typeof port === 'string' ? this.accept(socket, port) : this.handToFrontend(socket, port),
    );
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen({ host: where.host, port: where.port }, () => {
          server.off('error', reject);
          resolve();
        });
      });
    } catch (err) {
      throw listenError(err, `${where.host}:${where.port}`, flags);
    }
    server.on('error', (err) => this.opts.log.error({ err: err.message }, 'listener error'));
    this.servers.push(server);
    const address = server.address();
    return typeof address === 'object' && address !== null ? address.port : where.port;
  }

  /**
   * A new connection: held while its ClientHello is read, at most
   * maxPendingHellos of them, so clients that never finish theirs cost a
   * bounded number of descriptors and buffers (each at most MAX_HELLO_BYTES
   * for HELLO_TIMEOUT_MS); the one over the bound is closed at once.
   */
  private accept(socket: net.Socket, port: 'agent' | 'frontend'): void {
    if (this.stopping) {
      socket.destroy();
      return;
    }
    const host = socket.remoteAddress ?? 'unknown';
    const steering = this.steering;
    if (steering) {
      // Every worker of one cluster serves every connection: handed on at once, nothing read.
      const ready = this.readyIndexes();
      this.handTo(port === 'agent' ? steering.agent(ready, host) : steering.frontend(ready), socket, {
        type: 'connection',
        port,
        head: '',
      });
      return;
    }
    const fromHost = this.pendingByHost.get(host) ?? 0;
    const full =
      this.sockets.size >= this.opts.maxPendingHellos
        ? this.opts.flags.maxPendingHellos
        : fromHost >= this.opts.maxPendingHellosPerHost
          ? this.opts.flags.maxPendingHellosPerHost
          : undefined;
    if (full) {
      this.refusals.refuse({
        reason: 'client_hello_backlog',
        peer: `${host}:${socket.remotePort ?? 0}`,
        fields: { port, pending: this.sockets.size, pendingFromHost: fromHost, limit: full },
        message: `closed ${port} connection: ${full} connections are already being read for their ClientHello`,
        detail: full,
      });
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    this.pendingByHost.set(host, fromHost + 1);
    let held = true;
    const release = (): void => {
      if (!held) return;
      held = false;
      this.sockets.delete(socket);
      const n = (this.pendingByHost.get(host) ?? 1) - 1;
      if (n > 0) this.pendingByHost.set(host, n);
      else this.pendingByHost.delete(host);
    };
    socket.once('close', release);
    this.route(socket, port, release);
  }

  /** The indexes of the workers serving now. */
  private readyIndexes(): number[] {
    return this.workers.filter((w) => w.machine.kind === 'ready' && w.child).map((w) => w.index);
  }

  /** Hands `socket`, unread, to worker `index` with `message` (no worker: closed). */
  private handTo(index: number | undefined, socket: net.Socket, message: ToWorker): void {
    const w = index === undefined ? undefined : this.workers[index];
    const child = w?.child;
    if (!w || !child) {
      socket.destroy();
      return;
    }
    w.handing.add(socket);
    child.send(message, socket, (err) => {
      w.handing.delete(socket);
      if (err) socket.destroy();
    });
  }

  /** Reads the ClientHello (bounded in size and time), then hands the socket to the worker of its tenant. */
  private route(socket: net.Socket, port: 'agent' | 'frontend', release: () => void): void {
    let head = Buffer.alloc(0);
    const timer = setTimeout(() => socket.destroy(), HELLO_TIMEOUT_MS);
    const give = (serverName: string | undefined): void => {
      clearTimeout(timer);
      socket.off('data', onData);
      // Read here, so no longer read at all: the worker reads on from the next byte (stop-reading.ts).
      const rest = stopReading(socket);
      // No longer the primary's to hold: the worker has it (or nobody, below).
      release();
      const tenant = serverName === undefined ? undefined : this.opts.tenants?.tenantOfServerName(serverName);
      const message: ToWorker = { type: 'connection', port, head: Buffer.concat([head, rest]).toString('base64') };
      this.handTo(this.workerFor(tenant, port, socket.remoteAddress ?? 'unknown')?.index, socket, message);
    };
    const onData = (chunk: Buffer): void => {
      head = Buffer.concat([head, chunk]);
      const read = readClientHello(head);
      if (read.kind === 'more' && head.length < MAX_HELLO_BYTES) return;
      give(read.kind === 'done' ? read.serverName : undefined);
    };
    socket.on('data', onData);
    socket.on('error', () => socket.destroy());
    socket.resume();
  }

  /**
   * The owner of `tenant` (of a tenant shared by several workers, the one
   * its steering picks), or the next ready worker in turn (it recognises the
   * tenant and relays).
   */
  private workerFor(tenant: string | undefined, port: 'agent' | 'frontend', host: string): Worker | undefined {
    const tenants = this.opts.tenants;
    if (tenant !== undefined && tenants) {
      const owners = tenants.owners(tenant);
      const steering = this.tenantSteering;
      if (owners.length === 1 || !steering) return this.workers[owners[0]];
      const ready = this.readyIndexes();
      const index = port === 'agent' ? steering.agent(tenant, owners, ready, host) : steering.frontend(tenant, owners, ready);
      return this.workers[index ?? owners[0]];
    }
    for (let i = 0; i < this.workers.length; i++) {
      const w = this.workers[this.roundRobin++ % this.workers.length];
      if (w.machine.kind === 'ready') return w;
    }
    return undefined;
  }

  private request(
    w: Worker,
    what: 'metrics' | 'readiness' | 'reload',
    timeoutMs = REQUEST_TIMEOUT_MS,
  ): Promise<Extract<ToPrimary, { type: 'reply' }> | undefined> {
    const child = w.child;
    if (!child || w.machine.kind !== 'ready') return Promise.resolve(undefined);
    const id = this.nextRequest++;
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        w.pending.delete(id);
        resolve(undefined);
      }, timeoutMs);
      w.pending.set(id, (reply) => {
        clearTimeout(timer);
        resolve(reply);
      });
      const message: ToWorker = { type: 'request', id, what };
      child.send(message);
    });
  }

  /** The primary's own metrics and every worker's that answers, aggregated (each series keeps its worker and tenant labels). */
  private async metrics(): Promise<string> {
    const own = await this.opts.metrics.registry.metrics();
    const replies = await Promise.all(this.workers.map((w) => this.request(w, 'metrics')));
    return mergeExpositions([own, ...replies.flatMap((r) => r?.metrics ?? [])]);
  }

  /**
   * Ready when every worker is; the detail names each worker and, as last
   * polled, its tenants. `?tenant=NAME` answers as one process of all the
   * tenants does: that tenant's readiness (from its worker, as last polled),
   * 503 for a tenant the file does not have.
   */
  private readiness(query?: URLSearchParams): Readiness {
    const one = query?.get('tenant');
    const tenants = this.opts.tenants;
    if (one && tenants) return this.readinessOf(one, tenants);
    const lines = this.workers.map((w) => {
      const own = w.machine.kind === 'ready' ? this.details.get(w.index) : undefined;
      return `worker ${w.index}: ${w.machine.kind}${w.child?.pid ? ` (pid ${w.child.pid})` : ''}${own ? `; ${own.replace(/\n/g, '\n  ')}` : ''}`;
    });
    // One cluster: ready once a worker holds an agent, as one process is once an agent is connected (upstream's rule).
    const ready = this.steering
      ? this.workers.some((w) => w.machine.kind === 'ready' && (this.steering?.agentsHeld(w.index) ?? 0) > 0)
      : this.workers.every((w) => w.machine.kind === 'ready');
    return { ready, detail: `${this.workers.length} worker(s)\n${lines.join('\n')}` };
  }

  private readinessOf(tenant: string, tenants: PrimaryTenants): Readiness {
    const noSuch = { ready: false, detail: `no tenant ${JSON.stringify(tenant)} here` };
    if (!tenants.tenantNames().has(tenant)) return noSuch;
    // Shared by several workers: ready when one of them is, as one process is once one agent is connected.
    const answers = tenants.owners(tenant).map((index) => {
      const w = this.workers[index];
      const polled = w.machine.kind === 'ready' ? this.tenantReadiness.get(w.index)?.get(tenant) : undefined;
      // In the file but not (yet) served by its worker: not ready, as a tenant just added is until applied.
      return (
        polled ?? (w.machine.kind === 'ready' ? noSuch : { ready: false, detail: `tenant ${tenant}: its worker is ${w.machine.kind}` })
      );
    });
    return answers.find((a) => a.ready) ?? answers[0];
  }

  private async pollReadiness(): Promise<void> {
    const tenants = this.opts.tenants;
    if (tenants) this.tenantSteering?.retain(tenants.tenantNames());
    const replies = await Promise.all(this.workers.map((w) => this.request(w, 'readiness')));
    replies.forEach((r, i) => {
      if (r?.readiness) this.details.set(i, r.readiness.detail);
      else this.details.delete(i);
      if (r?.tenants) this.tenantReadiness.set(i, new Map(r.tenants));
      else this.tenantReadiness.delete(i);
    });
  }

  /**
   * Every worker reads the tenants file (each applies its own tenants) or
   * one cluster's clients file again; resolves once all answered. With the
   * shared tenants' sockets of the file as now read: a socket no longer
   * shared here (or changed) is released first, so the worker that now
   * serves its tenant alone can bind it, and a newly shared one is bound
   * once the workers let go of it.
   */
  reload(tenantSockets?: ReadonlyMap<string, UnixSocketOptions>): Promise<void> {
    // A reload that failed must not keep the next ones from running.
    this.reloading = this.reloading
      .then(() => this.reloadNow(tenantSockets))
      .catch((err: unknown) => this.opts.log.error({ err: errorMessage(err) }, 'reload failed'));
    return this.reloading;
  }

  private async reloadNow(tenantSockets: ReadonlyMap<string, UnixSocketOptions> | undefined): Promise<void> {
    if (this.stopping) return;
    if (tenantSockets) {
      for (const [tenant, bound] of [...this.tenantUds]) {
        const wanted = tenantSockets.get(tenant);
        if (!wanted || socketKey(wanted) !== bound.key) this.closeTenantSocket(tenant);
      }
    }
    const replies = await Promise.all(this.workers.map((w) => this.request(w, 'reload', 60_000)));
    replies.forEach((r, i) => {
      if (r?.error) this.opts.log.error({ worker: i, err: r.error }, 'worker could not reload');
    });
    for (const [tenant, uds] of tenantSockets ?? []) {
      if (this.stopping || this.tenantUds.has(tenant)) continue;
      await this.listenTenantSocket(tenant, uds).catch((err: unknown) =>
        this.opts.log.error(
          { tenant, err: errorMessage(err) },
          "cannot listen on the tenant's Unix socket; its agents are served, its kube-apiserver cannot reach it",
        ),
      );
    }
  }

  /** Pids of the workers now (tests and operators: `kanal status`). */
  get pids(): (number | undefined)[] {
    return this.workers.map((w) => w.child?.pid);
  }

  /**
   * Stops the workers first (each drains its agents as a single process
   * does, WORKER_STOP_GRACE_MS at most, then SIGKILL), then health. The
   * listeners stop accepting at once; their close is not waited for: Node
   * counts the sockets handed to a worker as the listener's until the worker
   * closes them, so waiting would wait for every agent to leave.
   */
  async stop(): Promise<void> {
    this.stopping = true;
    clearInterval(this.poll);
    for (const s of this.servers) s.close();
    for (const tenant of [...this.tenantUds.keys()]) this.closeTenantSocket(tenant);
    for (const s of this.sockets) s.destroy();
    await Promise.all(
      this.workers.map(async (w) => {
        clearTimeout(w.timer);
        const child = w.child;
        if (!child) {
          this.transition(w, { kind: 'stopped' });
          return;
        }
        const exited = new Promise<void>((resolve) => {
          if (child.exitCode !== null || child.signalCode !== null) resolve();
          else child.once('exit', () => resolve());
        });
        child.kill('SIGTERM');
        const timer = setTimeout(() => {
          this.opts.log.warn({ worker: w.index, pid: child.pid, graceMs: WORKER_STOP_GRACE_MS }, 'worker did not stop in time: killed');
          child.kill('SIGKILL');
        }, WORKER_STOP_GRACE_MS);
        await exited;
        clearTimeout(timer);
      }),
    );
    await this.health?.close();
    for (const file of this.udsFiles.splice(0)) file.release();
    this.opts.log.info('workers stopped');
  }
}
