// Kanal against grpc-go, the gRPC library upstream's agent, upstream's server
// and the KAS's konnectivity client are all built on (Debian's
// golang-google-grpc-dev). test/grpc-go-peer/main.go plays each of them with
// grpc-go doing all of HTTP/2 and gRPC; only the Packet encoding is its own.
//
//   1. grpc-go agent    <- Kanal server <- CONNECT (raw client) and the KAS's gRPC mode (grpc-go client)
//   2. grpc-go server   -> Kanal agent  -> echo backend (upstream's agent-port gRPC options)
//
// Megabytes go through each path so grpc-go's flow control, BDP pings and
// framing meet Kanal's, and a dial to a closed port must come back refused.

import test, { type ExecutionContext } from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { killOnExit, removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { closedPort, waitFor } from '../helpers/in-process.js';
import {
  connectThrough,
  echoRoundTrip,
  logTail,
  makeWorkspace,
  startAgent,
  startEchoBackend,
  startServer,
  waitStatus,
  levelAtLeast,
  type Scope,
  type Workspace,
} from '../helpers/kanal-processes.js';

const GO = '/usr/bin/go';
const GO_PATH = '/usr/share/gocode';
const PEER_SOURCE = fileURLToPath(new URL('../../../test/grpc-go-peer/', import.meta.url));
const ECHO_BYTES = 8 * 1024 * 1024;

const goMissing = [GO, path.join(GO_PATH, 'src/google.golang.org/grpc'), path.join(GO_PATH, 'src/google.golang.org/protobuf')]
  .filter((p) => !fs.existsSync(p))
  .map((p) => `${p} not found (scripts/setup.sh installs golang-go, golang-google-grpc-dev and golang-google-protobuf-dev)`)[0];
if (goMissing) skippedBecause('grpc-go interop tests', goMissing);
const goTest = goMissing ? test.skip : test.serial;

let buildDir = '';
let peerBinary = '';

test.before(async () => {
  if (goMissing) return;
  buildDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-grpc-go-'));
  removeOnExit.add(buildDir);
  peerBinary = path.join(buildDir, 'grpc-go-peer');
  // Debian's Go libraries live in a GOPATH, not in a module cache.
  const env = { ...process.env, GO111MODULE: 'off', GOPATH: GO_PATH, GOCACHE: path.join(buildDir, 'cache'), GOFLAGS: '' };
  await new Promise<void>((resolve, reject) =>
    execFile(GO, ['build', '-o', peerBinary, '.'], { cwd: PEER_SOURCE, env, timeout: 300_000 }, (err, _out, stderr) =>
      err ? reject(new Error(`go build failed: ${stderr || err.message}`)) : resolve(),
    ),
  );
});

test.after.always(() => {
  if (buildDir) fs.rmSync(buildDir, { recursive: true, force: true });
  removeOnExit.delete(buildDir);
});

type PeerEvent = Record<string, unknown> & { event: string };

interface Peer {
  /** Resolves with the first event named `name` (fails on timeout or exit). */
  next(name: string, timeoutMs?: number): Promise<PeerEvent>;
  stderr(): string;
}

/** Starts the Go peer; its stdout is one JSON event per line. Killed at teardown. */
function startPeer(scope: Scope, args: string[]): Peer {
  const child = spawn(peerBinary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const pid = child.pid!;
  killOnExit.add(pid);
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  const events: PeerEvent[] = [];
  const waiters = new Set<() => void>();
  readline.createInterface({ input: child.stdout }).on('line', (line) => {
    events.push(JSON.parse(line) as PeerEvent);
    for (const w of waiters) w();
  });
  let exited = false;
  child.once('exit', () => {
    exited = true;
    killOnExit.delete(pid);
    for (const w of waiters) w();
  });
  scope.teardown(() => {
    if (!exited) child.kill('SIGKILL');
  });
  return {
    stderr: () => stderr,
    next: (name, timeoutMs = 30_000) =>
      new Promise<PeerEvent>((resolve, reject) => {
        const check = (): void => {
          const found = events.find((e) => e.event === name);
          if (found || exited) {
            clearTimeout(timer);
            waiters.delete(check);
            if (found) resolve(found);
            else reject(new Error(`grpc-go peer exited before "${name}"; events ${JSON.stringify(events)}; stderr: ${stderr}`));
          }
        };
        const timer = setTimeout(() => {
          waiters.delete(check);
          reject(
            new Error(`no "${name}" from the grpc-go peer within ${timeoutMs} ms; events ${JSON.stringify(events)}; stderr: ${stderr}`),
          );
        }, timeoutMs);
        waiters.add(check);
        check();
      }),
  };
}

function tlsArgs(ws: Workspace, role: 'agent' | 'server'): string[] {
  const { pki } = ws;
  return role === 'agent'
    ? ['-ca', pki.caCert, '-cert', pki.agentCert, '-key', pki.agentKey]
    : ['-ca', pki.caCert, '-cert', pki.serverCert, '-key', pki.serverKey];
}

async function withLogs<T>(t: ExecutionContext, logs: string[], fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    t.log(logs.map((f) => `--- ${path.basename(f)}\n${logTail(f, 30)}`).join('\n'));
    throw err;
  }
}

goTest('a grpc-go agent carries CONNECT and gRPC-mode dials from a Kanal server; a dial to a closed port is refused', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const echo = await startEchoBackend(t);
  const agent = startPeer(t, [
    '-mode',
    'agent',
    '-addr',
    `127.0.0.1:${server.agentPort}`,
    '-agent-id',
    'go-agent',
    ...tlsArgs(ws, 'agent'),
  ]);
  let closed = 0;
  await withLogs(t, [server.logFile], async () => {
    const connected = await agent.next('connected');
    t.deepEqual(connected.serverID, ['server'], 'the Kanal server named itself in the response headers');
    await waitStatus(server.readyzUrl(), 200, 10_000);

    // HTTP CONNECT over the Unix socket, as the KAS's http-connect mode does.
    const s = await connectThrough(server, echo.address);
    t.true(await echoRoundTrip(s, randomBytes(ECHO_BYTES), 60_000), 'CONNECT: every byte came back through the grpc-go agent');
    s.destroy();

    // The KAS's gRPC mode: a grpc-go client, one Proxy stream per dial; the
    // streams end with CloseSend and status OK, or (single-use, as the KAS
    // does) by closing the whole gRPC connection after CLOSE_RSP.
    for (const mode of [[], ['-single-use']]) {
      const client = startPeer(t, [
        '-mode',
        'client',
        '-uds',
        server.uds,
        '-target',
        echo.address,
        '-bytes',
        String(ECHO_BYTES),
        '-dials',
        '51',
        ...mode,
      ]);
      const echoed = await client.next('echoed', 60_000);
      t.is(echoed.bytes, ECHO_BYTES);
      const dials = await client.next('dials', 60_000);
      t.is(dials.count, 50);
      t.log(
        `grpc-go client${mode.join('')} -> Kanal server -> grpc-go agent: ${Number(echoed.mbPerSec).toFixed(0)} MB/s echoed; 50 dials p50 ${String(dials.p50ms)} ms, p99 ${String(dials.p99ms)} ms`,
      );
    }

    closed = await closedPort();
    const refused = startPeer(t, ['-mode', 'client', '-uds', server.uds, '-target', `127.0.0.1:${closed}`, '-bytes', '0']);
    const failure = await refused.next('dial failed');
    t.regex(String(failure.error), /dial refused: .*connection refused/);
  });
  await waitFor(() => echo.open() === 0, 'every backend connection closed', 5_000);
  t.is(echo.open(), 0, 'every tunnelled connection to the backend was closed');
  // Log lines reach the file up to 10 ms late (they share writes: log-destination.ts).
  await server.waitForLog((l) => levelAtLeast(l.level, 'warn') && l.msg === 'dial failed', 10_000, 'the dial failure warning');
  // This process's lines only: a start retried on a taken port (withPortRetry) appends to the same file after the failed one's.
  const lines = server.logLines();
  const started = lines.map((l) => l.msg).lastIndexOf('kanal server started');
  const warnings = lines.slice(Math.max(0, started)).filter((l) => levelAtLeast(l.level, 'warn'));
  t.deepEqual(
    warnings.map((l) => `${l.msg} ${String(l.address)}`),
    [`dial failed 127.0.0.1:${closed}`],
    "the refused dial was the server's only warning: streams cancelled with their connection are routine",
  );
});

goTest(
  "a Kanal agent serves dials from a grpc-go server with upstream's agent-port options; a dial to a closed port is refused",
  async (t) => {
    const ws = await makeWorkspace(t);
    const echo = await startEchoBackend(t);
    const goServer = startPeer(t, ['-mode', 'server', '-target', echo.address, '-bytes', String(ECHO_BYTES), ...tlsArgs(ws, 'server')]);
    const listening = await goServer.next('listening');
    const agent = await startAgent(t, ws, { agentPort: Number(listening.port) }, { agentID: 'kanal-agent' });
    await withLogs(t, [agent.logFile], async () => {
      const hello = await goServer.next('agent connected');
      t.deepEqual(hello.agentID, ['kanal-agent']);
      const echoed = await goServer.next('echoed', 60_000);
      t.is(echoed.bytes, ECHO_BYTES);
      t.log(`grpc-go server -> Kanal agent: ${Number(echoed.mbPerSec).toFixed(0)} MB/s echoed, dial ${String(echoed.dialMs)} ms`);
      const refused = await goServer.next('refused dial');
      t.regex(String(refused.error), /dial refused: .*ECONNREFUSED/);
    });
  },
);
