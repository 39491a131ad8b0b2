/**
 * A connection that breaks looks broken (docs/frontends.md, "How a
 * connection ends"): when its tunnel is lost under a transfer and not
 * resumed, the CONNECT
 * client (mTLS TCP) and the backend on the node side each get a reset
 * (ECONNRESET), never the clean FIN that makes a transfer ended by its close
 * look complete; the gRPC frontend gets CLOSE_RSP with an error that says
 * why. A transfer that finishes still ends with a FIN both ways and every
 * byte intact.
 *
 * Each check is made where only Kanal's code can decide: the end whose
 * process stays alive, with nothing left unread in its socket (a process that
 * dies, or a close with bytes unread, makes the kernel reset by itself).
 */
import test, { type ExecutionContext } from 'ava';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import tls from 'node:tls';
import { httpConnect } from '../../kit/demo/proxy-client.js';
import { PacketType } from '../../src/wire/packet.js';
import {
  frontendProxyStream,
  readExactly,
  receiveAtLeast,
  sha256,
  startProxy,
  waitMetrics,
  writeAll,
  type KanalServerProcess,
  type Scope,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { firehose, listenBackend } from '../helpers/backends.js';

/** A CONNECT through the server's mTLS TCP frontend, with the KAS's certificate. */
async function connectOverTls(server: KanalServerProcess, ws: Workspace, address: string): Promise<tls.TLSSocket> {
  const { pki } = ws;
  const s = await new Promise<tls.TLSSocket>((resolve, reject) => {
    const c = tls.connect({
      host: '127.0.0.1',
      port: server.frontendPort,
      servername: 'localhost',
      ca: fs.readFileSync(pki.frontendCaCert),
      cert: fs.readFileSync(pki.frontendClientCert),
      key: fs.readFileSync(pki.frontendClientKey),
      ALPNProtocols: ['http/1.1'],
    });
    c.once('secureConnect', () => resolve(c));
    c.once('error', reject);
  });
  await httpConnect(s, address);
  return s;
}

/** How a socket ended: 'end' (a FIN, then its close) or the error code it failed with. */
function endingOf(s: net.Socket, timeoutMs: number): Promise<string> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(`still open after ${timeoutMs} ms`), timeoutMs);
    const done = (how: string): void => {
      clearTimeout(timer);
      resolve(how);
    };
    s.once('end', () => done('end'));
    s.once('error', (err: NodeJS.ErrnoException) => done(err.code ?? err.message));
    s.once('close', () => done('close'));
  });
}

interface RecordingBackend {
  address: string;
  /** How each accepted socket ended, in order (filled as they end). */
  endings: Promise<string>[];
}

/** A backend that does `serve` with each socket and records how the socket ended. */
async function recordingBackend(scope: Scope, serve: (s: net.Socket) => void): Promise<RecordingBackend> {
  const endings: Promise<string>[] = [];
  const { address } = await listenBackend(scope, (s) => {
    endings.push(endingOf(s, 60_000));
    serve(s);
  });
  return { address, endings };
}

/** Reads and drops everything; writes nothing. */
function sink(s: net.Socket): void {
  s.resume();
}

/** The ending of the backend's `i`th connection, once it was accepted (bounded wait). */
async function acceptedEnding(backend: RecordingBackend, i: number, timeoutMs: number): Promise<{ ending: Promise<string> }> {
  const started = Date.now();
  for (;;) {
    // Wrapped: an async function returning the promise itself would wait for the ending.
    if (backend.endings.length > i) return { ending: backend.endings[i] };
    if (Date.now() - started > timeoutMs) throw new Error(`no connection ${i} at the backend within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * A server with an mTLS TCP frontend and one agent. A lost tunnel's connections wait this long
 * for a resume on both sides (--resume-timeout; a killed peer never resumes): the reset comes after.
 */
const RESUME_TIMEOUT = '1s';

function tcpProxy(t: ExecutionContext, name: string) {
  return startProxy(t, {
    server: { name, frontend: 'tcp', extraArgs: ['--resume-timeout', RESUME_TIMEOUT] },
    agents: [{ agentID: `${name}-agent`, extraArgs: ['--resume-timeout', RESUME_TIMEOUT] }],
  });
}

test('agent SIGKILLed under a download: the CONNECT client gets ECONNRESET, the gRPC client a CLOSE_RSP with the error', async (t) => {
  const { ws, server, agent } = await tcpProxy(t, 'agent-killed');
  const backend = await recordingBackend(t, firehose);
  const s = await connectOverTls(server, ws, backend.address);
  t.teardown(() => void s.destroy());
  const clientEnding = endingOf(s, 30_000);
  // The client only reads: its end at the server has nothing unread, so only a reset by Kanal can make it a reset.
  await receiveAtLeast(s, 4 * 1024 * 1024, 15_000);

  const stream = frontendProxyStream(t, server, ws);
  const dial = await stream.dial(backend.address);
  t.is(dial.error, '');
  await stream.take(PacketType.DATA, (p) => p.connectID === dial.connectID, 10_000);

  const killedAt = Date.now();
  await agent.kill();
  t.is(await clientEnding, 'ECONNRESET', 'the CONNECT client sees the break as a reset, not a FIN');
  t.log(`CONNECT client reset ${Date.now() - killedAt} ms after SIGKILL`);
  const closed = await stream.take(PacketType.CLOSE_RSP, (p) => p.connectID === dial.connectID, 30_000);
  t.regex(closed.error, /tunnel closed/, 'the gRPC frontend says the connection failed, and why');
  t.log(`gRPC client: CLOSE_RSP error ${JSON.stringify(closed.error)}`);
  stream.close();
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 0, kanal_server_pending_dials: 0 }, 10_000);
});

test('server SIGKILLed under an upload: the backend on the node side gets ECONNRESET', async (t) => {
  const { ws, server } = await tcpProxy(t, 'server-killed');
  const backend = await recordingBackend(t, sink);
  const s = await connectOverTls(server, ws, backend.address);
  s.on('error', () => undefined);
  t.teardown(() => void s.destroy());
  // The backend only reads: the agent's socket to it has nothing unread, so only a reset by Kanal can make it a reset.
  const upload = writeAll(s, randomBytes(8 * 1024 * 1024)).catch(() => undefined);
  const { ending: backendEnding } = await acceptedEnding(backend, 0, 10_000);
  await new Promise((r) => setTimeout(r, 300));

  const killedAt = Date.now();
  await server.kill();
  t.is(await backendEnding, 'ECONNRESET', 'the backend sees the break as a reset, not a FIN');
  t.log(`backend reset ${Date.now() - killedAt} ms after SIGKILL`);
  s.destroy();
  await upload;
});

test('a backend that resets: the CONNECT client gets ECONNRESET, the gRPC client a CLOSE_RSP with the error', async (t) => {
  const { ws, server } = await tcpProxy(t, 'backend-reset');
  // Sends 1 MiB, then resets.
  const backend = await recordingBackend(t, (b) => {
    b.resume();
    b.write(Buffer.alloc(1024 * 1024, 'r'), () => setTimeout(() => b.resetAndDestroy(), 200));
  });
  const s = await connectOverTls(server, ws, backend.address);
  t.teardown(() => void s.destroy());
  const clientEnding = endingOf(s, 30_000);
  s.resume();
  t.is(await clientEnding, 'ECONNRESET', "the backend's reset reaches the client as a reset");

  const stream = frontendProxyStream(t, server, ws);
  const dial = await stream.dial(backend.address);
  t.is(dial.error, '');
  const closed = await stream.take(PacketType.CLOSE_RSP, (p) => p.connectID === dial.connectID, 30_000);
  t.regex(closed.error, /ECONNRESET/, 'CLOSE_RSP names the error');
  stream.close();
});

test('a transfer that finishes ends with a FIN both ways, every byte intact', async (t) => {
  const { ws, server } = await tcpProxy(t, 'clean');
  const request = randomBytes(8 * 1024 * 1024);
  const response = randomBytes(8 * 1024 * 1024);
  // Reads the request to its end, then answers with its sha256 and the response, then its FIN.
  const backend = await recordingBackend(t, (b) => {
    const hash = createHash('sha256');
    b.on('data', (c: Buffer) => hash.update(c));
    b.once('end', () => {
      b.write(hash.digest('hex'));
      writeAll(b, response).then(
        () => b.end(),
        () => b.destroy(),
      );
    });
  });
  const s = await connectOverTls(server, ws, backend.address);
  t.teardown(() => void s.destroy());
  const answer = readExactly(s, 64 + response.length, 60_000);
  await writeAll(s, request);
  s.end();
  const got = await answer;
  const clientEnding = endingOf(s, 10_000);
  s.resume();
  t.is(got.subarray(0, 64).toString('latin1'), sha256(request), 'the backend got every byte of the request');
  t.is(sha256(got.subarray(64)), sha256(response), 'the client got every byte of the response');
  t.is(await clientEnding, 'end', 'the client gets a FIN');
  t.is(await (await acceptedEnding(backend, 0, 1000)).ending, 'end', 'the backend got a FIN');
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 0 }, 10_000);
});
