/**
 * Stopping, through the real CLI (docs/operations.md): a stdout nobody
 * reads (reader gone, or not reading) never keeps a process from exiting on
 * SIGTERM; a planned stop is logged at info with "stopped" as its last line;
 * connections on the node listeners do not hold the agent past its grace
 * period; no DEP0123 warning when the server is named by an IP.
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import {
  freePort,
  kanalCommand,
  logTail,
  loopbackServerArgs,
  makeWorkspace,
  nodeListener,
  readLog,
  startAgent,
  startProxy,
  waitHealthy,
  withPortRetry,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { killOnExit } from '../../kit/launch/exit-cleanup.js';
import type { ReadinessSubject } from '../../kit/launch/kanal-cli.js';

/** Longest a stop may take here (the grace periods below are 1 s). */
const EXIT_BOUND_MS = 10_000;

/** A piped `kanal`; as a ReadinessSubject its log is its stderr, where a listener it cannot bind is named (EADDRINUSE). */
interface PipedKanal extends ReadinessSubject {
  child: ChildProcess;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>;
  /** Closes the only read end of the process's stdout (as `head -5` does when it exits). */
  closeReader(): void;
}

/**
 * `kanal ...args` with stdout a FIFO (a real pipe, 64 KiB) whose only reader
 * is this test, which never reads it; stderr to a file. Not a kit Child,
 * which sends stdout to its log file. A retried start gets fresh files.
 */
function spawnPiped(t: ExecutionContext, ws: Workspace, name: string, args: string[]): PipedKanal {
  let stem = name;
  for (let n = 2; fs.existsSync(path.join(ws.dir, `${stem}.stdout`)); n++) stem = `${name}-${n}`;
  const fifo = path.join(ws.dir, `${stem}.stdout`);
  const logFile = path.join(ws.dir, `${stem}.stderr`);
  execFileSync('mkfifo', [fifo]);
  let reader: number | undefined = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  const writer = fs.openSync(fifo, 'w');
  const err = fs.openSync(logFile, 'a');
  const [program, ...rest] = kanalCommand();
  const child = spawn(program, [...rest, ...args], { stdio: ['ignore', writer, err] });
  fs.closeSync(writer);
  fs.closeSync(err);
  const pid = child.pid!;
  killOnExit.add(pid);
  let ended: string | undefined;
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((resolve) =>
    child.once('exit', (code, signal) => {
      killOnExit.delete(pid);
      ended = signal ? `was killed by ${signal}` : `exited with ${code}`;
      resolve({ code, signal, at: Date.now() });
    }),
  );
  const closeReader = (): void => {
    if (reader !== undefined) fs.closeSync(reader);
    reader = undefined;
  };
  t.teardown(async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await exited;
    }
    closeReader();
  });
  const ownLog = (): string => {
    try {
      return fs.readFileSync(logFile, 'utf8');
    } catch {
      return '';
    }
  };
  return {
    child,
    exited,
    closeReader,
    name: stem,
    pid,
    logFile,
    ended: () => ended,
    ownLog,
    tail: (lines = 15) => logTail(logFile, lines),
  };
}

/**
 * spawnPiped on fresh freePort() ports until `url` answers 200 from the
 * process's own listener (waitHealthy); withPortRetry starts again when another
 * test file's process took a port meanwhile. A failed attempt is killed first.
 */
async function startPiped<A extends { args: string[] }>(
  t: ExecutionContext,
  ws: Workspace,
  name: string,
  prepare: () => Promise<A>,
  url: (a: A) => string,
): Promise<{ p: PipedKanal; a: A }> {
  return withPortRetry(async () => {
    const a = await prepare();
    const p = spawnPiped(t, ws, name, a.args);
    try {
      await waitHealthy(p, url(a), 20_000);
    } catch (err) {
      p.child.kill('SIGKILL');
      await p.exited;
      throw err;
    }
    return { p, a };
  });
}

async function serverArgs(ws: Workspace): Promise<{ args: string[]; agentPort: number; healthPort: number }> {
  const [agentPort, healthPort] = [await freePort(), await freePort()];
  const { pki } = ws;
  const args = [
    ...loopbackServerArgs({ pki, agentPort, healthPort }),
    '--uds-name',
    path.join(ws.dir, 'piped.sock'),
    '--delete-existing-uds-file',
    '--log-level',
    'debug',
  ];
  return { args, agentPort, healthPort };
}

async function agentArgs(
  ws: Workspace,
  agentPort: number,
  agentID: string,
  extra: string[] = [],
): Promise<{ args: string[]; healthPort: number }> {
  const healthPort = await freePort();
  const own = await issueAgentCertificate(ws.pki, agentID);
  const args = [
    'agent',
    '--proxy-server-host',
    '127.0.0.1',
    '--proxy-server-port',
    String(agentPort),
    '--ca-cert',
    ws.pki.caCert,
    '--agent-cert',
    own.cert,
    '--agent-key',
    own.key,
    '--agent-id',
    agentID,
    '--health-bind-address',
    '127.0.0.1',
    '--health-server-port',
    String(healthPort),
    '--shutdown-grace-period',
    '1s',
    '--log-level',
    'debug',
    ...extra,
  ];
  return { args, healthPort };
}

/** SIGTERM, then the time until exit (fails the test beyond EXIT_BOUND_MS, killing the process). */
async function stopWithin(t: ExecutionContext, p: PipedKanal, what: string): Promise<number> {
  const t0 = Date.now();
  p.child.kill('SIGTERM');
  const exit = await Promise.race([p.exited, sleep(EXIT_BOUND_MS).then(() => undefined)]);
  if (!exit) {
    p.child.kill('SIGKILL');
    await p.exited;
    t.fail(`${what}: still running ${EXIT_BOUND_MS} ms after SIGTERM (needed SIGKILL)`);
    return NaN;
  }
  t.is(exit.code, 0, `${what} exit code`);
  return exit.at - t0;
}

for (const reader of ['gone', 'stalled'] as const) {
  test(`stdout ${reader === 'gone' ? 'closed by its reader (kanal ... | head -5)' : 'never read (a full pipe)'}: SIGTERM still ends server and agent`, async (t) => {
    const ws = await makeWorkspace(t);
    const { p: server, a: s } = await startPiped(
      t,
      ws,
      'server',
      () => serverArgs(ws),
      (s) => `http://127.0.0.1:${s.healthPort}/healthz`,
    );
    const { p: agent, a } = await startPiped(
      t,
      ws,
      'agent',
      () => agentArgs(ws, s.agentPort, 'piped-agent'),
      (a) => `http://127.0.0.1:${a.healthPort}/readyz`,
    );
    if (reader === 'stalled') {
      // More warn lines (refused requests) than the 64 KiB pipe holds.
      for (const port of [s.healthPort, a.healthPort]) {
        for (let i = 0; i < 8; i++) await Promise.all(Array.from({ length: 100 }, () => garbageRequest(port)));
      }
    }
    // The agent first (it drains to the server), then the server. A reader that
    // goes away does so just before the signal, as `head` does after its lines:
    // the lines of the stop are the first to meet EPIPE.
    if (reader === 'gone') agent.closeReader();
    const agentMs = await stopWithin(t, agent, 'agent');
    if (reader === 'gone') server.closeReader();
    const serverMs = await stopWithin(t, server, 'server');
    t.log(`agent exited ${agentMs} ms after SIGTERM, server ${serverMs} ms`);
  });
}

/** A malformed HTTP request to a health port: logged at warn, answered 400. */
function garbageRequest(port: number): Promise<void> {
  return new Promise<void>((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('error', () => resolve());
    s.on('close', () => resolve());
    s.on('data', () => undefined);
    s.end('NOT HTTP AT ALL\r\n\r\n');
    setTimeout(() => s.destroy(), 5000).unref();
  });
}

test('a planned stop logs "tunnel down" at info and "kanal agent stopped" last; a server stop is not a planned loss', async (t) => {
  const { ws, server, agent } = await startProxy(t);
  const sent = Date.now();
  t.is(await agent.stop('SIGTERM'), 0);
  const exitedAt = Date.now();
  const lines = agent.logLines();
  const down = lines.filter((l) => l.msg === 'tunnel down');
  t.deepEqual(
    down.map((l) => l.level),
    ['info'],
    'one tunnel down, at info',
  );
  const last = lines[lines.length - 1];
  t.is(last.msg, 'kanal agent stopped');
  t.log(
    `SIGTERM -> "stopped" ${Date.parse(String(last.time)) - sent} ms, SIGTERM -> exit ${exitedAt - sent} ms (measured by the test, not asserted)`,
  );

  // An unplanned loss (the server goes away) is still a warning.
  const other = await startAgent(t, ws, server, { agentID: 'agent-2' });
  t.is(await server.stop('SIGTERM'), 0);
  const lost = await other.waitForLog((l) => l.msg === 'tunnel down', 10_000, 'tunnel down');
  t.is(lost.level, 'warn');
});

test('open node-listener connections do not hold the agent past its grace period', async (t) => {
  // A destination that accepts and never answers: the connections stay open until someone closes them.
  const held = new Set<net.Socket>();
  const silent = net.createServer((s) => {
    held.add(s);
    s.on('error', () => undefined);
  });
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => {
    for (const s of held) s.destroy();
    silent.close();
  });
  const destination = `127.0.0.1:${(silent.address() as net.AddressInfo).port}`;
  const listener = await nodeListener({ host: '127.0.0.2', destination });
  const { agent } = await startProxy(t, {
    server: { extraArgs: ['--allowed-destination', destination] },
    agents: [{ extraArgs: listener.args }],
    ready: 'agents-ready',
  });
  const clients = await Promise.all(Array.from({ length: 3 }, () => listener.connect()));
  t.teardown(() => clients.forEach((c) => c.destroy()));
  const deadline = Date.now() + 10_000;
  while (held.size < 3 && Date.now() < deadline) await sleep(50);
  t.is(held.size, 3, 'three connections reached the destination through the tunnel');

  const sent = Date.now();
  const stopping = agent.stop('SIGTERM');
  const exit = await Promise.race([agent.exited, sleep(EXIT_BOUND_MS).then(() => undefined)]);
  if (!exit) t.fail(`agent still running ${EXIT_BOUND_MS} ms after SIGTERM with a 1 s grace period`);
  t.is(await stopping, 0);
  t.log(`agent exited ${Date.now() - sent} ms after SIGTERM (grace period 1 s, 3 node connections open)`);
  t.true(agent.logLines().some((l) => l.msg === 'grace period over; closing remaining connections'));
});

test('no DEP0123 (TLS ServerName set to an IP): grpc-js and h2 agents naming the server by IP, and --tls-server-name', async (t) => {
  const { agents } = await startProxy(t, {
    agents: [
      { agentID: 'ip-grpc-js', extraArgs: ['--transport', 'grpc-js'] },
      { agentID: 'ip-h2', extraArgs: ['--tls-server-name', '127.0.0.1'] },
      { agentID: 'ip-grpc-js-name', extraArgs: ['--transport', 'grpc-js', '--tls-server-name', '127.0.0.1'] },
    ],
    ready: 'agents-ready',
  });
  for (const a of agents) {
    t.is(await a.stop('SIGTERM'), 0);
    const text = fs.readFileSync(a.logFile, 'utf8');
    t.false(text.includes('DEP0123'), `${a.name}: ${text.split('\n').find((l) => l.includes('DEP0123'))}`);
    t.true(
      readLog(a.logFile).some((l) => l.msg === 'tunnel up'),
      `${a.name} had a tunnel up`,
    );
  }
});
