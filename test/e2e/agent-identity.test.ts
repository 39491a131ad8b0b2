/**
 * An agent is what authenticated it (docs/trust-model.md): one node's credential
 * cannot register invented agentIDs, cannot take over another credential's
 * agent by announcing its agentID, and one TLS connection cannot register
 * thousands of agents; a credential shared on purpose holds as many agents as
 * the operator allows. Real `kanal server` processes; bare Connect streams
 * (test/helpers/raw-agent.ts) where a test needs exact credentials and IDs,
 * real Kanal and upstream agents where it is about them. Serial: the bare
 * agents live in this process and must answer the server's PINGs in time.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { GrpcStatus, GrpcStatusError } from '../../src/transport/transport.js';
import {
  echoesThrough,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startProxy,
  startServer,
  waitMetrics,
  waitStatus,
  warnLine,
} from '../helpers/kanal-processes.js';
import { agentChannel, connectRawAgent, connectStatus, type RawAgent } from '../helpers/raw-agent.js';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';
import { waitFor } from '../helpers/memory-stream.js';

/** Sends `n` CONNECTs (to a port nobody dials successfully) and returns how many DIAL_REQs each raw agent saw. */
async function dialsPerAgent(server: { uds: string }, agents: RawAgent[], n: number): Promise<number[]> {
  const before = agents.map((a) => a.dials());
  for (let i = 0; i < n; i++) await connectStatus(server, '127.0.0.1:9');
  return agents.map((a, i) => a.dials() - before[i]);
}

async function refusal(t: { fail(m: string): void }, opening: Promise<RawAgent>): Promise<GrpcStatusError | undefined> {
  try {
    await opening;
    t.fail('the stream was accepted');
    return undefined;
  } catch (err) {
    if (err instanceof GrpcStatusError) return err;
    throw err;
  }
}

test.serial(
  'one credential cannot register invented agentIDs: the second is refused with the reason, a warn log and a counter',
  async (t) => {
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws);
    const honest = await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-2'), 'node-2');
    const stolen = await issueAgentCertificate(ws.pki, 'node-1');
    const first = await connectRawAgent(t, ws, server, stolen, 'node-1');
    const refusals: GrpcStatusError[] = [];
    for (let i = 0; i < 30; i++) {
      const err = await refusal(t, connectRawAgent(t, ws, server, stolen, `invented-${i}`));
      if (err) refusals.push(err);
    }
    t.is(refusals.length, 30);
    t.true(refusals.every((e) => e.code === GrpcStatus.RESOURCE_EXHAUSTED));
    t.regex(refusals[0].message, /credential CN=node-1 .*already holds 1 live agent.*--max-agents-per-credential/);
    const m = await scrapeMetrics(server.healthPort);
    t.is(m.get('kanal_refusals_total{reason="agent_credential_full"}'), 30);
    t.is(m.get('kanal_server_agent_identities'), 2);
    const warned = server.logLines().filter(warnLine('refused agent stream', (l) => l.agentID === 'invented-0'));
    t.is(warned.length, 1);
    t.regex(String(warned[0].credential), /^CN=node-1 \(issuer CN=kanal-throwaway-ca\)$/);
    // The honest node keeps its share: the stolen credential is one agent, not 31.
    const [h, s] = await dialsPerAgent(server, [honest, first], 40);
    t.is(h + s, 40);
    t.true(h >= 5, `honest node got ${h} of 40 dials`);
  },
);

test.serial('one TLS connection cannot register thousands of agents; an honest agent beside it is unaffected', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const honest = await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-2'), 'node-2');
  const credential = await issueAgentCertificate(ws.pki, 'node-1');
  const channel = agentChannel(t, ws, server, credential);
  const opened = await Promise.allSettled(
    Array.from({ length: 2000 }, (_, i) => connectRawAgent(t, ws, server, credential, `id-${i}`, channel)),
  );
  // One is admitted at a time; the rest are refused by the credential's bound or by the
  // connection's stream limit, and a connection that keeps opening refused streams is closed.
  const held = opened.filter((r) => r.status === 'fulfilled' && !r.value.stream.closed).length;
  t.true(held <= 1, `${held} held`);
  const m = await scrapeMetrics(server.healthPort);
  t.true((m.get('kanal_server_agent_identities') ?? 0) <= 2);
  t.false(honest.stream.closed);
  // Dials go to the least loaded agent, ties at random: with the one admitted abuser beside it, 20 dials
  // leave the honest agent none with probability 2^-20 (3 left it none one run in eight).
  t.true((await dialsPerAgent(server, [honest], 20))[0] > 0, 'the honest agent still gets dials');
});

test.serial('a second credential announcing the same agentID is another agent and never takes over the first', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const ownerCred = await issueAgentCertificate(ws.pki, 'node-1');
  let owner = await connectRawAgent(t, ws, server, ownerCred, 'node-1');
  const impostor = await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'attacker'), 'node-1');
  await server.waitForLog(
    warnLine('another credential announces the same agentID', (l) => String(l.credential).startsWith('CN=attacker')),
    5000,
    'the overlap is logged',
  );
  t.is((await scrapeMetrics(server.healthPort)).get('kanal_server_agent_identities'), 2);
  // The owner reconnects: its new tunnel is its own agent's, the impostor's older one is not.
  owner.close();
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 5000);
  owner = await connectRawAgent(t, ws, server, ownerCred, 'node-1');
  const [o, i] = await dialsPerAgent(server, [owner, impostor], 30);
  t.is(o + i, 30);
  t.true(o >= 3, `the owner got ${o} of 30 dials after reconnecting`);
});

test.serial('a shared credential holds up to --max-agents-per-credential agents, no more', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: ['--max-agents-per-credential', '3'] });
  const shared = { cert: ws.pki.agentCert, key: ws.pki.agentKey };
  for (let i = 0; i < 3; i++) await connectRawAgent(t, ws, server, shared, `daemonset-${i}`);
  const err = await refusal(t, connectRawAgent(t, ws, server, shared, 'daemonset-3'));
  t.is(err?.code, GrpcStatus.RESOURCE_EXHAUSTED);
  t.regex(err?.message ?? '', /already holds 3 live agent/);
  // A fourth node that holds a certificate of its own is not affected.
  await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-9'), 'node-9');
  await waitMetrics(server.healthPort, { kanal_server_agent_identities: 4 }, 5000);
});

test.serial('without authentication (--allow-unauthenticated-agents) agents are told apart by peer address', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: ['--allow-unauthenticated-agents'] });
  await connectRawAgent(t, ws, server, undefined, 'anonymous-1');
  const err = await refusal(t, connectRawAgent(t, ws, server, undefined, 'anonymous-2'));
  t.is(err?.code, GrpcStatus.RESOURCE_EXHAUSTED);
  t.regex(err?.message ?? '', /credential unauthenticated peer 127\.0\.0\.1 already holds 1 live agent/);
  // A certificate still counts as its own credential beside them.
  await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-1'), 'node-1');
  await waitMetrics(server.healthPort, { kanal_server_agent_identities: 2 }, 5000);
});

test.serial("a real agent refused for its credential logs the server's reason and keeps retrying", async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  // Both real processes: a PING to the first is answered however busy the test process is.
  await startAgent(t, ws, server, { agentID: 'first', cert: 'shared' });
  const agent = await startAgent(t, ws, server, { agentID: 'second', cert: 'shared', waitReady: false });
  const lines = await agent.waitForLog(
    warnLine('cannot connect to proxy server', (l) => /--max-agents-per-credential/.test(String(l.err))),
    15_000,
    'the refusal reason',
  );
  t.regex(String(lines.err), /already holds 1 live agent/);
  // Retries are debug lines; the warning is logged once per cause (server-tunnels.ts).
  await agent.waitForLog((l) => l.msg === 'connect attempt failed' && String(l.time) > String(lines.time), 15_000, 'a retry');
});

test.serial(
  'an agent landing again on a server it already holds (HA behind one address) keeps its first tunnel and every dial',
  async (t) => {
    const backend = await startEchoBackend(t);
    // --server-count 2 with one server: the agent keeps opening a second stream here and closing it.
    const { server, agent } = await startProxy(t, {
      server: { extraArgs: ['--server-count', '2'] },
      agents: [{ agentID: 'node-1' }],
      ready: 'agents-ready',
    });
    const duplicates = (): number =>
      agent.logLines().filter((l) => l.msg === 'already connected to this server; will retry for the others').length;
    await waitFor(() => duplicates() >= 3, 'the agent lands on this server again, three times', 20_000);
    for (let i = 0; i < 20; i++) t.true(await echoesThrough(server, backend.address, randomBytes(1024)));
    t.deepEqual(server.logLines().filter(warnLine('refused agent stream')), []);
    t.deepEqual(server.logLines().filter(warnLine('replaced')), []);
    t.is(agent.logLines().filter((l) => l.msg === 'tunnel down').length, 0);
  },
);

const upstreamMissing = upstreamUnavailableReason();
(upstreamMissing ? test.skip : test.serial)(
  'upstream agents with random UUID agentIDs, one credential each, connect and restart as before',
  async (t) => {
    const ws = await makeWorkspace(t);
    const backend = await startEchoBackend(t);
    const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect'] });
    const a = await startUpstreamAgent(t, ws, server, { agentID: 'up-a', randomAgentID: true });
    await startUpstreamAgent(t, ws, server, { agentID: 'up-b', randomAgentID: true });
    await waitMetrics(server.healthPort, { kanal_server_agent_identities: 2 }, 10_000);
    // Killed and started again: same certificate, a new random agentID, admitted at once.
    await a.kill();
    await startUpstreamAgent(t, ws, server, { agentID: 'up-a', randomAgentID: true });
    await waitMetrics(server.healthPort, { kanal_server_agent_identities: 2, kanal_server_agents: 2 }, 10_000);
    await waitStatus(server.readyzUrl(), 200, 5000);
    for (let i = 0; i < 10; i++) t.true(await echoesThrough(server, backend.address, randomBytes(4096)));
    t.deepEqual(server.logLines().filter(warnLine('refused agent')), []);
  },
);
