/**
 * 8. Reconnects: what an agent's tunnel going away costs, Kanal next to
 * upstream Konnectivity v0.36.0.
 *
 * 8a, HA behind one address: S servers behind a round-robin TCP balancer
 * (relay.ts, in a worker), N agents given only the balancer's address. After a
 * cold start, how long until every agent holds a tunnel to every server; then
 * each server in turn is killed and started again on its ports, and how long
 * from its /healthz answering until every agent holds a tunnel to it again.
 * Setups: Kanal agents and servers, upstream's, and upstream agents against
 * Kanal servers (what a cluster mid-migration runs).
 *
 * 8b, a tunnel cut: one server and one agent, the agent's tunnel through a
 * relay that resets every connection and refuses new ones for a few seconds,
 * while C tunnelled connections carry numbered lines through the server's
 * HTTP CONNECT frontend to the echo backend: connections lost, bytes lost or
 * duplicated on the survivors, time from the restore until each moves data
 * again, and the RSS of both processes while detached. Kanal with and without
 * resume (--resume-timeout), and upstream.
 *
 * 8c, the steady-state cost of resume: bulk throughput and sequential dial
 * latency on fresh pairs with --resume-timeout=30s and =0.
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, loopbackAgentArgs, loopbackServerArgs, readyOrStopped, waitHealthy, withPortRetry } from '../kit/launch/kanal-cli.js';
import { issueAgentCertificate } from '../kit/pki/throwaway-pki.js';
import { spawnChild, type Child } from './children.js';
import { BACKEND_HOST, kanalProgram, startServer } from './cluster.js';
import { cliOutput as cliOutputOf } from './cli-probe.js';
import { bulkRun, waitIdle, withFreshPair, type Env } from './env.js';
import { rssBytes } from './proc.js';
import type { ReconnectReport, ReconnectRow } from './report.js';
import { Worker } from './rpc.js';
import type { ReconnectCommands, StreamsResult } from './reconnect-worker.js';
import { inRepOrder, median, medianRatio, percentile, spread } from './stats.js';
import { startUpstreamServer, type UpstreamBinaries } from './upstream.js';
import { errorMessage } from '../src/common/error-message.js';

const MiB = 1024 * 1024;
const WORKER_SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), 'reconnect-worker.js');
/** How often tunnel counts and connection states are read. */
const POLL_MS = 50;
/** The resume window the "with resume" runs ask for. */
const RESUME = '30s';
/** Lines each tunnelled connection of 8b writes: one per this many ms. */
const LINE_INTERVAL_MS = 100;
/** After the restore, connections get this long to move (past the 30 s resume window, so a resume that expires shows as lost). */
const MOVE_WAIT_MS = 40_000;
/** Upstream's gauges, which Kanal's server and agent also export (src/domain/upstream-metrics.ts). */
const SERVER_AGENTS = 'konnectivity_network_proxy_server_ready_backend_connections';
const AGENT_TUNNELS = 'konnectivity_network_proxy_agent_open_server_connections';

type Product = 'kanal' | 'upstream';

/** Which Kanal commands of this run know --resume-timeout (resume is the server's offer; the agent may have no flag for it). */
interface ResumeFlags {
  server: boolean;
  agent: boolean;
  /** The value that turns it off (resumeOff()). */
  off: string;
}

/** One number of a Prometheus text page (the first series of that name), NaN when absent or unreadable. */
async function metric(url: string, name: string): Promise<number> {
  try {
    const text = await (await fetch(url, { signal: AbortSignal.timeout(1000) })).text();
    const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'm').exec(text);
    return m ? Number(m[1]) : Number.NaN;
  } catch {
    return Number.NaN;
  }
}

/** `kanal <args>` of this run's CLI (--kanal-cli's, or this checkout's): its stdout and stderr together. */
function cliOutput(env: Env, args: string[]): Promise<string> {
  return cliOutputOf(env.kanalCli, args);
}

/** Whether `kanal <command> --help` mentions `flag`. */
async function cliHas(env: Env, command: 'server' | 'agent', flag: string): Promise<boolean> {
  return (await cliOutput(env, [command, '--help'])).includes(flag);
}

/**
 * The --resume-timeout that turns resume off: 0s where the server takes it (its help says "0 closes
 * them at once"); a build that refuses 0 gets 1ms, the nearest it accepts (said in the notes).
 */
async function resumeOff(env: Env): Promise<string> {
  // --dry-run stops at the first problem: the missing certificate comes after the flag checks.
  const out = await cliOutput(env, ['server', '--resume-timeout=0s', '--dry-run']);
  return out.includes('--resume-timeout') ? '1ms' : '0s';
}

function startWorker(env: Env, name: string): Worker<ReconnectCommands> {
  return new Worker<ReconnectCommands>(spawnChild({ name, script: WORKER_SCRIPT, logFile: path.join(env.dir, `${name}.log`), ipc: true }));
}

// ------------------------------------------------------------------ processes

/** A server's fixed ports: kept across its restarts, so agents and the balancer find it where it was. */
interface ServerSlot {
  product: Product;
  id: string;
  agentPort: number;
  healthPort: number;
  /** Upstream serves /metrics on its admin port; Kanal on its health port. */
  adminPort: number;
  uds: string;
  child?: Child;
}

async function serverSlot(env: Env, product: Product, id: string): Promise<ServerSlot> {
  const [agentPort, healthPort, adminPort] = await Promise.all([freePort(), freePort(), freePort()]);
  return { product, id, agentPort, healthPort, adminPort, uds: path.join(env.dir, `${id}.sock`) };
}

const healthzOf = (s: ServerSlot): string => `http://127.0.0.1:${s.healthPort}/healthz`;
const serverMetricsOf = (s: ServerSlot): string =>
  s.product === 'kanal' ? `http://127.0.0.1:${s.healthPort}/metrics` : `http://127.0.0.1:${s.adminPort}/metrics`;

/**
 * The first start of `slot`'s server, before anything points at its ports:
 * a port another process took meanwhile (the bench runs inside the test
 * suite) gives the slot fresh ones (withPortRetry). Its restarts keep them.
 */
async function firstStart(env: Env, slot: ServerSlot, count: number, up: UpstreamBinaries | undefined): Promise<void> {
  let attempt = 0;
  await withPortRetry(async () => {
    if (attempt++ > 0) Object.assign(slot, await serverSlot(env, slot.product, slot.id));
    await spawnServer(env, slot, count, up, 0);
  });
}

/** Starts (or starts again) the server of `slot`; resolves when its /healthz answers (a server that does not is stopped). */
async function spawnServer(env: Env, slot: ServerSlot, count: number, up: UpstreamBinaries | undefined, run: number): Promise<void> {
  const logFile = path.join(env.dir, `${slot.id}-${run}.log`);
  if (slot.product === 'kanal') {
    slot.child = spawnChild({
      name: slot.id,
      ...kanalProgram(env.kanalCli),
      logFile,
      args: [
        ...loopbackServerArgs({ pki: env.pki, agentPort: slot.agentPort, healthPort: slot.healthPort }),
        '--uds-name',
        slot.uds,
        '--delete-existing-uds-file',
        '--server-id',
        slot.id,
        '--server-count',
        String(count),
        '--admin-port',
        '0',
        '--transport',
        env.transport,
        '--log-level',
        'info',
      ],
    });
  } else {
    if (!up) throw new Error('upstream binaries absent');
    slot.child = spawnChild({
      name: slot.id,
      executable: up.proxyServer,
      logFile,
      args: [
        '--mode=http-connect',
        `--uds-name=${slot.uds}`,
        '--delete-existing-uds-file=true',
        '--server-port=0',
        `--server-id=${slot.id}`,
        `--server-count=${count}`,
        `--cluster-cert=${env.pki.serverCert}`,
        `--cluster-key=${env.pki.serverKey}`,
        `--cluster-ca-cert=${env.pki.caCert}`,
        '--agent-bind-address=127.0.0.1',
        `--agent-port=${slot.agentPort}`,
        '--health-bind-address=127.0.0.1',
        `--health-port=${slot.healthPort}`,
        '--admin-bind-address=127.0.0.1',
        `--admin-port=${slot.adminPort}`,
        '--v=1',
      ],
    });
  }
  await readyOrStopped(slot.child, healthzOf(slot), 20_000);
}

interface AgentProc {
  child: Child;
  metricsUrl: string;
  readyUrl: string;
  product: Product;
}

/** What an agent needs before it starts: its certificate (a key pair: ~100 ms of CPU) and ports, so a timed start excludes them. */
interface AgentPlan {
  product: Product;
  id: string;
  cred: { cert: string; key: string };
  healthPort: number;
  adminPort: number;
}

async function planAgent(env: Env, product: Product, id: string): Promise<AgentPlan> {
  const [cred, healthPort, adminPort] = await Promise.all([issueAgentCertificate(env.pki, id), freePort(), freePort()]);
  return { product, id, cred, healthPort, adminPort };
}

/** Starts a planned agent given only 127.0.0.1:`port` (the balancer or the relay); `extra`: more Kanal flags. */
function launchAgent(env: Env, a: AgentPlan, port: number, up?: UpstreamBinaries, extra: string[] = []): AgentProc {
  const logFile = path.join(env.dir, `${a.id}.log`);
  let child: Child;
  if (a.product === 'kanal') {
    child = spawnChild({
      name: a.id,
      ...kanalProgram(env.kanalCli),
      logFile,
      args: [
        ...loopbackAgentArgs({ agentPort: port, caCert: env.pki.caCert, credential: a.cred, agentID: a.id, healthPort: a.healthPort }),
        '--admin-server-port',
        '0',
        '--transport',
        env.transport,
        '--log-level',
        'info',
        ...extra,
      ],
    });
  } else {
    if (!up) throw new Error('upstream binaries absent');
    child = spawnChild({
      name: a.id,
      executable: up.proxyAgent,
      logFile,
      args: [
        '--proxy-server-host=127.0.0.1',
        `--proxy-server-port=${port}`,
        `--ca-cert=${env.pki.caCert}`,
        `--agent-cert=${a.cred.cert}`,
        `--agent-key=${a.cred.key}`,
        `--agent-id=${a.id}`,
        '--health-server-host=127.0.0.1',
        `--health-server-port=${a.healthPort}`,
        '--admin-bind-address=127.0.0.1',
        `--admin-server-port=${a.adminPort}`,
        '--v=1',
      ],
    });
  }
  // Both serve /metrics on the health port (upstream's admin port has only pprof).
  const base = `http://127.0.0.1:${a.healthPort}`;
  return { child, product: a.product, metricsUrl: `${base}/metrics`, readyUrl: `${base}/readyz` };
}

/** Upstream's agent drains on its first SIGTERM and keeps serving: it is killed. */
const stopAgent = (a: AgentProc): Promise<number | null> => a.child.stop(a.product === 'upstream' ? 'SIGKILL' : 'SIGTERM');

// ------------------------------------------------------------------ 8a

interface HaSetup {
  id: string;
  label: string;
  servers: Product;
  agents: Product;
}

/** One timed wait: per-agent times (ms; undefined: not reached within the bound), and more figures of the event. */
interface HaEvent {
  agentMs: (number | undefined)[];
  firstMs?: (number | undefined)[];
  serversMs?: number;
  attempts: number;
}

async function timedPoll(timeoutMs: number, poll: (elapsedMs: number) => Promise<boolean>): Promise<void> {
  const t0 = performance.now();
  for (;;) {
    const elapsed = performance.now() - t0;
    if ((await poll(elapsed)) || elapsed > timeoutMs) return;
    await sleep(Math.max(0, POLL_MS - (performance.now() - t0 - elapsed)));
  }
}

/** One repetition of a setup: a cold start, then `restarts` servers restarted in turn. */
async function haRun(
  env: Env,
  relays: Worker<ReconnectCommands>,
  setup: HaSetup,
  rep: number,
): Promise<{ cold: HaEvent; restarts: HaEvent[] }> {
  const p = env.params;
  const S = p.reconnectServers;
  const N = p.reconnectAgents;
  const up = env.upstreamBinaries;
  const tag = `ha-${setup.id}-${rep}`;
  const slots = await Promise.all(Array.from({ length: S }, (_, i) => serverSlot(env, setup.servers, `${tag}-s${i}`)));
  const agents: AgentProc[] = [];
  let balancer: { id: number; port: number } | undefined;
  try {
    await Promise.all(slots.map((s) => firstStart(env, s, S, up)));
    balancer = await relays.call('relay', { targets: slots.map((s) => s.agentPort) });
    const accepted = async (): Promise<number> => (await relays.call('relayStats', { id: balancer!.id })).accepted;

    // Cold start: every agent spawned at once, servers already up.
    env.progress(`reconnect 8a (${setup.label}), run ${rep + 1}: cold start of ${N} agents`);
    const plans = await Promise.all(Array.from({ length: N }, (_, i) => planAgent(env, setup.agents, `${tag}-a${i}`)));
    const a0 = await accepted();
    const t0 = performance.now();
    for (const plan of plans) agents.push(launchAgent(env, plan, balancer.port, up));
    const spawnedIn = performance.now() - t0;
    const cold: HaEvent = {
      agentMs: Array.from({ length: N }, (): number | undefined => undefined),
      firstMs: Array.from({ length: N }, (): number | undefined => undefined),
      attempts: 0,
    };
    await timedPoll(p.reconnectTimeoutMs, async () => {
      const [tunnels, counts] = await Promise.all([
        Promise.all(agents.map((a) => metric(a.metricsUrl, AGENT_TUNNELS))),
        Promise.all(slots.map((s) => metric(serverMetricsOf(s), SERVER_AGENTS))),
      ]);
      const now = performance.now() - t0;
      tunnels.forEach((n, i) => {
        if (n >= 1 && cold.firstMs![i] === undefined) cold.firstMs![i] = now;
        if (n >= S && cold.agentMs[i] === undefined) cold.agentMs[i] = now;
      });
      if (cold.serversMs === undefined && counts.every((c) => c >= N)) cold.serversMs = now;
      return cold.serversMs !== undefined && cold.agentMs.every((t) => t !== undefined);
    });
    cold.attempts = (await accepted()) - a0;
    if (spawnedIn > 1000)
      env.warnings.push(`reconnect 8a: spawning ${N} agents took ${spawnedIn.toFixed(0)} ms (counted in the cold start)`);

    const restarts: HaEvent[] = [];
    for (let r = 0; r < Math.min(p.reconnectRestarts, S); r++) {
      const slot = slots[(r + rep) % S];
      env.progress(`reconnect 8a (${setup.label}), run ${rep + 1}: restarting ${slot.id}`);
      // A crash, not a drain: the agents learn of it from their tunnels ending.
      await slot.child?.stop('SIGKILL');
      await spawnServer(env, slot, S, up, r + 1);
      const ready = performance.now();
      const b0 = await accepted();
      const ev: HaEvent = { agentMs: Array.from({ length: N }, (): number | undefined => undefined), attempts: 0 };
      await timedPoll(p.reconnectTimeoutMs, async () => {
        const n = await metric(serverMetricsOf(slot), SERVER_AGENTS);
        const now = performance.now() - ready;
        // The k-th agent back is the count's k-th step up: the server's gauge has no per-agent times.
        for (let k = 0; k < Math.min(n, N); k++) ev.agentMs[k] ??= now;
        return n >= N;
      });
      ev.attempts = (await accepted()) - b0;
      const others = await Promise.all(slots.filter((s) => s !== slot).map((s) => metric(serverMetricsOf(s), SERVER_AGENTS)));
      if (others.some((c) => c < N))
        env.warnings.push(
          `reconnect 8a (${setup.label}): after ${slot.id}'s restart the other servers count ${others.join(', ')} agents, not ${N}`,
        );
      restarts.push(ev);
    }
    return { cold, restarts };
  } finally {
    await Promise.all(agents.map(stopAgent));
    await Promise.all(slots.map((s) => s.child?.stop() ?? Promise.resolve(null)));
    if (balancer) await relays.call('closeRelay', { id: balancer.id });
  }
}

/** p50 and max of per-agent times pooled over events; an agent that never came back counts as the bound. */
function haFigures(events: HaEvent[], boundMs: number): Record<string, number> {
  const all = events.flatMap((e) => e.agentMs.map((t) => t ?? Number.POSITIVE_INFINITY));
  const last = events.map((e) => Math.max(...e.agentMs.map((t) => t ?? Number.POSITIVE_INFINITY)));
  const p50 = percentile(all, 50);
  const max = Math.max(...all);
  const timeouts = events.filter((e) => e.agentMs.some((t) => t === undefined)).length;
  const v: Record<string, number> = {
    events: events.length,
    p50Ms: Number.isFinite(p50) ? p50 : boundMs,
    maxMs: Number.isFinite(max) ? max : boundMs,
    timeouts,
    attempts: median(events.map((e) => e.attempts)),
  };
  if (!Number.isFinite(p50)) v.p50Bound = 1;
  if (!Number.isFinite(max)) v.maxBound = 1;
  if (timeouts === 0) v.spread = spread(last);
  const first = events.flatMap((e) => (e.firstMs ?? []).filter((t): t is number => t !== undefined));
  if (first.length > 0) v.firstP50Ms = percentile(first, 50);
  // A cold start includes the process's own start (section 6): first tunnel -> all tunnels is the convergence alone.
  const after = events.flatMap((e) =>
    (e.firstMs ?? []).flatMap((f, i) => {
      const all = e.agentMs[i];
      return f === undefined || all === undefined ? [] : [all - f];
    }),
  );
  if (after.length > 0) {
    v.afterFirstP50Ms = percentile(after, 50);
    v.afterFirstMaxMs = Math.max(...after);
  }
  if (events.every((e) => e.firstMs !== undefined)) {
    const servers = events.map((e) => e.serversMs ?? Number.POSITIVE_INFINITY);
    const m = median(servers);
    v.serversMs = Number.isFinite(m) ? m : boundMs;
    if (!Number.isFinite(m)) v.serversBound = 1;
  }
  return v;
}

async function runHa(env: Env, relays: Worker<ReconnectCommands>): Promise<ReconnectRow[]> {
  const p = env.params;
  const setups: HaSetup[] = [{ id: 'kanal', label: 'Kanal agents, Kanal servers', servers: 'kanal', agents: 'kanal' }];
  if (env.upstreamBinaries) {
    setups.push(
      { id: 'upstream', label: 'upstream agents, upstream servers', servers: 'upstream', agents: 'upstream' },
      { id: 'upstream-on-kanal', label: 'upstream agents, Kanal servers', servers: 'kanal', agents: 'upstream' },
    );
  }
  const events = new Map(setups.map((s) => [s.id, { cold: [] as HaEvent[], restarts: [] as HaEvent[] }]));
  for (let rep = 0; rep < p.reconnectReps; rep++) {
    for (const setup of inRepOrder(setups, rep)) {
      const r = await haRun(env, relays, setup, rep);
      events.get(setup.id)!.cold.push(r.cold);
      events.get(setup.id)!.restarts.push(...r.restarts);
    }
  }
  const rows: ReconnectRow[] = [];
  for (const setup of setups) {
    const e = events.get(setup.id)!;
    for (const [phase, list, what] of [
      ['cold', e.cold, 'cold start: exec -> tunnels to all'],
      ['restart', e.restarts, 'server restart: ready -> all agents back'],
    ] as const) {
      rows.push({
        id: `reconnect.ha.${setup.id}.${phase}`,
        table: 'ha',
        label: `${setup.label}, ${what}`,
        values: { agents: p.reconnectAgents, servers: p.reconnectServers, ...haFigures(list, p.reconnectTimeoutMs) },
        runs: list.map((ev) => Math.round(Math.max(...ev.agentMs.map((t) => t ?? p.reconnectTimeoutMs)))),
      });
    }
  }
  // Kanal against upstream, each on its own (agents and servers of one product).
  for (const phase of ['cold', 'restart']) {
    const k = rows.find((r) => r.id === `reconnect.ha.kanal.${phase}`);
    const u = rows.find((r) => r.id === `reconnect.ha.upstream.${phase}`);
    if (!k || !u) continue;
    k.values.vsUpstreamP50 = k.values.p50Ms / u.values.p50Ms;
    k.values.vsUpstreamMax = k.values.maxMs / u.values.maxMs;
  }
  return rows;
}

// ------------------------------------------------------------------ 8b

interface CutSetup {
  id: string;
  label: string;
  product: Product;
  /** More flags for Kanal's server and agent (resume or none). */
  serverFlags: string[];
  agentFlags: string[];
}

interface CutRun {
  result: StreamsResult;
  /** Restore -> the server counts the agent again; undefined when not within the wait. */
  tunnelBackMs?: number;
  rss: { serverBefore: number; serverCut: number; agentBefore: number; agentCut: number };
  opened: number;
  openFailed: number;
}

async function cutRun(
  env: Env,
  relays: Worker<ReconnectCommands>,
  clients: Worker<ReconnectCommands>,
  setup: CutSetup,
  rep: number,
): Promise<CutRun> {
  const p = env.params;
  const tag = `cut-${setup.id}-${rep}`;
  let server: { child: Child; uds: string; agentPort: number; metricsUrl: string };
  if (setup.product === 'kanal') {
    const s = await startServer({
      dir: env.dir,
      tag,
      pki: env.pki,
      transport: env.transport,
      cli: env.kanalCli,
      serverArgs: ['--admin-port', '0', ...setup.serverFlags],
    });
    server = { child: s.child, uds: s.uds, agentPort: s.agentPort, metricsUrl: `${s.healthUrl}/metrics` };
  } else {
    if (!env.upstreamBinaries) throw new Error('upstream binaries absent');
    const s = await startUpstreamServer({ dir: env.dir, tag, pki: env.pki, binaries: env.upstreamBinaries });
    server = { child: s.child, uds: s.uds, agentPort: s.agentPort, metricsUrl: s.metricsUrl };
  }
  let relay: { id: number; port: number } | undefined;
  let agent: AgentProc | undefined;
  const group = tag;
  let opened = false;
  try {
    relay = await relays.call('relay', { targets: [server.agentPort] });
    agent = launchAgent(env, await planAgent(env, setup.product, `${tag}-agent`), relay.port, env.upstreamBinaries, setup.agentFlags);
    await waitHealthy(agent.child, agent.readyUrl, 20_000);
    let counted = false;
    await timedPoll(20_000, async () => (counted = (await metric(server.metricsUrl, SERVER_AGENTS)) >= 1));
    if (!counted) throw new Error(`${tag}: the server never counted its agent`);

    env.progress(`reconnect 8b (${setup.label}), run ${rep + 1}: opening ${p.reconnectConnections} connections`);
    const o = await clients.call(
      'openStreams',
      {
        group,
        uds: server.uds,
        authority: `${BACKEND_HOST}:${env.ports.echoTcp}`,
        count: p.reconnectConnections,
        concurrency: 32,
        intervalMs: LINE_INTERVAL_MS,
      },
      120_000,
    );
    opened = true;
    if (o.failed > 0) env.warnings.push(`reconnect 8b (${setup.label}): ${o.failed} connection(s) failed to open: ${o.firstError}`);
    // Every connection echoing before the cut: what is lost later was working.
    let st = await clients.call('streamsStatus', { group });
    await timedPoll(15_000, async () => {
      st = await clients.call('streamsStatus', { group });
      return st.echoed >= st.open;
    });
    if (st.echoed < st.open)
      env.warnings.push(`reconnect 8b (${setup.label}): only ${st.echoed} of ${st.open} connections echoed before the cut`);
    await sleep(1000);
    const pids = { server: server.child.pid, agent: agent.child.pid };
    const rss = { serverBefore: rssBytes(pids.server), agentBefore: rssBytes(pids.agent), serverCut: 0, agentCut: 0 };

    env.progress(`reconnect 8b (${setup.label}), run ${rep + 1}: tunnel cut for ${(p.reconnectCutMs / 1000).toFixed(0)} s`);
    await clients.call('markStreams', { group, arm: true });
    const cut = await relays.call('cut', { id: relay.id });
    await clients.call('markStreams', { group, cutAt: cut.at });
    const cutEnd = performance.now() + p.reconnectCutMs;
    while (performance.now() < cutEnd) {
      rss.serverCut = Math.max(rss.serverCut, rssBytes(pids.server));
      rss.agentCut = Math.max(rss.agentCut, rssBytes(pids.agent));
      await sleep(Math.min(250, Math.max(0, cutEnd - performance.now())));
    }
    const restore = await relays.call('restore', { id: relay.id });
    await clients.call('markStreams', { group, restoreAt: restore.at });
    const restoredAt = performance.now();
    let tunnelBackMs: number | undefined;
    await timedPoll(MOVE_WAIT_MS, async () => {
      const [n, s] = await Promise.all([metric(server.metricsUrl, SERVER_AGENTS), clients.call('streamsStatus', { group })]);
      if (n >= 1) tunnelBackMs ??= performance.now() - restoredAt;
      return tunnelBackMs !== undefined && s.moved >= s.open;
    });
    const result = await clients.call('finishStreams', { group, drainMs: 3000 }, 30_000);
    opened = false;
    return { result, tunnelBackMs, rss, opened: o.opened, openFailed: o.failed };
  } finally {
    if (opened) await clients.call('finishStreams', { group, drainMs: 0 }).catch(() => undefined);
    if (agent) await stopAgent(agent);
    await server.child.stop();
    if (relay) await relays.call('closeRelay', { id: relay.id });
  }
}

async function runCut(
  env: Env,
  relays: Worker<ReconnectCommands>,
  clients: Worker<ReconnectCommands>,
  resume: ResumeFlags,
): Promise<{ rows: ReconnectRow[]; notes: string[] }> {
  const p = env.params;
  const setups: CutSetup[] = [];
  const notes: string[] = [];
  const flags = (value: string): Pick<CutSetup, 'serverFlags' | 'agentFlags'> => ({
    serverFlags: [`--resume-timeout=${value}`],
    agentFlags: resume.agent ? [`--resume-timeout=${value}`] : [],
  });
  if (resume.server) {
    setups.push(
      { id: 'kanal-resume', label: `Kanal, --resume-timeout=${RESUME}`, product: 'kanal', ...flags(RESUME) },
      { id: 'kanal-noresume', label: `Kanal, --resume-timeout=${resume.off}`, product: 'kanal', ...flags(resume.off) },
    );
    if (resume.off !== '0s')
      notes.push(`\`kanal server --resume-timeout=0s\` is refused by this build: resume was turned off with ${resume.off}.`);
    if (!resume.agent) notes.push('`kanal agent --help` names no --resume-timeout: the flag went to the servers only.');
  } else {
    setups.push({ id: 'kanal-noresume', label: 'Kanal (no resume in this build)', product: 'kanal', serverFlags: [], agentFlags: [] });
    notes.push(`Kanal --resume-timeout=${RESUME}: resume not available (\`kanal server --help\` names no --resume-timeout).`);
  }
  if (env.upstreamBinaries) setups.push({ id: 'upstream', label: 'upstream', product: 'upstream', serverFlags: [], agentFlags: [] });
  const runs = new Map<string, CutRun[]>(setups.map((s) => [s.id, []]));
  for (let rep = 0; rep < p.reconnectReps; rep++) {
    for (const setup of inRepOrder(setups, rep)) runs.get(setup.id)!.push(await cutRun(env, relays, clients, setup, rep));
  }
  const rows: ReconnectRow[] = [];
  if (!resume.server) {
    rows.push({
      id: 'reconnect.cut.kanal-resume',
      table: 'cut',
      label: `Kanal, --resume-timeout=${RESUME}: resume not available`,
      values: {},
    });
  }
  for (const setup of setups) {
    const rs = runs.get(setup.id)!;
    const sum = (f: (r: CutRun) => number): number => rs.reduce((a, r) => a + f(r), 0);
    const moved = rs.flatMap((r) => r.result.movedAfterRestoreMs);
    const lostAt = rs.flatMap((r) => r.result.closedAfterCutMs);
    const back = rs.map((r) => r.tunnelBackMs ?? Number.POSITIVE_INFINITY);
    const backMedian = median(back);
    const values: Record<string, number> = {
      conns: sum((r) => r.result.opened),
      lost: sum((r) => r.result.lost),
      stalled: sum((r) => r.result.stalled),
      survived: sum((r) => r.result.survived),
      tunnelBackMs: Number.isFinite(backMedian) ? backMedian : MOVE_WAIT_MS,
      serverRssBeforeMiB: median(rs.map((r) => r.rss.serverBefore)) / MiB,
      serverRssCutMiB: median(rs.map((r) => r.rss.serverCut)) / MiB,
      agentRssBeforeMiB: median(rs.map((r) => r.rss.agentBefore)) / MiB,
      agentRssCutMiB: median(rs.map((r) => r.rss.agentCut)) / MiB,
      runs: rs.length,
    };
    if (!Number.isFinite(backMedian)) values.tunnelBackBound = 1;
    if (values.survived > 0) {
      values.lostBytes = sum((r) => r.result.lostBytes);
      values.dupBytes = sum((r) => r.result.dupBytes);
      values.corruptBytes = sum((r) => r.result.corruptBytes);
      values.movedP50Ms = percentile(moved, 50);
      values.movedMaxMs = Math.max(...moved);
    }
    if (lostAt.length > 0) values.lostAtP50Ms = percentile(lostAt, 50);
    rows.push({ id: `reconnect.cut.${setup.id}`, table: 'cut', label: setup.label, values, runs: rs.map((r) => r.result.survived) });
    const how = new Map<string, number>();
    for (const r of rs) for (const [k, n] of Object.entries(r.result.closedHow)) how.set(k, (how.get(k) ?? 0) + n);
    if (how.size > 0)
      notes.push(
        `${setup.label}: lost connections ended by ${[...how].map(([k, n]) => `${k} ×${n}`).join(', ')}; ended at ${percentile(lostAt, 0).toFixed(0)}..${Math.max(...lostAt).toFixed(0)} ms after the cut.`,
      );
  }
  return { rows, notes };
}

// ------------------------------------------------------------------ 8c

async function runCost(env: Env, resume: ResumeFlags): Promise<ReconnectRow[]> {
  const p = env.params;
  const variants = [
    { id: 'resume', label: `Kanal, --resume-timeout=${RESUME}`, flag: `--resume-timeout=${RESUME}` },
    { id: 'noresume', label: `Kanal, --resume-timeout=${resume.off}`, flag: `--resume-timeout=${resume.off}` },
  ];
  const samples = new Map(variants.map((v) => [v.id, { mbps: [] as number[], latencies: [] as number[] }]));
  for (let rep = 0; rep < p.reconnectReps; rep++) {
    for (const v of inRepOrder(variants, rep)) {
      env.progress(`reconnect 8c (${v.label}), run ${rep + 1}: bulk and dials on a fresh pair`);
      await withFreshPair(
        env,
        'kanal',
        `cost-${v.id}-${rep}`,
        async (fresh) => {
          // The dial path is optimised by V8 over its first few thousand dials (suite-dials.ts): time none of those.
          await fresh.client.call('dials', { path: 'kanal-cp', n: Math.min(p.dialWarmup, 2000), concurrency: 1 }, 120_000);
          await waitIdle(fresh);
          const bulk = await bulkRun(fresh, 'kanal-cp', 'down', 1);
          const d = await fresh.client.call('dials', { path: 'kanal-cp', n: p.dials, concurrency: 1 }, 120_000);
          await waitIdle(fresh);
          const s = samples.get(v.id)!;
          s.mbps.push(bulk.bytesPerSec / 1e6);
          s.latencies.push(...d.latenciesMs);
        },
        { serverArgs: [v.flag], agentArgs: resume.agent ? [v.flag] : [] },
      );
    }
  }
  const base = samples.get('noresume')!;
  return variants.map((v) => {
    const s = samples.get(v.id)!;
    const values: Record<string, number> = {
      mbps: median(s.mbps),
      mbpsSpread: spread(s.mbps),
      p50Ms: percentile(s.latencies, 50),
      p99Ms: percentile(s.latencies, 99),
      dials: s.latencies.length,
      runs: s.mbps.length,
    };
    if (v.id !== 'noresume') {
      values.ratioMbps = medianRatio(s.mbps, base.mbps);
      values.ratioP50 = values.p50Ms / percentile(base.latencies, 50);
      values.ratioP99 = values.p99Ms / percentile(base.latencies, 99);
    }
    return { id: `reconnect.cost.${v.id}`, table: 'cost' as const, label: v.label, values, runs: s.mbps.map((x) => Math.round(x)) };
  });
}

// ------------------------------------------------------------------ section

export async function runReconnect(env: Env): Promise<ReconnectReport> {
  const p = env.params;
  const [serverResume, agentResume] = await Promise.all([
    cliHas(env, 'server', '--resume-timeout'),
    cliHas(env, 'agent', '--resume-timeout'),
  ]);
  const resume: ResumeFlags = { server: serverResume, agent: agentResume, off: serverResume ? await resumeOff(env) : '0s' };
  const relays = startWorker(env, 'reconnect-relays');
  const clients = startWorker(env, 'reconnect-clients');
  const rows: ReconnectRow[] = [];
  const notes: string[] = [];
  // Each part on its own: one that fails (a process that would not start) leaves the others' tables.
  const part = async (name: string, run: () => Promise<ReconnectRow[]>): Promise<void> => {
    try {
      rows.push(...(await run()));
    } catch (err) {
      env.warnings.push(`reconnect ${name} failed: ${errorMessage(err)}`);
      env.progress(`reconnect ${name} FAILED: ${errorMessage(err)}`);
    }
  };
  try {
    await part('8a', () => runHa(env, relays));
    await part('8b', async () => {
      const cut = await runCut(env, relays, clients, resume);
      notes.push(...cut.notes);
      return cut.rows;
    });
    if (resume.server) await part('8c', () => runCost(env, resume));
    else notes.push('8c (steady-state cost of resume) not run: this build has no --resume-timeout.');
  } finally {
    await Promise.all([relays.child.stop(), clients.child.stop()]);
  }
  notes.push(
    `8a: ${p.reconnectReps} run(s) per setup, each with fresh servers (--server-count ${p.reconnectServers}, fixed ports) and agents (one certificate each,`,
    `defaults for reconnect timing: Kanal --sync-interval 1s/--sync-interval-cap 30s, upstream 1s/10s); ${Math.min(p.reconnectRestarts, p.reconnectServers)} restart(s) per run,`,
    'each after the previous one converged (or timed out); the balancer keeps sending to a dead server (refused at once), like one without health checks.',
    `8b: ${p.reconnectConnections} connections opened 32 at a time, each echoing before the cut; a cut resets both sides of every relayed connection`,
    `(ECONNRESET) and resets every new one until the restore; survivors drain for up to 3 s before counting; waits after the restore bounded at ${MOVE_WAIT_MS / 1000} s.`,
    'Tunnel counts: konnectivity_network_proxy_server_ready_backend_connections and _agent_open_server_connections (both products export them).',
  );
  return { rows, notes };
}
