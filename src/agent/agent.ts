/**
 * The whole agent, as `kanal agent` runs it: the tunnels to the servers
 * (ServerTunnels) and, when configured, the lease counter with its Kubernetes
 * client, the node -> control plane side (host interface, node listeners,
 * KEP-2025) and the admin port, started and torn down in one order.
 */
import type { Logger } from 'pino';
import { ServerTunnels, type ServerTunnelsOptions } from './server-tunnels.js';
import { HostInterfaceManager } from './host-interface-manager.js';
import { NodeListeners } from './node-listeners.js';
import type { NodeSideOptions } from './node-side-config.js';
import type { ServerLeaseCounter } from './server-lease-counter.js';
import { startAdminPort } from '../common/admin-server.js';
import type { HttpPortLimits } from '../common/http-listener.js';
import type { HttpListener } from '../common/http-listener.js';
import { kubeClients, type KubeClientConfig } from '../kube/kube-clients.js';
import type { KubeApi } from '../kube/kube-api.js';
import { agentStatus } from './agent-status.js';
import type { AgentStatusDocument } from '../domain/status-document.js';
import { ProcessAuditLog } from '../audit/process-audit-log.js';
import type { AuditLogFileOptions } from '../audit/settings.js';
import { kindOf, StateMachine, type KindOf, type Lifecycle } from '../common/state-machine.js';
import { FLAG } from './settings.js';

export interface AgentOptions {
  /** The tunnels; with `leases`, their server count comes from the lease counter made here. */
  tunnels: ServerTunnelsOptions;
  /** `--count-server-leases`: the API client and the leases counted. */
  leases?: { kube: KubeClientConfig; namespace: string; selector: string };
  node?: NodeSideOptions;
  admin?: { host: string; port: number; profiling: boolean; limits?: HttpPortLimits };
  /** Kanal's version and commit, for the status document. */
  build?: { version: string; commit: string };
  /** --audit-log-path and its rotation (docs/operations.md, "The audit log"). */
  auditLog?: AuditLogFileOptions;
}

/**
 * Where a KanalAgent is in its life; it only moves forward (AGENT_LIFECYCLE).
 * - created: nothing made but the tunnels' object and the audit log's (unopened); stop() has nothing to release.
 * - starting: start() is making the parts, in order; stop() waits for `started`, then stops what it made.
 *   A second start() is refused here and in every later state, before it makes anything.
 * - running: every configured part is up.
 * - stopping: stop() is draining the tunnels and releasing the parts; another stop() waits for `stopped`.
 * - stopped: every part released (also after a start() that failed); final.
 */
export type AgentLife =
  | 'created'
  | { readonly kind: 'starting'; readonly started: Promise<void> }
  | 'running'
  | { readonly kind: 'stopping'; readonly stopped: Promise<void> }
  | 'stopped';

export const AGENT_LIFECYCLE: Lifecycle<AgentLife> = {
  name: 'kanal agent',
  moves: {
    created: ['starting', 'stopped'],
    starting: ['running', 'stopped'],
    running: ['stopping'],
    stopping: ['stopped'],
    stopped: [],
  },
};

export class KanalAgent {
  readonly tunnels: ServerTunnels;
  private readonly log: Logger;
  /** See AgentLife. */
  private readonly life: StateMachine<AgentLife>;
  // Each part is set once start() has created it, and released (in reverse) by release().
  private kubeApi: KubeApi | undefined;
  private leaseCounter: ServerLeaseCounter | undefined;
  private hostInterface: HostInterfaceManager | undefined;
  private nodeListeners: NodeListeners | undefined;
  private admin: HttpListener | undefined;
  /** Opened first by start(), closed last by release(), after the tunnels wrote their connections' records. */
  private readonly audit: ProcessAuditLog | undefined;

  constructor(private readonly opts: AgentOptions) {
    this.audit = opts.auditLog && new ProcessAuditLog(opts.auditLog);
    const { tunnels, leases } = opts;
    // The counter exists before the tunnels start (start()), so the count is never read without it.
    const counted: ServerTunnelsOptions['serverCount'] = {
      source: tunnels.serverCount?.source ?? 'default',
      leases: () => this.leaseCounter?.count() ?? 0,
    };
    const audited = this.audit ? { ...tunnels, audit: this.audit } : tunnels;
    this.tunnels = new ServerTunnels(leases ? { ...audited, serverCount: counted } : audited);
    this.log = opts.tunnels.log;
    this.life = new StateMachine<AgentLife>('created', AGENT_LIFECYCLE, (from, to) =>
      this.log.debug({ from: kindOf(from), to: kindOf(to) }, 'agent state'),
    );
  }

  /** Where the agent is in its life (AgentLife). */
  get state(): KindOf<AgentLife> {
    return this.life.kind;
  }

  /**
   * Starts the lease counter (its kubeconfig read first: a bad one fails
   * before anything is created), the host interface, the node listeners,
   * the tunnels, then the admin port. On failure releases what was started.
   * Only once: a second call is refused before it makes anything (a second
   * lease counter or host interface would outlive the first's release).
   */
  start(): Promise<void> {
    if (!this.life.is('created')) return Promise.reject(new Error(`the agent cannot start when ${this.life.kind}`));
    // Made after the move to 'starting' (a microtask later), so nothing is made outside it.
    const started = Promise.resolve()
      .then(() => this.startParts())
      .then(
        () => this.life.to('running'),
        async (err: unknown) => {
          try {
            await this.release();
          } finally {
            // Stopped even when a release fails, so a stop() waiting on this start ends.
            this.life.to('stopped');
          }
          throw err;
        },
      );
    this.life.to({ kind: 'starting', started });
    return started;
  }

  private async startParts(): Promise<void> {
    const { leases, node, admin } = this.opts;
    const log = this.log;
    await this.audit?.open(this.tunnels.metrics.registry, log.child({ part: 'audit' }));
    if (leases) {
      // Loaded only with --count-server-leases (kube-clients.ts).
      const api = (await kubeClients(leases.kube, log))();
      this.kubeApi = api;
      const { ServerLeaseCounter } = await import('./server-lease-counter.js');
      const counter = new ServerLeaseCounter({
        api,
        namespace: leases.namespace,
        selector: leases.selector,
        log: log.child({ part: 'lease' }),
      });
      this.leaseCounter = counter;
      // Upstream's agent lease metrics (lease_lists_total, lease_watches_total, lease_list_latency_seconds).
      const m = this.tunnels.upstreamMetrics;
      counter.on('api-call', (op, status, reason, seconds) => {
        const code = String(status);
        if (op === 'watch') {
          m.leaseWatches.inc({ http_response_code: code, reason });
        } else {
          m.leaseLists.inc({ http_response_code: code, reason });
          m.leaseListSeconds.observe({ http_response_code: code }, seconds);
        }
      });
      counter.start();
    }
    if (node) {
      const managed = new HostInterfaceManager({
        name: node.interfaceName,
        type: node.interfaceType,
        address: node.bindAddress,
        agentID: this.opts.tunnels.agentID,
        log,
        metrics: this.tunnels.metrics,
      });
      this.hostInterface = managed;
      await managed.setUp();
      this.tunnels.addReadinessCondition(() => managed.readiness());
      this.nodeListeners = new NodeListeners({
        bindAddress: node.bindAddress,
        targets: node.targets,
        tunnelWaitMs: node.tunnelWaitMs,
        dialTimeoutMs: this.opts.tunnels.dialTimeoutMs,
        agent: this.tunnels,
        log: log.child({ part: 'node-listeners' }),
      });
      await this.nodeListeners.start();
    }
    await this.tunnels.start();
    if (admin)
      this.admin = await startAdminPort(
        {
          ...admin,
          registry: this.tunnels.metrics.registry,
          status: () => this.status(),
          hostFlag: FLAG['admin-bind-address'],
          onRefusal: (reason) => this.tunnels.metrics.refusals.inc({ reason }),
          log,
        },
        `${FLAG['admin-bind-address']}, ${FLAG['admin-server-port']}`,
      );
  }

  /** The admin port's /status: its servers, tunnels, node listeners and host interface now (agent-status.ts). */
  status(): AgentStatusDocument {
    return agentStatus({
      agentID: this.opts.tunnels.agentID,
      tunnels: this.tunnels.snapshot(),
      metrics: this.tunnels.metrics,
      ...(this.nodeListeners ? { nodeListeners: this.nodeListeners } : {}),
      ...(this.hostInterface ? { hostInterface: this.hostInterface } : {}),
      build: this.opts.build ?? { version: 'unknown', commit: 'unknown' },
    });
  }

  /**
   * Stops accepting node connections, drains the tunnels for up to `graceMs`,
   * then releases the rest. During start() it waits for start() to end first;
   * called again while stopping it waits for the same stop.
   */
  async stop(graceMs: number): Promise<void> {
    const now = this.life.state;
    if (now === 'created') {
      // Nothing made; the tunnels are stopped too, so they cannot start later.
      this.life.to('stopped');
      await this.tunnels.stop(graceMs);
      return;
    }
    if (now === 'running') {
      const stopped = this.stopParts(graceMs);
      this.life.to({ kind: 'stopping', stopped });
      try {
        await stopped;
      } finally {
        this.life.to('stopped');
      }
      return;
    }
    if (now === 'stopped') return;
    if (now.kind === 'stopping') return now.stopped;
    // Starting: whether it succeeds or fails, stop what it leaves running.
    await now.started.catch(() => undefined);
    return this.stop(graceMs);
  }

  private async stopParts(graceMs: number): Promise<void> {
    this.nodeListeners?.stopAccepting();
    await this.tunnels.stop(graceMs);
    await this.release();
  }

  /** Admin port and listeners first, then the lease counter, its client, and the host interface last (it holds the owner lock). */
  private async release(): Promise<void> {
    await this.admin?.close();
    this.nodeListeners?.close();
    await this.leaseCounter?.stop();
    this.kubeApi?.close();
    await this.hostInterface?.tearDown();
    await this.audit?.close();
  }
}
