/**
 * Which worker of a server of one cluster takes each connection
 * (docs/multi-tenant.md, "Workers of one cluster"). Every worker is a server
 * of its own to the agents (its own server ID, the server count multiplied),
 * so an agent keeps connecting until it holds a tunnel to each, and closes
 * a connection that reached a worker it already holds (upstream
 * pkg/agent/clientset.go, sync; Kanal's agent/reconnect-delay.ts).
 *
 * - Agent connections go round-robin per peer address: the successive
 *   connections of one node reach every worker within `count` attempts,
 *   whatever the others do, where the least loaded or a random worker could
 *   send it to the one it holds again and again.
 * - Frontend connections go round-robin over the workers that hold the most
 *   agents (as last reported): once converged that is every worker, and
 *   while one is catching up (just restarted) it gets no dial it cannot serve.
 */

/** Peer addresses whose turn is remembered; beyond, the oldest is forgotten (it starts again at the next turn). */
const MAX_HOSTS = 65_536;

export class ClusterSteering {
  /** Agents each worker reported holding (0 for a worker gone or not yet reported). */
  private readonly agents: number[];
  /** The next worker of each peer address, in insertion order (oldest first) for MAX_HOSTS. */
  private readonly nextOfHost = new Map<string, number>();
  /** Where a new peer address starts, and the frontend's turn. */
  private hostTurn = 0;
  private frontendTurn = 0;

  constructor(
    private readonly count: number,
    /** Peer addresses whose turn is remembered (a tenant's steering keeps fewer than a server's). */
    private readonly maxHosts = MAX_HOSTS,
  ) {
    this.agents = Array.from({ length: count }, () => 0);
  }

  /** Worker `index` holds `count` agents now. */
  agentsOf(index: number, count: number): void {
    this.agents[index] = count;
  }

  /** Worker `index` ended: its tunnels are gone with it. */
  gone(index: number): void {
    this.agents[index] = 0;
  }

  agentsHeld(index: number): number {
    return this.agents[index] ?? 0;
  }

  /** The worker for an agent connection from `host`, among `ready` (undefined: none ready). */
  agent(ready: readonly number[], host: string): number | undefined {
    if (ready.length === 0) return undefined;
    let next = this.nextOfHost.get(host);
    if (next === undefined) {
      next = this.hostTurn++ % this.count;
      if (this.nextOfHost.size >= this.maxHosts) this.nextOfHost.delete(this.nextOfHost.keys().next().value ?? '');
    } else this.nextOfHost.delete(host); // set again below: the most recent at the end
    // The first ready worker from this host's turn on.
    let chosen = ready[0];
    for (let i = 0; i < this.count; i++) {
      const candidate = (next + i) % this.count;
      if (ready.includes(candidate)) {
        chosen = candidate;
        break;
      }
    }
    this.nextOfHost.set(host, (chosen + 1) % this.count);
    return chosen;
  }

  /** The worker for a frontend connection, among `ready`: one of those holding the most agents, in turn. */
  frontend(ready: readonly number[]): number | undefined {
    if (ready.length === 0) return undefined;
    const most = Math.max(...ready.map((i) => this.agents[i]));
    const best = ready.filter((i) => this.agents[i] === most);
    return best[this.frontendTurn++ % best.length];
  }
}
