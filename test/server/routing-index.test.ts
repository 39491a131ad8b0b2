/**
 * The router's per-dial work: routing reads only the agents a strategy
 * allows, from an index the registry keeps as tunnels come and go, and picks
 * exactly as before. The oracle below is the previous router (it filtered
 * every agent on every dial); random registries and routes must get the same
 * outcome from both, with ties broken among the same agents.
 */
import { EventEmitter } from 'node:events';
import { isIP } from 'node:net';
import test from 'ava';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import type { AgentBackend } from '../../src/server/routing/agent-backend.js';
import type { Route, RouteOutcome } from '../../src/server/routing/router.js';
import type { ProxyStrategy } from '../../src/server/routing/proxy-strategies.js';
import type { Tunnel } from '../../src/tunnel/tunnel.js';
import { canonicalHost, parseAgentIdentifiers, prefixContains } from '../../src/wire/agent-identifiers.js';
import type { Liveness, LivenessEvents } from '../../src/transport/liveness.js';

/** The tunnel state routing reads (Tunnel's read-only views, derived as Tunnel derives them), counting the reads. */
class FakeTunnel {
  reads = 0;
  /** What the test sets. */
  readonly state = { closed: false, drainRequested: false, readPaused: false };
  constructor(private readonly connections: number) {}
  get isOpen(): boolean {
    this.reads++;
    return !this.state.closed;
  }
  get preferredForDials(): boolean {
    this.reads++;
    return !this.state.closed && !this.state.drainRequested && !this.state.readPaused;
  }
  get load(): number {
    this.reads++;
    return this.connections;
  }
  stats(): { connections: number; pendingDials: number } {
    this.reads++;
    return { connections: this.connections, pendingDials: 0 };
  }
}

/** A connection whose PING state the test sets. */
class FakeLiveness extends EventEmitter<LivenessEvents> implements Liveness {
  quiet = false;
  probe(): Promise<boolean> {
    return Promise.resolve(!this.quiet);
  }
}

interface Fake {
  backend: AgentBackend;
  tunnel: FakeTunnel;
  liveness: FakeLiveness;
}

function fakeBackend(agentID: string, credential: string, identifiers: string, load: number): Fake {
  const tunnel = new FakeTunnel(load);
  const liveness = new FakeLiveness();
  const backend: AgentBackend = {
    agentID,
    credential: { key: credential, subject: `CN=${credential}` },
    identifiers: parseAgentIdentifiers(identifiers),
    // Routing reads only the fields FakeTunnel has; a real Tunnel needs a stream.
    tunnel: tunnel as unknown as Tunnel,
    liveness,
    peer: 'test',
    connectedAt: new Date(0),
  };
  return { backend, tunnel, liveness };
}

// ---- The oracle: the previous router, every agent filtered per dial (it reads what the test set). ----
function fakeState(b: AgentBackend): FakeTunnel['state'] {
  return (b.tunnel as unknown as FakeTunnel).state;
}
function oracleQuiet(b: AgentBackend): boolean {
  return fakeState(b).closed || b.liveness?.quiet === true;
}
function oracleFresh(b: AgentBackend): boolean {
  return !fakeState(b).drainRequested && !fakeState(b).readPaused;
}
function oracleLoad(b: AgentBackend): number {
  return b.tunnel.load;
}
/** All agents tied for least loaded (the oracle returns the set a random pick is drawn from). */
function oracleLeastLoaded(pool: AgentBackend[]): AgentBackend[] {
  const min = Math.min(...pool.map(oracleLoad));
  return pool.filter((b) => oracleLoad(b) === min);
}
interface OracleSet {
  strategy: ProxyStrategy;
  agents: AgentBackend[];
  none: string;
  contested?: { host: string; subjects: string[] };
}
function oracleDestHost(candidates: AgentBackend[], host: string | undefined): Omit<OracleSet, 'strategy'> {
  if (!host) return { agents: [], none: 'destHost: the dial names no host' };
  const dest = canonicalHost(host);
  const ip = isIP(dest) !== 0;
  const scored: Array<[AgentBackend, number]> = [];
  for (const b of candidates) {
    const ids = b.identifiers;
    if (ids.hosts.includes(dest) || ids.ipv4.includes(dest) || ids.ipv6.includes(dest)) scored.push([b, Infinity]);
    else if (ip) {
      const longest = Math.max(-1, ...ids.cidrs.filter((c) => prefixContains(c, dest)).map((c) => c.length));
      if (longest >= 0) scored.push([b, longest]);
    }
  }
  if (scored.length === 0) return { agents: [], none: `destHost: no agent announces ${dest}` };
  const credentials = new Map(scored.map(([b]) => [b.credential.key, b.credential.subject]));
  if (credentials.size > 1) {
    const contested = { host: dest, subjects: [...credentials.values()] };
    return {
      agents: [],
      none: `destHost: agents of ${credentials.size} credentials announce ${dest}, so none is trusted with it`,
      contested,
    };
  }
  const best = Math.max(...scored.map(([, s]) => s));
  return { agents: scored.filter(([, s]) => s === best).map(([b]) => b), none: '' };
}
type OracleOutcome =
  | { ok: true; among: AgentBackend[]; strategy: ProxyStrategy; contested?: OracleSet['contested'] }
  | { ok: false; reason: string; contested?: OracleSet['contested'] };
function oracle(agents: AgentBackend[][], r: Route): OracleOutcome {
  const candidates: AgentBackend[] = [];
  for (const tunnels of agents) {
    const open = tunnels.filter((b) => !fakeState(b).closed);
    const choice = open.find((b) => !oracleQuiet(b)) ?? open[open.length - 1];
    if (choice) candidates.push(choice);
  }
  const sets: OracleSet[] = r.strategies.map((strategy) => {
    switch (strategy) {
      case 'default':
        return { strategy, agents: candidates, none: 'default: no agent is connected' };
      case 'defaultRoute':
        return {
          strategy,
          agents: candidates.filter((b) => b.identifiers.defaultRoute),
          none: 'defaultRoute: no agent announces default-route=true',
        };
      case 'destHost':
        return { strategy, ...oracleDestHost(candidates, r.host) };
    }
  });
  const contested = sets.find((s) => s.contested)?.contested;
  for (const s of sets) {
    const live = s.agents.filter((b) => !oracleQuiet(b));
    if (live.length === 0) continue;
    const preferred = live.filter(oracleFresh);
    return { ok: true, among: oracleLeastLoaded(preferred.length > 0 ? preferred : live), strategy: s.strategy, contested };
  }
  for (const s of sets) {
    if (s.agents.length > 0) return { ok: true, among: oracleLeastLoaded(s.agents), strategy: s.strategy, contested };
  }
  return { ok: false, reason: sets.map((s) => s.none).join('; '), contested };
}

// ---- Random registries and routes. ----
/** A small seeded generator (mulberry32), so a failure names its seed. */
function generator(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const IDENTIFIER_POOL = [
  'host=a.example',
  'host=b.example',
  'ipv4=10.0.0.1',
  'ipv4=10.0.0.2',
  'ipv6=fd00::1',
  'cidr=10.0.0.0/24',
  'cidr=10.0.0.0/16',
  'cidr=fd00::/64',
  'default-route=true',
];
const HOSTS = ['a.example', 'B.example', 'c.example', '10.0.0.1', '10.0.0.2', '10.0.1.7', '10.9.9.9', 'fd00::1', 'fd00:0::2', undefined];
const STRATEGIES: ProxyStrategy[] = ['destHost', 'defaultRoute', 'default'];

function randomRoute(rand: () => number): Route {
  const strategies = STRATEGIES.filter(() => rand() < 0.6).sort(() => rand() - 0.5);
  return { strategies: strategies.length > 0 ? strategies : ['default'], host: HOSTS[Math.floor(rand() * HOSTS.length)] };
}

function setUp(rand: () => number): { registry: AgentRegistry; agents: AgentBackend[][]; fakes: Fake[] } {
  const registry = new AgentRegistry(4);
  const agents: AgentBackend[][] = [];
  const fakes: Fake[] = [];
  const n = 1 + Math.floor(rand() * 8);
  for (let i = 0; i < n; i++) {
    const credential = `cred-${Math.floor(rand() * 3)}`;
    const identifiers = IDENTIFIER_POOL.filter(() => rand() < 0.2).join('&');
    const tunnels: AgentBackend[] = [];
    for (let k = rand() < 0.3 ? 2 : 1; k > 0; k--) {
      const fake = fakeBackend(`agent-${i}`, credential, identifiers, Math.floor(rand() * 3));
      fake.tunnel.state.closed = rand() < 0.1;
      fake.liveness.quiet = rand() < 0.2;
      fake.tunnel.state.drainRequested = rand() < 0.15;
      fake.tunnel.state.readPaused = rand() < 0.1;
      registry.add(fake.backend);
      tunnels.push(fake.backend);
      fakes.push(fake);
    }
    agents.push(tunnels);
  }
  // Some agents leave, so the index is seen after removals too.
  for (const tunnels of agents) {
    if (rand() < 0.15) {
      const gone = tunnels.shift()!;
      registry.remove(gone);
    }
  }
  return { registry, agents: agents.filter((t) => t.length > 0), fakes };
}

function describe(outcome: RouteOutcome | OracleOutcome): unknown {
  return outcome.ok
    ? {
        ok: true,
        strategy: outcome.strategy,
        contested: outcome.contested && { ...outcome.contested, subjects: [...outcome.contested.subjects].sort() },
      }
    : {
        ok: false,
        reason: outcome.reason,
        contested: outcome.contested && { ...outcome.contested, subjects: [...outcome.contested.subjects].sort() },
      };
}

test('random registries and routes: the indexed router picks as the previous one did, ties among the same agents', (t) => {
  let compared = 0;
  let tiesSeenWhole = 0;
  for (let seed = 1; seed <= 400; seed++) {
    const rand = generator(seed);
    const { registry, agents } = setUp(rand);
    for (let q = 0; q < 5; q++) {
      const r = randomRoute(rand);
      const expected = oracle(agents, r);
      const got = registry.pick(r);
      t.deepEqual(describe(got), describe(expected), `seed ${seed}, route ${JSON.stringify(r)}`);
      if (!got.ok || !expected.ok) continue;
      compared++;
      // Every agent of the tie is drawn, and nothing else: 60 draws miss one of n <= 8 with p < 8 * (7/8)^60 < 0.3%.
      const drawn = new Set<AgentBackend>();
      for (let i = 0; i < 60; i++) {
        const again = registry.pick(r);
        if (again.ok) drawn.add(again.backend);
      }
      t.true(
        [...drawn].every((b) => expected.among.includes(b)),
        `seed ${seed}: picked outside the least loaded`,
      );
      if (drawn.size === expected.among.length) tiesSeenWhole++;
    }
  }
  t.true(compared > 500, `${compared} successful routes compared`);
  t.true(tiesSeenWhole >= compared * 0.97, `ties drawn whole in ${tiesSeenWhole} of ${compared}`);
});

test('a destHost dial reads the load and state of the agents announcing the host only, not of every agent', (t) => {
  const registry = new AgentRegistry(1);
  const fakes: Fake[] = [];
  for (let i = 0; i < 1000; i++) {
    const fake = fakeBackend(`node-${i}`, `cred-${i}`, `host=node-${i}.example&ipv4=10.1.${i >> 8}.${i & 255}`, i % 5);
    registry.add(fake.backend);
    fakes.push(fake);
  }
  for (const f of fakes) f.tunnel.reads = 0;
  const outcome = registry.pick({ strategies: ['destHost', 'default'], host: 'node-500.example' });
  t.true(outcome.ok && outcome.backend.agentID === 'node-500');
  const read = fakes.filter((f) => f.tunnel.reads > 0).map((f) => f.backend.agentID);
  t.deepEqual(read, ['node-500'], 'routing balanced load over tunnels it did not need');
});
