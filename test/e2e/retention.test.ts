/**
 * One node's credential cannot make the server hold more than its share
 * (docs/limits.md, "Retained bytes"), tried as an attacker does it: a raw
 * agent negotiates resume, grants credit and never acknowledges, against a
 * chargen and an echo destination it may dial (node -> control plane) and
 * for a connection the kube-apiserver dials through it (control plane ->
 * node). The server keeps at most its own window per connection and the
 * agent's cap over all of them, also once the agent cut its TCP connection
 * and its tunnel waits for a resume; credit beyond the protocol's largest
 * window closes that connection with a reason naming it; over the memory
 * budget the largest holder is shed. Meanwhile an honest agent's
 * connection keeps moving bytes. Bounds are read from /metrics, not RSS.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import {
  makeWorkspace,
  scrapeMetrics,
  startEchoBackend,
  startFirehoseBackend,
  startServer,
  tunnelThrough,
  waitMetrics,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';
import { hostileAgent, type HostileAgent } from '../helpers/hostile-resume-agent.js';
import { firehose } from '../helpers/backends.js';

const MiB = 1024 * 1024;
/** The server's own largest window (--max-connection-window's default): what one connection may keep. */
const CONNECTION_CAP = 4 * MiB;
const AGENT_CAP = 10 * MiB;

async function metric(server: KanalServerProcess, name: string): Promise<number> {
  return (await scrapeMetrics(server.healthPort)).get(name) ?? 0;
}

/** Polls until `cond` holds (bounded), returning the last value read. */
async function until<T>(read: () => Promise<T> | T, cond: (v: T) => boolean, what: string, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await read();
    if (cond(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms (last ${JSON.stringify(v)})`);
    await sleep(50);
  }
}

/** An honest agent moving bulk from `address`: returns it once it has; its bytes go on meanwhile. */
async function honestAgent(
  t: Parameters<typeof startServer>[0],
  ws: Awaited<ReturnType<typeof makeWorkspace>>,
  server: KanalServerProcess,
  address: string,
): Promise<HostileAgent> {
  const honest = await hostileAgent(t, ws, server, {
    agentID: 'honest-node',
    credential: await issueAgentCertificate(ws.pki, 'honest-node'),
    increment: 0,
    acks: true,
  });
  await honest.dial(address);
  return honest;
}

/** The honest agent receives `bytes` more from now on. */
async function movesBytes(agent: HostileAgent, bytes: number): Promise<void> {
  const from = agent.received();
  await until(
    () => agent.received(),
    (n) => n >= from + bytes,
    `the honest agent receives ${bytes} more bytes`,
  );
}

test('credit within the maximum, never acknowledged, on chargen, echo and a KAS dial: the server keeps at most the caps, also while detached; an honest agent moves on', async (t) => {
  const ws = await makeWorkspace(t);
  const chargen = await startFirehoseBackend(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, {
    name: 'retention',
    extraArgs: [
      '--allowed-destination',
      chargen.address,
      '--allowed-destination',
      echo.address,
      '--max-retained-bytes-per-agent',
      String(AGENT_CAP),
      '--proxy-strategies',
      'destHost,default',
      '--resume-timeout',
      '60s',
    ],
  });
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const hostile = await hostileAgent(
    t,
    ws,
    { agentPort: relay.port },
    {
      agentID: 'hostile-node',
      credential: await issueAgentCertificate(ws.pki, 'hostile-node'),
      // 16 MiB more at once, then credit for all that comes: credit never stops the server's sending.
      increment: 16 * MiB,
      creditAsReceived: true,
      identifiers: 'host=hostile-node.example',
    },
  );
  // Node -> control plane: chargen, and an echo of what the agent sends within the server's credit.
  const c1 = await hostile.dial(chargen.address);
  const c2 = await hostile.dial(echo.address);
  hostile.sendWithinCredit(c2.connectID, 64 * MiB);
  // Control plane -> node: the kube-apiserver writes without end to "the node", which never acknowledges.
  const kas = await tunnelThrough(t, server, 'hostile-node.example:80');
  kas.on('error', () => undefined);
  kas.resume();
  firehose(kas);
  const retained = await until(
    () => metric(server, 'kanal_server_retained_bytes'),
    (n) => n >= 2 * CONNECTION_CAP,
    'the hostile agent made the server keep bytes',
  );
  t.true(retained <= AGENT_CAP, `kept ${retained} B, within the agent cap`);
  // The three connections could keep 12 MiB: the agent's cap stops them at exactly 10.
  await until(
    () => metric(server, 'kanal_server_retained_bytes'),
    (n) => n === AGENT_CAP,
    'the agent cap is reached',
  );
  // An honest agent of the same tenant moves 32 MiB meanwhile; it keeps at most its own window (the tenant's gauge adds it).
  const honest = await honestAgent(t, ws, server, chargen.address);
  await movesBytes(honest, 32 * MiB);
  const tenantRetained = await metric(server, 'kanal_server_retained_bytes');
  t.true(tenantRetained >= AGENT_CAP && tenantRetained <= AGENT_CAP + CONNECTION_CAP, `the tenant keeps ${tenantRetained} B`);
  t.true(hostile.received() <= AGENT_CAP, `all the hostile agent ever got (${hostile.received()} B) is what the server keeps`);
  for (const c of [c1, c2]) t.true(c.received <= CONNECTION_CAP, `connection ${c.connectID} got ${c.received} B: at most one window`);
  t.is(c1.closed, undefined, 'back-pressure: nothing was closed');
  // The agent cuts its TCP connection: the detached tunnel holds no more than it did.
  relay.cut();
  await waitMetrics(server.healthPort, { kanal_resume_detached_tunnels: 1 }, 20_000);
  const m = await scrapeMetrics(server.healthPort);
  t.true((m.get('kanal_server_retained_bytes') ?? Infinity) <= AGENT_CAP + CONNECTION_CAP, 'the detached tunnel keeps at most the cap');
  t.true((m.get('kanal_resume_retained_bytes') ?? Infinity) <= AGENT_CAP + CONNECTION_CAP);
  await movesBytes(honest, 16 * MiB);
});

test("credit beyond the protocol's largest window closes that connection, named and counted; the agent's other connection and an honest agent go on", async (t) => {
  const ws = await makeWorkspace(t);
  const chargen = await startFirehoseBackend(t);
  const server = await startServer(t, ws, { name: 'window-fault', extraArgs: ['--allowed-destination', chargen.address] });
  const hostile = await hostileAgent(t, ws, server, {
    agentID: 'hostile-node',
    credential: await issueAgentCertificate(ws.pki, 'hostile-node'),
    increment: 2 ** 50,
    drain: true,
  });
  const honest = await honestAgent(t, ws, server, chargen.address);
  const c = await hostile.dial(chargen.address);
  const reason = await until(
    () => c.closed,
    (r) => r !== undefined,
    'the server closes the connection',
  );
  t.regex(reason ?? '', /beyond the protocol's largest window/);
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="window_beyond_maximum"}': 1 }, 10_000);
  t.true((await metric(server, 'kanal_server_retained_bytes')) <= CONNECTION_CAP);
  await movesBytes(honest, 32 * MiB);
  const log = fs.readFileSync(server.logFile, 'utf8');
  t.regex(log, /closing connection: peer granted credit beyond the protocol's largest window/);
});

test('over the memory budget the agent that holds the most has its connections closed with a reason naming the budget, audited; the honest agent goes on', async (t) => {
  const ws = await makeWorkspace(t);
  const chargen = await startFirehoseBackend(t);
  const auditPath = path.join(ws.dir, 'audit.log');
  const server = await startServer(t, ws, {
    name: 'budget',
    // Above what an honest connection holds (one window, 4 MiB), below what three hostile ones do.
    extraArgs: ['--allowed-destination', chargen.address, '--memory-budget', String(9 * MiB), '--audit-log-path', auditPath],
  });
  const honest = await honestAgent(t, ws, server, chargen.address);
  const hostile = await hostileAgent(t, ws, server, {
    agentID: 'hostile-node',
    credential: await issueAgentCertificate(ws.pki, 'hostile-node'),
    increment: 16 * MiB,
    creditAsReceived: true,
    drain: true,
  });
  const conns = [await hostile.dial(chargen.address), await hostile.dial(chargen.address), await hostile.dial(chargen.address)];
  for (const c of conns) {
    const reason = await until(
      () => c.closed,
      (r) => r !== undefined,
      'the server sheds the hostile connection',
    );
    t.regex(reason ?? '', /memory budget \(9437184 bytes\) is spent and this agent held the most/);
  }
  const m = await until(
    () => scrapeMetrics(server.healthPort),
    (s) => (s.get('kanal_refusals_total{reason="memory_budget"}') ?? 0) >= 1,
    'the shed is counted',
  );
  t.true((m.get('kanal_server_held_bytes') ?? Infinity) <= 9 * MiB);
  await movesBytes(honest, 32 * MiB);
  const audit = await until(
    () => (fs.existsSync(auditPath) ? fs.readFileSync(auditPath, 'utf8') : ''),
    (s) => s.includes('memory budget'),
    'the audit log has the shed connections',
  );
  const lines = audit.split('\n').filter((l) => l.includes('memory budget'));
  t.true(lines.length >= 1);
  t.true(
    lines.every((l) => l.includes('hostile-node')),
    'only the hostile agent was shed',
  );
});
