/**
 * Connected agents, who may join, and how a dial picks one.
 *
 * An agent is its credential plus the agentID it announces (a label): a
 * second credential announcing the same agentID is another agent and never
 * shares the first's tunnels. One credential holds at most
 * `maxAgentsPerCredential` agents on this server, and one agent at most
 * MAX_TUNNELS_PER_AGENT tunnels. A full credential or agent admits a new
 * tunnel only in place of a stale one: a tunnel that leaves a PING sent on
 * the spot unanswered for REPLACE_AFTER_MS (or closes meanwhile). A live
 * agent is never displaced, so an agent behind a load balancer that briefly
 * opens a second stream to a server it already holds keeps its first one
 * (and its dials). Routing is quicker to doubt: a tunnel is avoided as soon
 * as it is quiet (liveness.ts).
 *
 * Which agent a dial goes to is routing/router.ts's choice among one tunnel
 * per agent.
 *
 * The dial rates and counts of an agent (--dial-rate-per-agent and the
 * per-agent caps) are its own, not its tunnels': every tunnel of the agent,
 * a reconnect or a resume included, shares one allowance kept here
 * (tunnel/dial-allowances.ts), grouped by credential under its bound.
 */
import type { AgentCredential } from '../identity/agent-credential.js';
import type { AgentBackend } from '../routing/agent-backend.js';
import { route, type Route, type RouteOutcome } from '../routing/router.js';
import { RouteIndex } from '../routing/route-index.js';
import { DEFAULT_PROXY_STRATEGIES } from '../routing/proxy-strategies.js';
import type { RefusalReason } from '../../domain/refusal-reason.js';
import { DialAllowances } from '../../tunnel/dial-allowances.js';
import type { DialAllowance, DialRateLimits } from '../../tunnel/dial-allowance.js';

/** One tunnel, plus one arriving to replace it (a reconnect) or a load balancer's short-lived duplicate. */
export const MAX_TUNNELS_PER_AGENT = 2;
/** Admissions of one credential waiting for probes at once; more are refused. */
const MAX_PENDING_PER_CREDENTIAL = 2;
/**
 * How long a tunnel may leave the admission's PING unanswered before a new
 * tunnel of its credential replaces it: longer than the quiet threshold, as
 * closing a live agent costs more than routing around a slow one.
 */
export const REPLACE_AFTER_MS = 5000;

/** Why admission refuses a tunnel: a subset of kanal_refusals_total's reasons. */
export type AdmissionRefusal = Extract<
  RefusalReason,
  'agent_credential_full' | 'agent_tunnels_full' | 'agent_admissions_busy' | 'agent_tenant_full'
>;

export type Admission =
  { ok: true; backend: AgentBackend; replaced: AgentBackend[] } | { ok: false; reason: AdmissionRefusal; message: string };

/** What the registry decided for one candidate at one moment. */
type Decision = { ok: true; replace: AgentBackend[] } | { ok: false; reason: AdmissionRefusal; probe: AgentBackend[]; message: string };

const DEFAULT_ROUTE: Route = { strategies: DEFAULT_PROXY_STRATEGIES };

export class AgentRegistry {
  /**
   * credential key -> agentID -> its tunnels, oldest first. Invariant: no
   * empty inner map or array; exactly the backends of `all`.
   */
  private readonly agents = new Map<string, Map<string, AgentBackend[]>>();
  /** Every registered tunnel, in order of arrival. */
  private readonly all = new Set<AgentBackend>();
  /** credential key -> admissions waiting for probes; no zero entries. */
  private readonly pending = new Map<string, number>();
  /** Tunnels under suspicion, with the probe that settles it; dials to them wait for it. */
  private readonly verifying = new Map<AgentBackend, Promise<boolean>>();
  /** What routing reads, kept with `agents` (add, remove): the same agents and tunnels, in arrays of its own. */
  private readonly routes = new RouteIndex();

  /**
   * `maxAgents`: distinct agents of all credentials together (a tenant's
   * max-agents); unbounded for a server of one cluster. `allowances`: the
   * agents' dial allowances, outliving their tunnels (tests give a fake clock).
   */
  constructor(
    private maxPerCredential = 1,
    private maxTotal = Number.POSITIVE_INFINITY,
    readonly allowances = new DialAllowances(),
  ) {}

  /**
   * The dial allowance of agent `agentID` of `credential`, shared by all its
   * tunnels, with `limits` applied; a credential announcing new agentIDs
   * beyond its bound starts them no fuller than its most drained agent.
   */
  allowanceFor(credential: AgentCredential, agentID: string, limits: DialRateLimits): DialAllowance {
    return this.allowances.allowanceFor(credential.key, agentID, limits, this.maxPerCredential);
  }

  get maxAgentsPerCredential(): number {
    return this.maxPerCredential;
  }

  get maxAgents(): number {
    return this.maxTotal;
  }

  /** New bounds (a tenant's file changed): they apply to admissions from now on; agents already in stay. */
  configure(o: { maxAgentsPerCredential: number; maxAgents?: number }): void {
    this.maxPerCredential = o.maxAgentsPerCredential;
    this.maxTotal = o.maxAgents ?? Number.POSITIVE_INFINITY;
  }

  /**
   * Admits a tunnel of `credential` announcing `agentID`, replacing stale
   * ones where a bound is reached. On admission `create()` is called at once
   * (it accepts the stream and builds the backend) and its backend is added
   * in the same turn, so concurrent admissions never overshoot a bound.
   */
  async admit(credential: AgentCredential, agentID: string, create: () => AgentBackend): Promise<Admission> {
    let decision = this.decide(credential, agentID, new Set());
    if (!decision.ok && decision.probe.length > 0) {
      const waiting = this.pending.get(credential.key) ?? 0;
      if (waiting >= MAX_PENDING_PER_CREDENTIAL) {
        return {
          ok: false,
          reason: 'agent_admissions_busy',
          message: `${waiting} other tunnels of this credential are being admitted; retry later`,
        };
      }
      this.pending.set(credential.key, waiting + 1);
      const unanswered = new Set<AgentBackend>();
      try {
        await Promise.all(
          decision.probe.map(async (b) => {
            if (!(await b.liveness?.probe(REPLACE_AFTER_MS))) unanswered.add(b);
          }),
        );
      } finally {
        const left = (this.pending.get(credential.key) ?? 1) - 1;
        if (left > 0) this.pending.set(credential.key, left);
        else this.pending.delete(credential.key);
      }
      decision = this.decide(credential, agentID, unanswered);
    }
    if (!decision.ok) return { ok: false, reason: decision.reason, message: decision.message };
    for (const old of decision.replace) {
      this.remove(old);
      old.tunnel.close(
        new Error(`replaced by a new tunnel of the same credential: this one left a PING unanswered for ${REPLACE_AFTER_MS} ms`),
      );
    }
    const backend = create();
    this.add(backend);
    // A new tunnel of a known agent often means its older one died silently: find out now.
    for (const older of this.agents.get(credential.key)?.get(agentID) ?? []) {
      if (older !== backend) this.verify(older);
    }
    return { ok: true, backend, replaced: decision.replace };
  }

  /** `unanswered`: tunnels that left this admission's probe unanswered (stale, with closed ones). */
  private decide(credential: AgentCredential, agentID: string, unanswered: ReadonlySet<AgentBackend>): Decision {
    const stale = (b: AgentBackend): boolean => !b.tunnel.isOpen || unanswered.has(b);
    const agents = this.agents.get(credential.key);
    const tunnels = agents?.get(agentID);
    if (tunnels) {
      if (tunnels.length < MAX_TUNNELS_PER_AGENT) return { ok: true, replace: [] };
      const old = tunnels.find(stale);
      if (old) return { ok: true, replace: [old] };
      return {
        ok: false,
        reason: 'agent_tunnels_full',
        probe: tunnels.filter((b) => b.liveness),
        message: `agent ${agentID} already holds ${tunnels.length} live tunnels to this server`,
      };
    }
    if (Number.isFinite(this.maxAgents) && this.agentCount >= this.maxAgents)
      return {
        ok: false,
        reason: 'agent_tenant_full',
        probe: [],
        message: `the tenant already has its maximum of ${this.maxAgents} agents on this server (max-agents)`,
      };
    if (!agents || agents.size < this.maxAgentsPerCredential) return { ok: true, replace: [] };
    const staleAgent = [...agents.values()].find((ts) => ts.every(stale));
    if (staleAgent) return { ok: true, replace: [...staleAgent] };
    const held = [...agents.keys()];
    return {
      ok: false,
      reason: 'agent_credential_full',
      probe: [...agents.values()].flat().filter((b) => b.liveness),
      message:
        `credential ${credential.subject} already holds ${held.length} live agent(s) on this server (agentID ${held.slice(0, 3).join(', ')}${held.length > 3 ? ', …' : ''}); ` +
        'to share one credential between agents, raise --max-agents-per-credential on the server; ' +
        `an agent restarted with a new agentID replaces its old tunnel once that leaves a PING unanswered for ${REPLACE_AFTER_MS} ms`,
    };
  }

  /** Adds a tunnel without admission checks (the admitted path and tests). */
  add(backend: AgentBackend): void {
    let agents = this.agents.get(backend.credential.key);
    if (!agents) {
      agents = new Map<string, AgentBackend[]>();
      this.agents.set(backend.credential.key, agents);
    }
    const tunnels = agents.get(backend.agentID);
    if (tunnels) tunnels.push(backend);
    else agents.set(backend.agentID, [backend]);
    this.all.add(backend);
    this.routes.add(backend);
  }

  /**
   * Probes a tunnel under suspicion (a newer tunnel of its agent arrived, or
   * a dial through it timed out); until the probe settles (at most the quiet
   * threshold) dials that would pick it wait, so none goes to a tunnel that
   * is about to be known dead.
   */
  verify(backend: AgentBackend): void {
    if (!backend.liveness || this.verifying.has(backend)) return;
    const probe = backend.liveness.probe();
    this.verifying.set(backend, probe);
    void probe.then(() => this.verifying.delete(backend));
  }

  remove(backend: AgentBackend): void {
    if (!this.all.delete(backend)) return;
    this.verifying.delete(backend);
    const agents = this.agents.get(backend.credential.key);
    const tunnels = agents?.get(backend.agentID);
    if (agents && tunnels) {
      tunnels.splice(tunnels.indexOf(backend), 1);
      if (tunnels.length === 0) agents.delete(backend.agentID);
      if (agents.size === 0) this.agents.delete(backend.credential.key);
    }
    this.routes.remove(backend);
  }

  /** Registered tunnels. */
  get size(): number {
    return this.all.size;
  }

  /** Distinct agents (credential + agentID). */
  get agentCount(): number {
    let n = 0;
    for (const agents of this.agents.values()) n += agents.size;
    return n;
  }

  list(): AgentBackend[] {
    return [...this.all];
  }

  /** Subjects of the credentials other than `credential` that announce `agentID`. */
  otherHolders(agentID: string, credential: AgentCredential): string[] {
    const out: string[] = [];
    for (const [key, agents] of this.agents) {
      const first = agents.get(agentID)?.[0];
      if (key !== credential.key && first) out.push(first.credential.subject);
    }
    return out;
  }

  /** pick(), waiting out (a bounded number of times) the verification of a suspect choice. */
  async pickVerified(r: Route = DEFAULT_ROUTE): Promise<RouteOutcome> {
    for (let i = 0; i < MAX_TUNNELS_PER_AGENT + 1; i++) {
      const outcome = this.pick(r);
      const probe = outcome.ok && this.verifying.get(outcome.backend);
      if (!probe) return outcome;
      await probe;
    }
    return this.pick(r);
  }

  /**
   * The agent `r` routes to (routing/router.ts), and of that agent its oldest
   * tunnel that answers PINGs (a load balancer's duplicate stays unused; a
   * newer live tunnel wins over a quiet older one). A dead tunnel is closed,
   * so it is never picked.
   */
  pick(r: Route = DEFAULT_ROUTE): RouteOutcome {
    return route(this.routes, r);
  }
}
