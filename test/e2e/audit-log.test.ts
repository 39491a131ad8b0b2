/**
 * The audit log on real processes (docs/operations.md, "The audit log: what
 * a line says"): one line per ended connection, per dial that made none and
 * per refused peer, on server and agent, checked field by field against what
 * the test did; the two sides' lines of one connection share dialID and connectID.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoRoundTrip,
  freePort,
  nodeListener,
  readToEnd,
  startAgent,
  startEchoBackend,
  startProxy,
  startSourceBackend,
  waitClosed,
  waitUntil,
  type Scope,
} from '../helpers/kanal-processes.js';
import { httpConnect } from '../helpers/in-process.js';
import { frontendProxyStream } from '../helpers/frontend-clients.js';
import { PacketType } from '../../src/wire/packet.js';
import type { AuditRecord, ConnectionRecord, DialRecord, RefusalRecord } from '../../src/audit/audit-record.js';

/** Every record of an audit log file so far. */
function records(file: string): AuditRecord[] {
  if (!fs.existsSync(file)) return [];
  return fs
    .readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as AuditRecord);
}

/** The records of `file` that `match` accepts once there are `n` (the writer is asynchronous). */
async function waitRecords<R extends AuditRecord>(file: string, what: string, match: (r: AuditRecord) => r is R, n = 1): Promise<R[]> {
  let found: R[] = [];
  await waitUntil(() => (found = records(file).filter(match)).length >= n, `${n} ${what} in ${path.basename(file)}`, 10_000);
  return found;
}

const connectionTo =
  (destination: string) =>
  (r: AuditRecord): r is ConnectionRecord =>
    r.event === 'connection' && r.destination === destination;
const dialTo =
  (destination: string) =>
  (r: AuditRecord): r is DialRecord =>
    r.event === 'dial' && r.destination === destination;
const refusal = (r: AuditRecord): r is RefusalRecord => r.event === 'refused';

/** A server and agent `node-1`, each with an audit log in a temp dir of the scope. */
async function start(scope: Scope, o: { serverArgs?: string[]; agentArgs?: string[] } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-audit-'));
  scope.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const serverLog = path.join(dir, 'server-audit.log');
  const agentLog = path.join(dir, 'agent-audit.log');
  const proxy = await startProxy(scope, {
    server: { extraArgs: ['--audit-log-path', serverLog, ...(o.serverArgs ?? [])] },
    agents: [{ agentID: 'node-1', extraArgs: ['--audit-log-path', agentLog, ...(o.agentArgs ?? [])] }],
    ready: 'every-agent',
  });
  return { ...proxy, serverLog, agentLog };
}

/** A CONNECT through the server's Unix socket, its status and socket (closed by the scope). */
async function connect(scope: Scope, uds: string, address: string): Promise<{ status: number; socket: net.Socket }> {
  const reply = await httpConnect(uds, address);
  scope.teardown(() => void reply.socket.destroy());
  reply.socket.on('error', () => undefined);
  return reply;
}

test('a connection the kube-apiserver ends: both lines, one ID, who asked, bytes, duration, closedBy client', async (t) => {
  const echo = await startEchoBackend(t);
  const { server, serverLog, agentLog } = await start(t);
  const { status, socket } = await connect(t, server.uds, echo.address);
  t.is(status, 200);
  t.true(await echoRoundTrip(socket, randomBytes(1000)));
  await sleep(200);
  socket.end();
  await waitClosed(socket, 10_000);

  const [s] = await waitRecords(serverLog, 'connection', connectionTo(echo.address));
  t.like(s, {
    auditVersion: 1,
    side: 'server',
    event: 'connection',
    direction: 'cp_to_node',
    agent: { id: 'node-1' },
    client: { address: `unix:${server.uds}`, uid: process.getuid?.(), pid: process.pid },
    dial: { result: 'ok' },
    bytes: { toDestination: 1000, toClient: 1000 },
    closedBy: 'client',
    reason: 'finished',
  });
  t.regex(String(s.agent.credential), /CN=node-1/);
  t.true(s.dial.ms > 0 && s.dial.ms < 10_000, `dial ms ${s.dial.ms}`);
  t.true(s.durationMs >= 150 && s.durationMs < 30_000, `duration ${s.durationMs}`);
  t.true(Math.abs(Date.parse(s.time) - Date.now()) < 15_000);

  const [a] = await waitRecords(agentLog, 'connection', connectionTo(echo.address));
  t.like(a, {
    auditVersion: 1,
    side: 'agent',
    dialID: s.dialID,
    connectID: s.connectID,
    direction: 'cp_to_node',
    agent: { id: 'node-1' },
    server: { id: 'server', address: `127.0.0.1:${server.agentPort}` },
    bytes: { toDestination: 1000, toClient: 1000 },
    closedBy: 'client',
  });
  t.is(a.agent.credential, undefined, 'the agent does not name its own credential');
  t.is(a.client, undefined, 'the agent does not know the kube-apiserver');
});

test('a connection the destination ends, and a dial the destination refuses: closedBy destination; dial lines on both sides share the ID', async (t) => {
  const source = await startSourceBackend(t, Buffer.from('hello, then FIN'));
  const closedPort = `127.0.0.1:${await freePort()}`;
  const { server, serverLog, agentLog } = await start(t);

  const { status, socket } = await connect(t, server.uds, source.address);
  t.is(status, 200);
  t.is((await readToEnd(socket, 10_000)).toString(), 'hello, then FIN');
  socket.end();
  const [s] = await waitRecords(serverLog, 'connection', connectionTo(source.address));
  t.like(s, { closedBy: 'destination', bytes: { toDestination: 0, toClient: 15 } });
  const [a] = await waitRecords(agentLog, 'connection', connectionTo(source.address));
  t.like(a, { dialID: s.dialID, closedBy: 'destination', bytes: { toDestination: 0, toClient: 15 } });

  t.is((await connect(t, server.uds, closedPort)).status, 502);
  const [sd] = await waitRecords(serverLog, 'failed dial', dialTo(closedPort));
  t.like(sd, { side: 'server', direction: 'cp_to_node', agent: { id: 'node-1' }, dial: { result: 'refused' } });
  t.regex(sd.dial.error, /ECONNREFUSED/);
  t.truthy(sd.dialID);
  t.is(sd.refusal, undefined, 'the far side failed it, no rule of this side');
  const [ad] = await waitRecords(agentLog, 'failed dial', dialTo(closedPort));
  t.like(ad, { side: 'agent', dialID: sd.dialID, direction: 'cp_to_node', dial: { result: 'refused' } });
});

test('an agent that never answers: the dial line says timeout after --backend-dial-timeout', async (t) => {
  const echo = await startEchoBackend(t);
  const { server, agent, serverLog } = await start(t, { serverArgs: ['--backend-dial-timeout', '500ms'] });
  agent.pause();
  t.teardown(() => agent.resume());
  t.is((await connect(t, server.uds, echo.address)).status, 504);
  const [d] = await waitRecords(serverLog, 'failed dial', dialTo(echo.address));
  t.like(d, { direction: 'cp_to_node', dial: { result: 'timeout' }, client: { address: `unix:${server.uds}` } });
  t.true(d.dial.ms >= 450, `after the timeout, not ${d.dial.ms} ms`);
});

test('node -> control plane: a connection both sides audit, and a destination off the allow-list refused', async (t) => {
  const echo = await startEchoBackend(t);
  const other = await startEchoBackend(t);
  const allowed = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  // A second target on the same advertise address, to a destination the server does not allow.
  const forbiddenPort = await freePort('127.0.0.2');
  const { serverLog, agentLog } = await start(t, {
    serverArgs: ['--allowed-destination', echo.address],
    agentArgs: [...allowed.args, '--target', `${forbiddenPort}:${other.address}`],
  });
  const s = await allowed.connect();
  t.teardown(() => void s.destroy());
  const local = `${s.localAddress}:${s.localPort}`;
  t.true(await echoRoundTrip(s, randomBytes(300)));
  s.end();
  await waitClosed(s, 10_000);
  const [a] = await waitRecords(agentLog, 'connection', connectionTo(echo.address));
  t.like(a, {
    side: 'agent',
    direction: 'node_to_cp',
    client: { address: local },
    closedBy: 'client',
    bytes: { toDestination: 300, toClient: 300 },
  });
  const [sv] = await waitRecords(serverLog, 'connection', connectionTo(echo.address));
  t.like(sv, {
    side: 'server',
    dialID: a.dialID,
    connectID: a.connectID,
    direction: 'node_to_cp',
    agent: { id: 'node-1' },
    closedBy: 'client',
  });

  const refusedTarget = net.connect({ host: '127.0.0.2', port: forbiddenPort });
  refusedTarget.on('error', () => undefined);
  t.teardown(() => void refusedTarget.destroy());
  await waitClosed(refusedTarget, 10_000);
  const [sd] = await waitRecords(serverLog, 'refused dial', dialTo(other.address));
  t.like(sd, { direction: 'node_to_cp', refusal: 'destination_not_allowed', dial: { result: 'forbidden' }, agent: { id: 'node-1' } });
  const [ad] = await waitRecords(agentLog, 'refused dial', dialTo(other.address));
  t.like(ad, { direction: 'node_to_cp', dialID: sd.dialID, dial: { result: 'forbidden' } }, "the agent gives the server's result");
  t.regex(ad.dial.error, /not allowed/);
});

test('refusals: an agent without a valid certificate, and dials over the rate each leave a line', async (t) => {
  const echo = await startEchoBackend(t);
  const { ws, server, serverLog } = await start(t, { serverArgs: ['--dial-rate-per-agent', '1', '--dial-burst-per-agent', '2'] });
  const statuses = await Promise.all(Array.from({ length: 5 }, async () => (await connect(t, server.uds, echo.address)).status));
  t.is(statuses.filter((s) => s === 503).length, 3);
  const throttled = await waitRecords(serverLog, 'throttled dials', dialTo(echo.address), 3);
  for (const d of throttled) {
    t.like(d, { refusal: 'throttled', dial: { result: 'exhausted' }, agent: { id: 'node-1' }, client: { address: `unix:${server.uds}` } });
    t.regex(d.dial.error, /faster than 1 dials\/s, burst 2 \(--dial-rate-per-agent\)/);
    t.is(d.dialID, undefined, 'refused before a DIAL_REQ');
  }

  await startAgent(t, ws, server, { agentID: 'rogue', cert: 'rogue', waitReady: false });
  const [r] = await waitRecords(serverLog, 'refused agent', refusal);
  t.like(r, { side: 'server', event: 'refused' });
  t.regex(r.refusal, /^agent_(certificate|tls_handshake)$/);
  t.regex(r.peer, /^127\.0\.0\.1:\d+$/);
});

test('a tunnel lost and not resumed in time: its connection closes with closedBy tunnel', async (t) => {
  const echo = await startEchoBackend(t);
  const { server, agent, serverLog } = await start(t, { serverArgs: ['--resume-timeout', '1s'] });
  const { status, socket } = await connect(t, server.uds, echo.address);
  t.is(status, 200);
  t.true(await echoRoundTrip(socket, randomBytes(10)));
  await agent.kill();
  const [s] = await waitRecords(serverLog, 'connection', connectionTo(echo.address));
  t.like(s, { closedBy: 'tunnel', bytes: { toDestination: 10, toClient: 10 } });
  t.regex(s.reason, /tunnel/);
});

test('the gRPC frontend: the kube-apiserver named by its Unix socket credentials, the connection it closes audited once', async (t) => {
  const echo = await startEchoBackend(t);
  const { server, serverLog } = await start(t);
  const stream = frontendProxyStream(t, server);
  const { connectID, error } = await stream.dial(echo.address);
  t.is(error, '');
  t.true(await stream.echoes(connectID, randomBytes(64), 10_000));
  await stream.send({ type: PacketType.CLOSE_REQ, connectID });
  const [s] = await waitRecords(serverLog, 'connection', connectionTo(echo.address));
  t.like(s, {
    direction: 'cp_to_node',
    client: { address: `unix:${server.uds}`, uid: process.getuid?.(), pid: process.pid },
    bytes: { toDestination: 64, toClient: 64 },
    closedBy: 'client',
  });
  await sleep(300);
  t.is(records(serverLog).filter(connectionTo(echo.address)).length, 1, 'the relay writes one line, not one per side of it');
  stream.close();
});
