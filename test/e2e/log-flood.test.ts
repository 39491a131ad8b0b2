/**
 * A peer cannot flood the server's log (docs/frontends.md), measured on the real
 * CLI as log bytes and lines per refusal: oversized addresses and agentIDs
 * are cut (or refused outright), and refusals are logged once per interval
 * per peer and reason, then counted. The count of what was held back is
 * logged when the window ends, or at stop.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import * as grpc from '@grpc/grpc-js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { PacketType } from '../../src/wire/packet.js';
import {
  connectUnix,
  makeWorkspace,
  readLog,
  sendGarbage,
  startServer,
  waitMetrics,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { ProxyStream } from '../helpers/e2e-grpc-client.js';
import { agentServiceStream } from '../helpers/agent-service-stream.js';

const MiB = 1 << 20;
const HUGE_ADDRESS = `${'a'.repeat(MiB)}:443`;

function logSize(server: KanalServerProcess): number {
  return fs.statSync(server.logFile).size;
}

/** An agent on the agent port with its own certificate, asking for node -> control plane dials. */
async function nodeAgent(t: ExecutionContext, ws: Workspace, server: KanalServerProcess, agentID: string): Promise<ProxyStream> {
  return agentServiceStream(t, {
    ws,
    server,
    credential: await issueAgentCertificate(ws.pki, 'flooding-node'),
    metadata: { agentid: agentID, 'kanal-features': 'node-dial' },
    channelOptions: { 'grpc.max_send_message_length': 8 * MiB, 'grpc.max_metadata_size': MiB },
  });
}

async function answers(stream: ProxyStream, n: number, timeoutMs: number): Promise<string[]> {
  const deadline = Date.now() + timeoutMs;
  const got = (): string[] => stream.pending().flatMap((p) => (p.type === PacketType.DIAL_RSP ? [p.error] : []));
  while (got().length < n && Date.now() < deadline) await sleep(50);
  return got();
}

test('node -> control plane refusals: 20 dials to a 1 MiB address and 2,000 more to refused destinations write a few short lines, and a count at stop', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'refusals', extraArgs: ['--max-message-size', String(4 * MiB), '--log-level', 'info'] });
  const agent = await nodeAgent(t, ws, server, 'flooding-node');
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  const before = { bytes: logSize(server), lines: readLog(server.logFile).length };
  const started = Date.now();

  const sent: Promise<void>[] = [];
  for (let i = 1; i <= 20; i++)
    sent.push(agent.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: HUGE_ADDRESS, random: BigInt(i) }));
  for (let i = 1; i <= 2000; i++)
    sent.push(agent.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: `10.0.0.1:${i}`, random: BigInt(1000 + i) }));
  await Promise.all(sent);
  const errors = await answers(agent, 2020, 30_000);
  t.is(errors.length, 2020, 'every dial answered');
  t.true(errors.every((e) => /is not allowed by the proxy server$/.test(e)));
  t.true(Math.max(...errors.map((e) => e.length)) < 200, 'the refusal sent back quotes the address cut short');
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="destination_not_allowed"}': 2020 }, 10_000);

  const bytes = logSize(server) - before.bytes;
  const lines = readLog(server.logFile).slice(before.lines);
  // A loaded machine may take longer than one 10 s window: each window allows a refusal line and
  // its count, and the same for the tunnel's "dial failed".
  const windows = Math.floor((Date.now() - started) / 10_000) + 1;
  t.log(`2,020 refused node dials (20 of them to a 1 MiB address) in ${windows} window(s): ${bytes} bytes, ${lines.length} lines of log`);
  t.true(lines.filter((l) => l.msg.startsWith('refused node dial')).length <= 2 * windows, 'a refusal line and its count per window');
  t.true(lines.length <= 4 * windows, lines.map((l) => l.msg).join('\n'));
  t.true(
    lines.every((l) => JSON.stringify(l).length < 2048),
    'no line longer than 2 KiB',
  );

  // Every refusal is in the log, as a line or in a count; the last count comes at the latest at stop.
  await server.stop();
  const refusals = readLog(server.logFile).filter((l) => l.refusal === 'destination_not_allowed');
  // Fields hold what they are named for: the agent refused, not a network peer.
  t.true(
    refusals.every((l) => l.peer === undefined && l.agentID === 'flooding-node' && typeof l.credential === 'string'),
    JSON.stringify(refusals[0]),
  );
  const logged = refusals.filter((l) => l.suppressed === undefined).length;
  const counted = refusals.reduce((n, l) => n + (typeof l.suppressed === 'number' ? l.suppressed : 0), 0);
  t.is(logged + counted, 2020);
});

test('an agentID longer than any host name is refused; a long legal one is carried whole, and lines stay short', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'agent-ids', extraArgs: ['--log-level', 'info'] });
  const before = logSize(server);
  const huge = await nodeAgent(t, ws, server, 'x'.repeat(60_000));
  const status = await huge.status;
  t.is(status.code, grpc.status.INVALID_ARGUMENT);
  t.is(status.details, 'agentID is 60000 characters long; at most 253 are accepted');
  const refusal = await server.waitForLog((l) => l.msg === 'refused agent stream: agentID too long', 5000, 'agentID refusal');
  t.is(refusal.length, 60_000);
  t.true(logSize(server) - before < 2048, 'the refusal does not quote the agentID');

  const longest = 'n'.repeat(253);
  const legal = await nodeAgent(t, ws, server, longest);
  await legal.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: '10.0.0.1:1', random: 1n });
  t.is((await answers(legal, 1, 10_000)).length, 1);
  const connected = await server.waitForLog((l) => l.msg === 'agent connected', 5000, 'agent connected');
  t.is(connected.agentID, longest);
  t.true(readLog(server.logFile).every((l) => JSON.stringify(l).length < 4096));
});

test('frontend refusals: a 1 MiB gRPC dial address, 2,000 non-CONNECT requests and 200 failed TLS handshakes stay a few short lines', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, {
    name: 'frontend-refusals',
    extraArgs: ['--max-message-size', String(4 * MiB), '--log-level', 'info'],
  });
  const before = { bytes: logSize(server), lines: readLog(server.logFile).length };
  const started = Date.now();

  const stream = new ProxyStream(`unix://${server.uds}`, { channelOptions: { 'grpc.max_send_message_length': 8 * MiB } });
  t.teardown(() => stream.cancel());
  const dial = await stream.dial(HUGE_ADDRESS);
  t.is(dial.connectID, 0);
  t.regex(dial.error, /^bad address: address "a+…\[\d+ more chars\]" is 1048580 characters long; no host:port is longer than 259$/);
  stream.close();

  for (let batch = 0; batch < 2000; batch += 100) {
    await Promise.all(
      Array.from({ length: 100 }, async () => {
        const s = await connectUnix(server.uds);
        s.on('error', () => undefined);
        s.resume();
        s.end('GET / HTTP/1.1\r\nHost: x\r\n\r\n');
        await new Promise<void>((resolve) => {
          s.once('end', resolve);
          s.once('close', resolve);
        });
        s.destroy();
      }),
    );
  }
  for (let i = 0; i < 200; i++) await sendGarbage(server.agentPort, Buffer.from([0x16, 0x03, 0x01, 0x00, 0x05, 0, 0, 0, 0, 0, 0, 0]));
  await waitMetrics(
    server.healthPort,
    {
      'kanal_refusals_total{reason="frontend_bad_address"}': 1,
      'kanal_refusals_total{reason="frontend_method"}': 2000,
      'kanal_refusals_total{reason="agent_tls_handshake"}': 200,
    },
    10_000,
  );
  const bytes = logSize(server) - before.bytes;
  const lines = readLog(server.logFile).slice(before.lines);
  const windows = Math.floor((Date.now() - started) / 10_000) + 1;
  t.log(
    `1 oversized gRPC dial, 2,000 non-CONNECT requests, 200 failed handshakes in ${windows} window(s): ${bytes} bytes, ${lines.length} lines of log`,
  );
  // The oversized dial's two lines, then per window a line and a count for each of the two floods.
  t.true(lines.length <= 2 + 4 * windows, lines.map((l) => l.msg).join('\n'));
  t.true(
    lines.every((l) => JSON.stringify(l).length < 2048),
    'no line longer than 2 KiB',
  );
});

test('agent stream refusals are rate-limited like the others: 100 streams with a too-long agentID from one peer are counted 100 times and logged once', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'agent-refusals', extraArgs: ['--log-level', 'info'] });
  for (let i = 0; i < 100; i++) {
    const refused = await nodeAgent(t, ws, server, 'x'.repeat(300));
    t.is((await refused.status).code, grpc.status.INVALID_ARGUMENT);
    refused.cancel();
  }
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="agent_metadata"}': 100 }, 10_000);
  const lines = readLog(server.logFile).filter((l) => l.msg === 'refused agent stream: agentID too long');
  t.is(lines.length, 1, 'one line for the peer and reason within the interval');
});
