/**
 * Reply amplification (docs/limits.md): a peer that sends packets which make
 * us answer (CLOSE_REQ for unknown connectIDs) and never reads the answers.
 * Every reply obeys the stream's back-pressure: past a bounded queue the
 * flooded side stops reading, then closes the stream after
 * --peer-read-timeout, logs and counts it; memory stays bounded and other
 * agents keep working. Both transports, both sides, real processes.
 */
import test from 'ava';
import fs from 'node:fs';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { PacketType } from '../../src/wire/packet.js';
import {
  echoesThrough,
  echoRoundTrip,
  makeWorkspace,
  nodeListener,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startProxy,
  startServer,
  warnLine,
} from '../helpers/kanal-processes.js';
import { openFloodingPeer, startFloodingServer, streamsAnswered } from '../helpers/flooding-peer.js';

/**
 * What a flood may add to a process's RSS in the first seconds, by transport.
 * Unbounded it grew by ≈ 100 MiB a second; bounded, h2 adds 10-25 MiB. grpc-js
 * decodes what it reads into arrays of messages before Kanal can stop reading:
 * on Node 26 that garbage lands in V8's new large-object space (16.8 MiB of it
 * at the peak in a heap reading; a snapshot's full GC finds none of it alive)
 * and a flooded grpc-js agent peaks 59-100 MiB above its start (Node 20: 47-54).
 * The bound that matters is the plateau below: once reading stops, nothing more
 * is taken in, and the next collection returns the garbage.
 */
const RSS_BUDGET_MIB: Record<string, number> = { h2: 64, 'grpc-js': 128 };
/** Once reading has stopped RSS stays put: the last second after the pause may rise at most this much above the peak before it. */
const PLATEAU_MIB = 8;
const FLOOD_SAMPLE_MS = 2000;

function rssMiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}

/**
 * Samples `pid`'s RSS every 100 ms from now until `paused` (reading stopped,
 * as the process logs it; at most 30 s) and `ms` after it: the highest, and
 * how far the last second rose above the peak before it. Measured from the
 * pause, not from a fixed time a loaded machine may not give the process.
 */
async function peakRss(pid: number, paused: Promise<unknown>, ms: number): Promise<{ peak: number; lastSecondRise: number }> {
  const samples: { at: number; mib: number }[] = [];
  let pausedAt: number | undefined;
  void paused.then(
    () => (pausedAt = Date.now()),
    () => (pausedAt = Date.now()),
  );
  for (const deadline = Date.now() + 30_000 + ms; Date.now() < deadline; await sleep(100)) {
    samples.push({ at: Date.now(), mib: rssMiB(pid) });
    if (pausedAt !== undefined && Date.now() >= pausedAt + ms) break;
  }
  await paused;
  const end = samples[samples.length - 1].at;
  const before = Math.max(...samples.filter((s) => s.at < end - 1000).map((s) => s.mib));
  const last = Math.max(...samples.filter((s) => s.at >= end - 1000).map((s) => s.mib));
  return { peak: Math.max(before, last), lastSecondRise: last - before };
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  return Promise.race([p, sleep(ms).then(() => Promise.reject(new Error(`not within ${ms} ms: ${what}`)))]);
}

const closeRequests = (i: number) => ({ type: PacketType.CLOSE_REQ, connectID: 1001 + 2 * i }) as const;

for (const transport of ['h2', 'grpc-js']) {
  test.serial(
    `server (${transport}): an agent that floods CLOSE_REQ and never reads is not read from, then closed; memory stays bounded and another agent keeps working`,
    async (t) => {
      t.timeout(90_000);
      const echo = await startEchoBackend(t);
      const listener = await nodeListener({ host: '127.0.0.2', destination: echo.address });
      const { ws, server } = await startProxy(t, {
        server: { extraArgs: ['--transport', transport, '--peer-read-timeout', '3s', '--allowed-destination', echo.address] },
        agents: [{ agentID: 'node-1', extraArgs: ['--transport', transport, ...listener.args] }],
      });
      const cred = await issueAgentCertificate(ws.pki, 'flooder');
      const flooder = openFloodingPeer({ agentPort: server.agentPort, cert: { ...cred, ca: ws.pki.caCert }, agentID: 'flooder' });
      t.teardown(() => flooder.destroy());
      t.is(await flooder.accepted, 200);
      const baseline = rssMiB(server.pid);

      flooder.flood(closeRequests);
      const paused = server.waitForLog(
        warnLine('peer does not read what we send', (l) => l.agentID === 'flooder'),
        30_000,
        'reading paused',
      );
      const { peak, lastSecondRise } = await peakRss(server.pid, paused, FLOOD_SAMPLE_MS);
      t.log(`server RSS: ${baseline.toFixed(0)} MiB before, ${peak.toFixed(0)} MiB at most while flooded by ${flooder.sent()} packets`);
      t.true(peak - baseline < RSS_BUDGET_MIB[transport], `RSS grew by ${(peak - baseline).toFixed(0)} MiB`);
      t.true(lastSecondRise <= PLATEAU_MIB, `RSS still rising ${lastSecondRise.toFixed(0)} MiB in the last second after reading paused`);

      // Both directions keep working for the other agent meanwhile.
      for (let i = 0; i < 5; i++) {
        t.true(await echoesThrough(server, echo.address, randomBytes(64 * 1024)), 'control plane -> node');
        const n = await listener.connect();
        t.true(await echoRoundTrip(n, randomBytes(64 * 1024)), 'node -> control plane');
        n.destroy();
      }

      const closed = await server.waitForLog(
        warnLine('closing stream: the peer does not read', (l) => l.agentID === 'flooder'),
        10_000,
        'flooder closed',
      );
      t.is(closed.flag, '--peer-read-timeout');
      t.regex(await within(flooder.closed, 10_000, 'the flooder sees its stream closed'), /closed/);
      const m = await scrapeMetrics(server.healthPort);
      t.true((m.get('kanal_stream_read_pauses_total{reason="peer_not_reading"}') ?? 0) >= 1);
      t.is(m.get('kanal_streams_closed_total{reason="peer_not_reading"}'), 1);
      t.is(m.get('kanal_server_agents'), 1, 'the flooder is gone, node-1 stays');
      t.true(rssMiB(server.pid) - baseline < RSS_BUDGET_MIB[transport]);
    },
  );

  test.serial(
    `agent (${transport}): a server that floods CLOSE_REQ and never reads is not read from, then closed; memory stays bounded`,
    async (t) => {
      t.timeout(90_000);
      const ws = await makeWorkspace(t);
      const hostile = await startFloodingServer({ cert: ws.pki.serverCert, key: ws.pki.serverKey }, closeRequests);
      t.teardown(() => hostile.close());
      const agent = await startAgent(
        t,
        ws,
        { agentPort: hostile.port },
        { agentID: 'node-1', extraArgs: ['--transport', transport, '--peer-read-timeout', '3s'] },
      );
      await hostile.accepted;
      const baseline = rssMiB(agent.pid);
      hostile.flood();
      const paused = agent.waitForLog(warnLine('peer does not read what we send'), 30_000, 'reading paused');
      const { peak, lastSecondRise } = await peakRss(agent.pid, paused, FLOOD_SAMPLE_MS);
      t.log(`agent RSS: ${baseline.toFixed(0)} MiB before, ${peak.toFixed(0)} MiB at most while flooded by ${hostile.sent()} packets`);
      t.true(peak - baseline < RSS_BUDGET_MIB[transport], `RSS grew by ${(peak - baseline).toFixed(0)} MiB`);
      t.true(lastSecondRise <= PLATEAU_MIB, `RSS still rising ${lastSecondRise.toFixed(0)} MiB in the last second after reading paused`);
      await agent.waitForLog(warnLine('closing stream: the peer does not read'), 10_000, 'stream closed');
      await within(hostile.streamClosed, 10_000, 'the hostile server sees its stream closed');
      const m = await scrapeMetrics(agent.healthPort);
      t.is(m.get('kanal_streams_closed_total{reason="peer_not_reading"}'), 1);
    },
  );
}

for (const transport of ['h2', 'grpc-js']) {
  // The agent port allows two streams per connection (agent-identity.test.ts).
  test.serial(`server (${transport}): one frontend connection holds at most 100 streams`, async (t) => {
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws, { extraArgs: ['--transport', transport] });
    t.is(await streamsAnswered({ uds: server.uds }, 101, 3000), 100);
  });
}
