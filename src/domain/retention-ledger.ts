/**
 * Who holds which bytes of the process (docs/limits.md, "Retained bytes"):
 * accounts process -> tenant -> agent (credential + agentID) -> connection.
 * A connection charges what it retains for a resend (capped: every account
 * above it may set a cap, and a connection at any cap stops reading its
 * local end until acknowledgements free room) and what it merely buffers
 * (counted, never capped: its own window bounds it). When the process holds
 * more than its budget, the agent that holds the most is shed: its
 * connections are closed, everyone else keeps working.
 */

/** Default caps on what one agent (credential + agentID) and one tenant may retain for resends (docs/limits.md). */
export const DEFAULT_AGENT_RETAINED_BYTES = 64 * 1024 * 1024;
export const DEFAULT_TENANT_RETAINED_BYTES = 1024 * 1024 * 1024;

/** What one holder (a tunnelled connection) sees of its account. */
export interface HeldBytes {
  /** Bytes it may retain more now under every cap above it: >= 0. */
  room(): number;
  /** Calls `wake` once, soon after room returns; one entry per function. */
  whenRoom(wake: () => void): void;
  /** Bytes kept for a resend (delta, may be negative). */
  retain(delta: number): void;
  /** Bytes buffered on their way (delta, may be negative). */
  buffer(delta: number): void;
  /** The holder is gone: what it still charged is given back. Once. */
  close(): void;
}

/** Where a tunnel opens the accounts of its connections (an agent's account on the server). */
export interface ConnectionAccounts {
  /** `shed` closes the connection (or forgets what it keeps) when the ledger sheds it. */
  openConnection(shed: (reason: string) => void): HeldBytes;
}

export type AccountKind = 'process' | 'tenant' | 'agent' | 'connection';

/** Told when an agent is shed: how much it held and how many connections it lost. */
export type ShedListener = (agent: LedgerAccount, heldBytes: number, connections: number) => void;

/**
 * One node of the tree. Invariants: `retained` and `buffered` are its own
 * charges plus its children's (every charge walks up the chain);
 * 0 <= retained <= cap except when a charge that the room allowed
 * raced one that did not wait (a buffered byte never counts against a cap).
 */
export class LedgerAccount implements HeldBytes, ConnectionAccounts {
  retained = 0;
  buffered = 0;
  /** Agents and tenants by key; connections in insertion order. */
  private readonly children = new Map<string | object, LedgerAccount>();
  /** Holders below waiting for room under this account's cap. */
  private waiters: Set<() => void> | undefined;
  private closed = false;
  /** Tunnels that use an agent account: it leaves its tenant once none does and it holds nothing. */
  private users = 0;
  /** This account and those above it, nearest first: every charge walks it. */
  private readonly chain: readonly LedgerAccount[];

  constructor(
    readonly kind: AccountKind,
    readonly key: string | object,
    /** Retained bytes this account and all below may hold together; Infinity: no cap of its own. */
    public cap: number,
    private readonly parent: LedgerAccount | undefined,
    private readonly ledger: RetentionLedger | undefined,
    /** A connection's: closes it (or forgets what it keeps); absent above. */
    private readonly shedder?: (reason: string) => void,
    /** An agent's: told when it is shed. */
    readonly onShed?: ShedListener,
  ) {
    this.chain = parent ? [this, ...parent.chain] : [this];
  }

  get held(): number {
    return this.retained + this.buffered;
  }

  /** Connections below an agent account (or agents below a tenant, tenants below the process). */
  get size(): number {
    return this.children.size;
  }

  list(): LedgerAccount[] {
    return [...this.children.values()];
  }

  /** The child under `key`, made with `cap` on first use (a tenant below the process, an agent below a tenant). */
  child(kind: 'tenant' | 'agent', key: string, cap: number, onShed?: ShedListener): LedgerAccount {
    let c = this.children.get(key);
    if (!c) {
      c = new LedgerAccount(kind, key, cap, this, this.ledger, undefined, onShed);
      this.children.set(key, c);
    }
    c.cap = cap;
    return c;
  }

  /** An agent account used by one more tunnel; give it back with unuse(). */
  use(): this {
    this.users++;
    return this;
  }

  unuse(): void {
    this.users = Math.max(0, this.users - 1);
    this.leaveIfEmpty();
  }

  /** A connection's account below this (agent) account; `shed` closes it. */
  openConnection(shed: (reason: string) => void): LedgerAccount {
    const key = {};
    const c = new LedgerAccount('connection', key, Number.POSITIVE_INFINITY, this, this.ledger, shed);
    this.children.set(key, c);
    return c;
  }

  room(): number {
    let room = Number.POSITIVE_INFINITY;
    for (const a of this.chain) room = Math.min(room, a.cap - a.retained);
    return Math.max(0, room);
  }

  whenRoom(wake: () => void): void {
    for (const a of this.chain) {
      if (a.cap - a.retained <= 0) {
        (a.waiters ??= new Set()).add(wake);
        return;
      }
    }
    queueMicrotask(wake);
  }

  retain(delta: number): void {
    if (delta === 0 || this.closed) return;
    for (const a of this.chain) {
      a.retained += delta;
      if (delta < 0 && a.waiters && a.retained < a.cap) a.wakeWaiters();
    }
    if (delta > 0) this.ledger?.charged();
  }

  buffer(delta: number): void {
    if (delta === 0 || this.closed) return;
    for (const a of this.chain) a.buffered += delta;
    if (delta > 0) this.ledger?.charged();
  }

  close(): void {
    if (this.closed) return;
    this.retain(-this.retained);
    this.buffer(-this.buffered);
    this.closed = true;
    this.parent?.children.delete(this.key);
    this.parent?.leaveIfEmpty();
  }

  /** Closes every connection below (an agent's), or this one; returns how many. */
  shed(reason: string): number {
    if (this.shedder) {
      this.shedder(reason);
      // A holder that did not give its bytes back is forgotten all the same: the ledger must not shed it again.
      this.close();
      return 1;
    }
    let n = 0;
    for (const c of [...this.children.values()]) n += c.shed(reason);
    return n;
  }

  private wakeWaiters(): void {
    const waiters = this.waiters;
    this.waiters = undefined;
    if (waiters) queueMicrotask(() => waiters.forEach((w) => w()));
  }

  private leaveIfEmpty(): void {
    if (this.kind !== 'agent' || this.users > 0 || this.children.size > 0 || this.held !== 0) return;
    this.parent?.children.delete(this.key);
  }
}

export interface RetentionLedgerOptions {
  /** What all accounts may hold together before the largest agent is shed (bytes). */
  budgetBytes: number;
}

/** The process's account and its budget. */
export class RetentionLedger {
  readonly root: LedgerAccount;
  private budget: number;
  private shedScheduled = false;

  constructor(opts: RetentionLedgerOptions) {
    this.budget = opts.budgetBytes;
    this.root = new LedgerAccount('process', 'process', Number.POSITIVE_INFINITY, undefined, this);
  }

  get budgetBytes(): number {
    return this.budget;
  }

  configure(budgetBytes: number): void {
    this.budget = budgetBytes;
    this.charged();
  }

  /** A tenant's account (`name` '' for the one tenant of a server without tenants), capped at `cap` retained bytes. */
  tenant(name: string, cap: number): LedgerAccount {
    return this.root.child('tenant', name, cap);
  }

  /** Called on every charge that grew: sheds, once the current turn ends, when the budget is exceeded. */
  charged(): void {
    if (this.shedScheduled || this.root.held <= this.budget) return;
    this.shedScheduled = true;
    setImmediate(() => {
      this.shedScheduled = false;
      this.shed();
    });
  }

  /**
   * While over budget, closes the connections of the agent that holds the
   * most, then the next; each agent once per round (bounded by their number).
   * Returns the agents shed.
   */
  shed(): LedgerAccount[] {
    const shed: LedgerAccount[] = [];
    const agents = this.root.list().flatMap((t) => t.list());
    agents.sort((a, b) => b.held - a.held);
    for (const agent of agents) {
      if (this.root.held <= this.budget || agent.held === 0) break;
      const held = agent.held;
      const reason = `this server's memory budget (${this.budget} bytes) is spent and this agent held the most (${held} bytes)`;
      const connections = agent.shed(reason);
      shed.push(agent);
      agent.onShed?.(agent, held, connections);
    }
    return shed;
  }
}
