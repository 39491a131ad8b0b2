/**
 * HA behind one balancer address: three servers behind a round-robin TCP
 * balancer, three agents. Landing on a server an agent already holds is not a
 * failure (upstream's ClientSet.sync retries at the sync interval while it
 * holds fewer tunnels than servers), so its wait never grows towards
 * --sync-interval-cap: every agent holds a tunnel to every server within
 * seconds of a cold start, and again within seconds of one server's restart.
 * The sync interval is 200 ms (the cap the default 30 s) so that bounds of a
 * few seconds hold with room to spare: each connect reaches the missing
 * server with a chance of one in three. Upstream's agent runs beside them
 * with the same timing when its binaries are present; its times are logged.
 */
import test from 'ava';
import {
  makeWorkspace,
  restartServer,
  scrapeMetrics,
  startAgent,
  startServer,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { roundRobin } from '../helpers/round-robin.js';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';
import { setTimeout as sleep } from 'node:timers/promises';

/** A short interval under the default cap: a back-off that grew on held servers would show at once. */
const SYNC = ['--sync-interval', '200ms', '--sync-interval-cap', '30s'];
const UPSTREAM_SYNC = ['--sync-interval=200ms', '--sync-interval-cap=30s'];
const SERVERS = 3;
/** Tunnels per agent, as upstream's agent metric says (both agents export it on their health port). */
const OPEN_TUNNELS = 'konnectivity_network_proxy_agent_open_server_connections';

interface Watched {
  name: string;
  healthPort: number;
  kanal: boolean;
}

async function tunnels(a: Watched): Promise<number> {
  return (await scrapeMetrics(a.healthPort).catch(() => new Map<string, number>())).get(OPEN_TUNNELS) ?? 0;
}

/**
 * Polls every agent until each holds `want` tunnels; resolves with the ms each
 * took from `since`, or -1 for one that did not within `timeoutMs`.
 */
async function timesTo(agents: readonly Watched[], want: number, since: number, timeoutMs: number): Promise<number[]> {
  const took = agents.map(() => -1);
  const deadline = since + timeoutMs;
  while (Date.now() < deadline && took.some((ms) => ms < 0)) {
    const counts = await Promise.all(agents.map((a) => tunnels(a)));
    counts.forEach((n, i) => {
      if (took[i] < 0 && n === want) took[i] = Date.now() - since;
    });
    await sleep(50);
  }
  return took;
}

function report(agents: readonly Watched[], took: readonly number[]): string {
  return agents.map((a, i) => `${a.name} ${took[i] < 0 ? 'never' : `${took[i]} ms`}`).join(', ');
}

test('behind one balancer address every agent holds all three tunnels within seconds, at a cold start and after a restart', async (t) => {
  t.timeout(120_000);
  const ws = await makeWorkspace(t);
  const extraArgs = ['--server-count', String(SERVERS)];
  const servers: KanalServerProcess[] = [];
  for (const name of ['server-a', 'server-b', 'server-c']) servers.push(await startServer(t, ws, { name, extraArgs }));
  const lbPort = await roundRobin(t, () => servers.map((s) => s.agentPort));
  const lb = { agentPort: lbPort };

  const started = Date.now();
  const upstreamMissing = upstreamUnavailableReason();
  const agents: Watched[] = await Promise.all([
    ...['node-1', 'node-2', 'node-3'].map(async (agentID) => {
      const a = await startAgent(t, ws, lb, { agentID, extraArgs: SYNC });
      return { name: agentID, healthPort: a.healthPort, kanal: true };
    }),
    ...(upstreamMissing
      ? []
      : [
          startUpstreamAgent(t, ws, lb, { agentID: 'upstream-node', extraArgs: UPSTREAM_SYNC }).then((a) => ({
            name: 'upstream-node',
            healthPort: a.healthPort,
            kanal: false,
          })),
        ]),
  ]);
  if (upstreamMissing) t.log(`no upstream agent beside them: ${upstreamMissing}`);
  const kanalOnly = (took: number[]): number[] => took.filter((_, i) => agents[i].kanal);

  // Cold start: from spawning the agents (process start included) to three tunnels each.
  const cold = await timesTo(agents, SERVERS, started, 30_000);
  t.log(`cold start to ${SERVERS} tunnels: ${report(agents, cold)}`);
  // Reached at all within the bounded wait (a start includes the processes' own, which load stretches): -1 is never.
  for (const ms of kanalOnly(cold)) t.true(ms >= 0, `cold start: ${report(agents, cold)}`);

  // One server restarts: every agent is back on it within a few seconds of it listening again.
  t.is(await servers[2].stop('SIGTERM'), 0);
  const down = await timesTo(agents, SERVERS - 1, Date.now(), 10_000);
  t.true(
    kanalOnly(down).every((ms) => ms >= 0),
    `every agent lost its tunnel to server-c: ${report(agents, down)}`,
  );
  // Long enough for a growing back-off to have grown (before the fix: landing on a held server doubled it).
  await sleep(3000);
  servers[2] = await restartServer(t, servers[2]);
  const back = await timesTo(agents, SERVERS, Date.now(), 40_000);
  t.log(`after the restart (from /healthz of the restarted server) to ${SERVERS} tunnels: ${report(agents, back)}`);
  for (const ms of kanalOnly(back)) t.true(ms >= 0 && ms <= 3000, `after the restart: ${report(agents, back)}`);
});
