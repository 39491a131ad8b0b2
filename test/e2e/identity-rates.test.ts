/**
 * Rates and counts belong to the identity, not to the stream
 * (docs/trust-model.md, docs/limits.md): with --dial-rate-per-agent an agent
 * (credential + agentID) that reconnects in a loop, announces a new agentID
 * at each reconnect, or holds two tunnels at once gets one bucket, not one
 * per stream, in both directions; another credential's agent keeps its own.
 * The agent's own --dial-rate survives its reconnects to the same server.
 * Done as the attacker does it: bare Connect streams (test/helpers/raw-agent.ts)
 * against a real `kanal server`. Each admitted count is read from the
 * server's metrics and bounded from above by burst + rate × elapsed + 1;
 * below only by the burst. Serial: the bare agents live in this process
 * and must answer the server's PINGs in time.
 */
import test from 'ava';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { GrpcStatusError } from '../../src/transport/transport.js';
import {
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startServer,
  waitMetrics,
  waitUntil,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { connectNodeDialingAgent, connectRawAgent, connectStatus, type NodeDialingAgent, type RawAgent } from '../helpers/raw-agent.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';

const RATE = 1;
const BURST = 5;
const RATE_FLAGS = ['--dial-rate-per-agent', String(RATE), '--dial-burst-per-agent', String(BURST)];
/** Not on the allow-list: an admitted node dial is answered "forbidden" at once, and counted so. */
const FORBIDDEN = '127.0.0.1:9';
/** The attack loops: at most this many reconnects, and at most this long. */
const MAX_ROUNDS = 40;
const MAX_LOOP_MS = 3000;
const THROTTLED = /^too many dials: faster than 1 dials\/s, burst 5 \(--dial-rate-per-agent\)$/;

function sum(m: Map<string, number>, prefix: string): number {
  let n = 0;
  for (const [k, v] of m) if (k.startsWith(prefix)) n += v;
  return n;
}

/** Node -> control plane dials the server let past every limit (each then refused by the allow-list). */
async function admittedNodeDials(server: KanalServerProcess): Promise<number> {
  return sum(await scrapeMetrics(server.healthPort), 'kanal_dials_total{direction="node_to_cp"');
}

async function throttled(server: KanalServerProcess): Promise<number> {
  return (await scrapeMetrics(server.healthPort)).get('kanal_refusals_total{reason="throttled"}') ?? 0;
}

/** Waits until the server holds exactly `n` agent tunnels (a closed bare stream has left the registry). */
function tunnelsHeld(server: KanalServerProcess, n: number): Promise<Map<string, number>> {
  return waitMetrics(server.healthPort, { kanal_server_agents: n }, 10_000);
}

/** The bound on dials a bucket of RATE/BURST admits in `ms`: the burst, the refill, one for rounding. */
function bound(ms: number): number {
  return BURST + Math.ceil((RATE * ms) / 1000) + 1;
}

/** Opens a stream, retrying while the server still holds the last one (a refusal is not the point here). */
async function reconnect<A extends RawAgent>(open: () => Promise<A>): Promise<A> {
  for (let i = 0; ; i++) {
    try {
      return await open();
    } catch (err) {
      if (!(err instanceof GrpcStatusError) || i >= 20) throw err;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

test.serial(
  'a node reconnecting in a loop, with its agentID or a new one each time, gets one bucket of node -> control plane dials; another node keeps its own',
  async (t) => {
    t.timeout(90_000);
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws, { extraArgs: RATE_FLAGS });
    const honest = await connectNodeDialingAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-2'), 'node-2');
    const stolen = await issueAgentCertificate(ws.pki, 'node-1');
    await tunnelsHeld(server, 1);

    let sent = 0;
    let refusedHere = 0;
    let rounds = 0;
    const started = performance.now();
    for (; rounds < MAX_ROUNDS && performance.now() - started < MAX_LOOP_MS; rounds++) {
      // Half the rounds keep the agentID, half announce a new one (the credential's bound is one agent).
      const agentID = rounds % 2 === 0 ? 'node-1' : `node-1-${rounds}`;
      const attacker = await reconnect(() => connectNodeDialingAgent(t, ws, server, stolen, agentID));
      const answers = await attacker.dialAll(Array.from({ length: 10 }, () => FORBIDDEN));
      sent += answers.length;
      refusedHere += answers.filter((a) => THROTTLED.test(a)).length;
      attacker.close();
      await tunnelsHeld(server, 1);
    }
    const elapsed = performance.now() - started;
    const admitted = await admittedNodeDials(server);
    t.log(`${rounds} reconnects in ${Math.round(elapsed)} ms: ${admitted} of ${sent} dials admitted`);
    t.true(rounds >= 4, `only ${rounds} reconnects`);
    t.true(admitted >= BURST, `the burst gets through (${admitted})`);
    t.true(admitted <= bound(elapsed), `${admitted} admitted in ${Math.round(elapsed)} ms; at most ${bound(elapsed)}`);
    t.is(admitted + refusedHere, sent, 'every dial was either admitted or refused as throttled');
    t.is(await throttled(server), refusedHere, 'each throttled dial is counted once');

    // The honest node, another credential, was not throttled meanwhile: its whole burst gets through.
    const honestAnswers = await honest.dialAll(Array.from({ length: BURST }, () => FORBIDDEN));
    t.false(
      honestAnswers.some((a) => THROTTLED.test(a) || a === 'no answer'),
      honestAnswers.join('; '),
    );
    t.is(await admittedNodeDials(server), admitted + BURST);
  },
);

test.serial('two tunnels of one agent at once share one bucket; another agent keeps its own', async (t) => {
  t.timeout(60_000);
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: RATE_FLAGS });
  const stolen = await issueAgentCertificate(ws.pki, 'node-1');
  const first = await connectNodeDialingAgent(t, ws, server, stolen, 'node-1');
  const second = await connectNodeDialingAgent(t, ws, server, stolen, 'node-1');
  const honest = await connectNodeDialingAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-2'), 'node-2');
  await tunnelsHeld(server, 3);
  const started = performance.now();
  const answers = (
    await Promise.all([first, second].map((a: NodeDialingAgent) => a.dialAll(Array.from({ length: 20 }, () => FORBIDDEN))))
  ).flat();
  const elapsed = performance.now() - started;
  const admitted = await admittedNodeDials(server);
  t.log(`two tunnels: ${admitted} of ${answers.length} dials admitted in ${Math.round(elapsed)} ms`);
  t.true(admitted >= BURST);
  t.true(admitted <= bound(elapsed), `${admitted} admitted; at most ${bound(elapsed)}`);
  t.is(answers.filter((a) => THROTTLED.test(a)).length, answers.length - admitted);
  const honestAnswers = await honest.dialAll(Array.from({ length: BURST }, () => FORBIDDEN));
  t.false(
    honestAnswers.some((a) => THROTTLED.test(a)),
    honestAnswers.join('; '),
  );
});

test.serial('control plane -> node dials to an agent reconnecting in a loop hold its rate; another agent keeps its own', async (t) => {
  t.timeout(90_000);
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: RATE_FLAGS });
  const stolen = await issueAgentCertificate(ws.pki, 'node-1');
  const agents: RawAgent[] = [];
  let statuses: number[] = [];
  let rounds = 0;
  const started = performance.now();
  for (; rounds < MAX_ROUNDS && performance.now() - started < MAX_LOOP_MS; rounds++) {
    const agent = await reconnect(() => connectRawAgent(t, ws, server, stolen, 'node-1'));
    agents.push(agent);
    await tunnelsHeld(server, 1);
    // The raw agent refuses each dial it gets (502); a throttled one never reaches it (503).
    statuses = statuses.concat(await Promise.all(Array.from({ length: 8 }, () => connectStatus(server, FORBIDDEN))));
    agent.close();
    await tunnelsHeld(server, 0);
  }
  const elapsed = performance.now() - started;
  const reached = agents.reduce((n, a) => n + a.dials(), 0);
  t.log(`${rounds} reconnects in ${Math.round(elapsed)} ms: ${reached} of ${statuses.length} CONNECTs reached the agent`);
  t.true(rounds >= 4, `only ${rounds} reconnects`);
  t.true(reached >= BURST);
  t.true(reached <= bound(elapsed), `${reached} reached the agent in ${Math.round(elapsed)} ms; at most ${bound(elapsed)}`);
  t.is(statuses.filter((s) => s === 502).length, reached);
  t.is(statuses.filter((s) => s === 503).length, statuses.length - reached);
  t.is(await throttled(server), statuses.length - reached);

  // Another node's agent has a bucket of its own: the burst reaches it.
  const honest = await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-2'), 'node-2');
  await tunnelsHeld(server, 1);
  const honestStatuses = await Promise.all(Array.from({ length: BURST }, () => connectStatus(server, FORBIDDEN)));
  t.deepEqual(honestStatuses, Array<number>(BURST).fill(502));
  t.is(honest.dials(), BURST);
});

for (const resume of ['0', '30s']) {
  test.serial(`the agent's own --dial-rate is not refilled by a reconnect to the same server (--resume-timeout ${resume})`, async (t) => {
    t.timeout(90_000);
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws);
    const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
    const agent = await startAgent(
      t,
      ws,
      { agentPort: relay.port },
      { extraArgs: ['--dial-rate', '1', '--dial-burst', String(BURST), '--resume-timeout', resume] },
    );
    await tunnelsHeld(server, 1);
    const started = performance.now();
    // The agent dials 127.0.0.1:9, which refuses; a throttled dial is refused before it is tried. Both answer 502.
    const burst = async (): Promise<void> => {
      await Promise.all(Array.from({ length: 2 * BURST }, () => connectStatus(server, FORBIDDEN)));
    };
    await burst();
    // The path breaks: the agent reconnects to the same server (its serverID is fixed), with a new tunnel or resuming its old one.
    relay.cut();
    await waitUntil(() => relay.connections() >= 2 && relay.open() >= 1, 'the agent reconnects through the relay', 20_000);
    await tunnelsHeld(server, 1);
    await burst();
    const elapsed = performance.now() - started;
    const refused = (await scrapeMetrics(agent.healthPort)).get('kanal_refusals_total{reason="throttled"}') ?? 0;
    const performed = 4 * BURST - refused;
    t.log(`across a reconnect: the agent performed ${performed} of ${4 * BURST} dials in ${Math.round(elapsed)} ms`);
    t.true(performed >= BURST);
    t.true(performed <= bound(elapsed), `${performed} performed in ${Math.round(elapsed)} ms; at most ${bound(elapsed)}`);
  });
}
