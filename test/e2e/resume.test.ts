/**
 * Resume with real processes (docs/protocol.md, "Resume"): a TCP relay the
 * test controls sits between agent and server (loopback, real TLS). Reset
 * or black-holed, the tunnel's connections wait and carry on with every
 * byte once and in order; cut for longer than --resume-timeout, or with the
 * server restarted, they end with a reset and nothing is left behind.
 */
import test, { type ExecutionContext } from 'ava';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  connectThrough,
  logTail,
  makeWorkspace,
  restartServer,
  startAgent,
  startEchoBackend,
  startServer,
  waitClosed,
  waitMetrics,
  type Backend,
  type KanalAgentProcess,
  type KanalServerProcess,
  type Scope,
} from '../helpers/kanal-processes.js';
import { startTcpRelay, type TcpRelay } from '../helpers/tcp-relay.js';
import { startUpstreamAgent, upstreamUnavailableReason } from '../helpers/upstream.js';

/** PINGs that notice a black hole in seconds on both sides. */
const FAST_KEEPALIVE = ['--keepalive-time', '1s', '--keepalive-timeout', '3s'];

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

interface Setup {
  server: KanalServerProcess;
  agent: KanalAgentProcess;
  relay: TcpRelay;
}

async function setup(t: ExecutionContext, resumeTimeout = '20s'): Promise<Setup> {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: [...FAST_KEEPALIVE, '--resume-timeout', resumeTimeout] });
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const agent = await startAgent(
    t,
    ws,
    { agentPort: relay.port },
    { agentID: 'node-1', extraArgs: [...FAST_KEEPALIVE, '--resume-timeout', resumeTimeout] },
  );
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  return { server, agent, relay };
}

/** Waits until the server has taken `n` resumes in total. */
async function resumes(s: Setup, n: number, timeoutMs = 20_000): Promise<void> {
  await waitMetrics(s.server.healthPort, { 'kanal_resumes_total{result="resumed"}': n }, timeoutMs);
}

/** A backend that writes "line N\n" every `everyMs` until the client goes (a `kubectl logs -f`). */
async function startLineBackend(scope: Scope, everyMs: number): Promise<Backend> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    let n = 0;
    const timer = setInterval(() => s.write(`line ${n++}\n`), everyMs);
    s.on('error', () => undefined);
    s.once('close', () => {
      clearInterval(timer);
      sockets.delete(s);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(() => new Promise<void>((resolve) => (sockets.forEach((s) => s.destroy()), server.close(() => resolve()))));
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => 0, open: () => sockets.size };
}

/** A backend keeping a counter per connection: each "inc\n" answers the new value (an interactive session's state). */
async function startCounterBackend(scope: Scope): Promise<Backend> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    let n = 0;
    let buf = '';
    s.setEncoding('utf8');
    s.on('data', (d: string) => {
      buf += d;
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        buf = buf.slice(i + 1);
        s.write(`${++n}\n`);
      }
    });
    s.on('error', () => undefined);
    s.once('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(() => new Promise<void>((resolve) => (sockets.forEach((s) => s.destroy()), server.close(() => resolve()))));
  const port = (server.address() as net.AddressInfo).port;
  return { port, address: `127.0.0.1:${port}`, accepted: () => 0, open: () => sockets.size };
}

/** Reads lines from `s` as they come. */
function lineReader(s: net.Socket): { lines: string[]; next(timeoutMs: number): Promise<string> } {
  const lines: string[] = [];
  let buf = '';
  let wake: (() => void) | undefined;
  s.setEncoding('utf8');
  s.on('data', (d: string) => {
    buf += d;
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      lines.push(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
    wake?.();
  });
  s.resume(); // httpConnect leaves it paused
  let taken = 0;
  return {
    lines,
    async next(timeoutMs) {
      const deadline = Date.now() + timeoutMs;
      while (taken >= lines.length) {
        if (Date.now() > deadline) throw new Error(`no line within ${timeoutMs} ms`);
        await Promise.race([new Promise<void>((resolve) => (wake = resolve)), sleep(100)]);
      }
      return lines[taken++];
    },
  };
}

test('64 MiB each way through an echo cross three resets of the path, byte-exact', async (t) => {
  const s = await setup(t);
  const backend = await startEchoBackend(t);
  const socket = await connectThrough(s.server, backend.address);
  const data = randomBytes(64 * 1024 * 1024);
  const hash = createHash('sha256');
  let received = 0;
  const done = new Promise<void>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      hash.update(c);
      received += c.length;
      if (received >= data.length) resolve();
    });
    socket.once('error', reject);
    socket.once('close', () => (received >= data.length ? resolve() : reject(new Error(`closed after ${received} bytes`))));
  });
  socket.resume(); // httpConnect leaves it paused
  const writing = (async () => {
    for (let off = 0; off < data.length; off += 256 * 1024) {
      if (!socket.write(data.subarray(off, off + 256 * 1024))) await new Promise((r) => socket.once('drain', r));
    }
  })();
  for (const [i, at] of [8, 24, 40].entries()) {
    while (received < at * 1024 * 1024) await sleep(5);
    s.relay.cut();
    await resumes(s, i + 1);
  }
  await writing;
  await done;
  t.is(received, data.length);
  t.is(hash.digest('hex'), sha(data));
  socket.destroy();
  const m = await waitMetrics(s.server.healthPort, { kanal_resume_detached_tunnels: 0 }, 5000);
  t.true((m.get('kanal_resume_replayed_bytes_total') ?? 0) >= 0);
  t.is(m.get('kanal_server_agents'), 1);
});

test('a slow line-by-line stream and an interactive session carry on across resets: no line lost or repeated, state kept', async (t) => {
  const s = await setup(t);
  const lineBackend = await startLineBackend(t, 20);
  const counterBackend = await startCounterBackend(t);
  const logs = lineReader(await connectThrough(s.server, lineBackend.address));
  const shellSocket = await connectThrough(s.server, counterBackend.address);
  const shell = lineReader(shellSocket);
  const answers: string[] = [];
  const ask = async (): Promise<void> => {
    shellSocket.write('inc\n');
    answers.push(await shell.next(20_000));
  };
  await ask();
  await ask();
  await sleep(200);
  s.relay.cut();
  await ask(); // sent while the tunnel is down or resuming: answered once it is back
  await resumes(s, 1);
  await sleep(200);
  s.relay.cut();
  await resumes(s, 2);
  await ask();
  t.deepEqual(answers, ['1', '2', '3', '4'], 'the session kept its state');
  await sleep(300);
  const lines = logs.lines.slice();
  t.true(lines.length > 20);
  t.deepEqual(
    lines,
    lines.map((_, i) => `line ${i}`),
    'every line once, in order',
  );
});

test('a black-holed path (no FIN, no RST): liveness notices on both sides, and after restore the connection resumes', async (t) => {
  const s = await setup(t);
  const counterBackend = await startCounterBackend(t);
  const socket = await connectThrough(s.server, counterBackend.address);
  const shell = lineReader(socket);
  socket.write('inc\n');
  t.is(await shell.next(10_000), '1');
  s.relay.blackhole();
  const at = Date.now();
  await s.agent.waitForLog((l) => l.msg.startsWith('tunnel lost'), 15_000, 'the agent notices the dead tunnel');
  const agentNoticed = Date.now() - at;
  await s.server.waitForLog((l) => l.msg.startsWith('agent tunnel lost'), 15_000, 'the server notices it');
  socket.write('inc\n');
  s.relay.restore();
  await resumes(s, 1);
  t.is(await shell.next(10_000), '2');
  t.log(`agent noticed the black hole after ${agentNoticed} ms (keepalive 1s/3s)`);
  t.true(agentNoticed < 10_000);
});

test('cut longer than --resume-timeout: the node side is reset, nothing is left behind', async (t) => {
  const s = await setup(t, '2s');
  // The pod's end of the connection, and how it ended (the frontend here is a Unix socket, which has no reset: docs/frontends.md).
  const ends: string[] = [];
  const pods = new Set<net.Socket>();
  const pod = net.createServer((c) => {
    pods.add(c);
    c.pipe(c);
    c.once('error', (e: NodeJS.ErrnoException) => ends.push(e.code ?? e.message));
    c.once('end', () => ends.push('clean end'));
    c.once('close', () => pods.delete(c));
  });
  await new Promise<void>((resolve) => pod.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => new Promise<void>((resolve) => (pods.forEach((c) => c.destroy()), pod.close(() => resolve()))));
  const socket = await connectThrough(s.server, `127.0.0.1:${(pod.address() as net.AddressInfo).port}`);
  socket.on('error', () => undefined);
  socket.resume();
  socket.write('hello');
  while (pods.size === 0) await sleep(20);
  const fdsBefore = fs.readdirSync(`/proc/${s.server.pid}/fd`).length;
  s.relay.blackhole();
  await s.server.waitForLog((l) => l.msg.startsWith('agent tunnel not resumed in time'), 20_000, 'the server gives up');
  await s.agent.waitForLog((l) => l.msg.startsWith('tunnel not resumed'), 20_000, 'the agent gives up too');
  while (pods.size > 0) await sleep(20);
  t.deepEqual(ends, ['ECONNRESET'], 'the pod sees a reset, not a clean end');
  await waitMetrics(s.server.healthPort, { kanal_resume_detached_tunnels: 0, kanal_server_connections_open: 0 }, 5000);
  await waitMetrics(s.server.healthPort, { 'kanal_resumes_total{result="expired"}': 1 }, 5000);
  s.relay.restore();
  await waitMetrics(s.server.healthPort, { kanal_server_agents: 1 }, 20_000);
  const fdsAfter = fs.readdirSync(`/proc/${s.server.pid}/fd`).length;
  t.true(fdsAfter <= fdsBefore, `server fds ${fdsBefore} -> ${fdsAfter}`);
});

test('server restarted instead of a cut: the connections close promptly, not at the resume timeout', async (t) => {
  const s = await setup(t, '60s');
  const echo = await startEchoBackend(t);
  const socket = await connectThrough(s.server, echo.address);
  socket.on('error', () => undefined);
  t.is(echo.open(), 1);
  await s.server.kill();
  const at = Date.now();
  await restartServer(t, s.server);
  // The agent learns the server lost the tunnel as soon as it reaches it again: not 60 s later.
  while (echo.open() > 0 && Date.now() - at < 20_000) await sleep(50);
  t.is(echo.open(), 0);
  t.log(`backend connection closed ${Date.now() - at} ms after the server was killed`);
  await s.agent.waitForLog((l) => l.msg.startsWith('server no longer holds the tunnel'), 5000, 'the agent says why');
});

test('an upstream agent (no resume) through the same path: a reset ends its connections at once, as before', async (t) => {
  const why = upstreamUnavailableReason();
  if (why) {
    t.log(`skipped: ${why}`);
    t.pass();
    return;
  }
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: [...FAST_KEEPALIVE, '--resume-timeout', '20s'] });
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  await startUpstreamAgent(t, ws, { agentPort: relay.port }, { agentID: 'upstream-node' });
  await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'upstream-node', 15_000, 'the upstream agent connected');
  const echo = await startEchoBackend(t);
  const socket = await connectThrough(server, echo.address);
  socket.on('error', () => undefined);
  socket.resume();
  const at = Date.now();
  relay.cut();
  await server.waitForLog(
    (l) => l.msg === 'agent disconnected' && l.agentID === 'upstream-node',
    10_000,
    'the tunnel closed, not detached',
  );
  while (echo.open() > 0 && Date.now() - at < 10_000) await sleep(50);
  t.is(echo.open(), 0, 'the node side closed too');
  const m = await waitMetrics(server.healthPort, { kanal_server_connections_open: 0 }, 5000);
  t.is(m.get('kanal_resume_detached_total') ?? 0, 0);
});

test('an agent killed and started again: its new process closes the old connections at once, not at the timeout', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: [...FAST_KEEPALIVE, '--resume-timeout', '60s'] });
  const agent = await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: ['--resume-timeout', '60s'] });
  const echo = await startEchoBackend(t);
  const socket = await connectThrough(server, echo.address);
  socket.on('error', () => undefined);
  socket.resume();
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 1 }, 5000);
  await agent.kill();
  await server.waitForLog((l) => l.msg.startsWith('agent tunnel lost'), 10_000, 'the server keeps the connection for a resume');
  const at = Date.now();
  await startAgent(t, ws, server, { agentID: 'node-1', extraArgs: ['--resume-timeout', '60s'] }).catch((err: Error) => {
    // The agent's log says what it met; the server's says why, if it is the server's doing.
    throw new Error(`${err.message}\nserver (${server.ended() ?? 'running'}):\n${logTail(server.logFile, 30)}`);
  });
  await server.waitForLog(
    (l) => l.msg === 'closed the detached tunnels of a restarted agent',
    10_000,
    'the new process ends the old tunnel',
  );
  await waitClosed(socket, 10_000, 'the old connection closes after the new process started');
  const ms = Date.now() - at;
  // Closed by the new process (the log line above), not by the 60 s resume timeout: the event, not the time, says so.
  t.log(`old connection closed ${ms} ms after the new agent started`);
  const after = await waitMetrics(server.healthPort, { kanal_resume_detached_tunnels: 0, kanal_server_connections_open: 0 }, 5000);
  t.is(after.get('kanal_resume_detached_tunnels'), 0, 'no tunnel left detached for a resume');
});

test('three servers by name, each path cut in turn: the agent resumes on the same server every time, connections intact', async (t) => {
  const ws = await makeWorkspace(t);
  const counter = await startCounterBackend(t);
  const servers: KanalServerProcess[] = [];
  const relays: TcpRelay[] = [];
  for (const name of ['server-a', 'server-b', 'server-c']) {
    const server = await startServer(t, ws, { name, extraArgs: [...FAST_KEEPALIVE, '--server-count', '3'] });
    servers.push(server);
    relays.push(await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort }));
  }
  // startAgent names the first relay (--proxy-server-host 127.0.0.1 --proxy-server-port); the others by host:port.
  const hosts = relays.slice(1).flatMap((r) => ['--proxy-server-host', `127.0.0.1:${r.port}`]);
  await startAgent(t, ws, { agentPort: relays[0].port }, { agentID: 'node-1', extraArgs: [...FAST_KEEPALIVE, ...hosts] });
  for (const s of servers) await waitMetrics(s.healthPort, { kanal_server_agents: 1 }, 10_000);
  const shells = await Promise.all(
    servers.map(async (s) => {
      const socket = await connectThrough(s, counter.address);
      return { socket, lines: lineReader(socket) };
    }),
  );
  for (const [i, relay] of relays.entries()) {
    for (const shell of shells) shell.socket.write('inc\n');
    relay.cut();
    await waitMetrics(servers[i].healthPort, { 'kanal_resumes_total{result="resumed"}': 1 }, 20_000);
  }
  for (const shell of shells) shell.socket.write('inc\n');
  for (const [i, shell] of shells.entries()) {
    const answers = [];
    for (let n = 0; n < relays.length + 1; n++) answers.push(await shell.lines.next(10_000));
    t.deepEqual(answers, ['1', '2', '3', '4'], `the session through ${servers[i].name} kept its state`);
  }
  for (const s of servers) {
    const m = await waitMetrics(s.healthPort, { kanal_server_agents: 1, kanal_resume_detached_tunnels: 0 }, 5000);
    t.is(m.get('kanal_resumes_total{result="refused"}') ?? 0, 0, `${s.name}: every resume came to the server that held the tunnel`);
  }
});

test('100 cuts of the path under traffic: every byte echoed once, and fds and tables back to where they started', async (t) => {
  const s = await setup(t);
  const echo = await startEchoBackend(t);
  const socket = await connectThrough(s.server, echo.address);
  const fds = (pid: number): number => fs.readdirSync(`/proc/${pid}/fd`).length;
  const hash = createHash('sha256');
  let received = 0;
  socket.on('data', (c: Buffer) => {
    hash.update(c);
    received += c.length;
  });
  socket.resume();
  const sentHash = createHash('sha256');
  let sent = 0;
  const send = (n: number): void => {
    const chunk = randomBytes(n);
    sentHash.update(chunk);
    sent += n;
    socket.write(chunk);
  };
  send(1000);
  while (received < sent) await sleep(10);
  const before = { server: fds(s.server.pid), agent: fds(s.agent.pid) };
  for (let i = 0; i < 100; i++) {
    send(20_000 + (i % 5) * 7000);
    s.relay.cut();
    await resumes(s, i + 1, 10_000);
  }
  const deadline = Date.now() + 10_000;
  while (received < sent && Date.now() < deadline) await sleep(20);
  t.is(received, sent);
  t.is(hash.digest('hex'), sentHash.digest('hex'), 'every byte once, in order');
  const m = await waitMetrics(s.server.healthPort, { kanal_resume_detached_tunnels: 0, kanal_server_connections_open: 1 }, 5000);
  t.is(m.get('kanal_resumes_total{result="refused"}') ?? 0, 0);
  socket.destroy();
  await waitMetrics(s.server.healthPort, { kanal_server_connections_open: 0 }, 5000);
  // A relay pair per cut came and went: the processes hold what they held before (a little slack for a reconnect in flight).
  const after = { server: fds(s.server.pid), agent: fds(s.agent.pid) };
  t.log(`fds before/after 100 resumes: server ${before.server}/${after.server}, agent ${before.agent}/${after.agent}`);
  t.true(after.server <= before.server + 1, `server fds ${before.server} -> ${after.server}`);
  t.true(after.agent <= before.agent + 1, `agent fds ${before.agent} -> ${after.agent}`);
});
