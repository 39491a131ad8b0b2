/**
 * A CONNECT client's FIN before its "200 Connection Established" is a
 * half-close, not a departure (docs/frontends.md, "The life of a CONNECT"):
 * a client that sends CONNECT and its request and then shuts down its write
 * side (`printf … | socat`, `nc -N`) gets its answer. Through an agent with
 * half-close the bytes, then the FIN, reach the backend after the 200; through
 * one without (upstream's) the bytes reach it and the connection closes, as
 * upstream closes on a FIN. A client that really went is still released at
 * once, on the Unix socket and on mTLS TCP; one that half-closed and then
 * left is found within a second on the Unix socket, and over TCP (where a
 * quiet close after a FIN says nothing more) when its answer is written.
 */
import test, { type ExecutionContext } from 'ava';
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { PacketType, type Packet } from '../../src/wire/packet.js';
import { Feature } from '../../src/wire/features.js';
import { MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import {
  makeWorkspace,
  scrapeMetrics,
  startProxy,
  startServer,
  waitMetrics,
  type KanalServerProcess,
  type Scope,
  type Workspace,
} from '../helpers/kanal-processes.js';
import type { ProxyStream } from '../helpers/e2e-grpc-client.js';
import { agentServiceStream } from '../helpers/agent-service-stream.js';
import { frontendConnection, type FrontendTransport } from '../helpers/frontend-clients.js';

type Transport = FrontendTransport;

const ESTABLISHED = 'HTTP/1.1 200 Connection Established\r\n\r\n';

/** A frontend client (it reads on after its own FIN): a Unix socket, or mTLS TCP with the KAS's certificate. */
async function frontendClient(server: KanalServerProcess, ws: Workspace, transport: Transport): Promise<net.Socket> {
  return (await frontendConnection(server, ws, transport)).socket;
}

/** How a socket ended, and what it received until then (bounded by timeoutMs). */
interface Ending {
  bytes: Buffer;
  /** 'end': a clean FIN; otherwise the error code, or 'timeout'. */
  how: string;
}

function ending(socket: net.Socket, timeoutMs: number): Promise<Ending> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const done = (how: string): void => {
      clearTimeout(timer);
      resolve({ bytes: Buffer.concat(chunks), how });
    };
    const timer = setTimeout(() => done('timeout'), timeoutMs);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('end', () => done('end'));
    socket.once('error', (err: NodeJS.ErrnoException) => done(err.code ?? err.message));
    socket.resume();
  });
}

/**
 * A backend that answers once the client's FIN arrives, as a program
 * reading its request to EOF does: "<bytes> <sha256>" of what it got, then
 * its own FIN.
 */
async function startAfterEofBackend(scope: Scope): Promise<{ address: string }> {
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    const hash = createHash('sha256');
    let n = 0;
    s.on('error', () => s.destroy());
    s.on('data', (c: Buffer) => {
      hash.update(c);
      n += c.length;
    });
    s.once('end', () => s.end(`${n} ${hash.digest('hex')}\n`));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  scope.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  server.on('connection', (s) => scope.teardown(() => void s.destroy()));
  return { address: `127.0.0.1:${(server.address() as net.AddressInfo).port}` };
}

function answerFor(request: Buffer): string {
  return `${request.length} ${createHash('sha256').update(request).digest('hex')}\n`;
}

/** An agent scripted by the test (upstream's agent when `features` is empty): it records what the server sends. */
async function scriptedAgent(t: ExecutionContext, ws: Workspace, server: KanalServerProcess, features: Feature[]): Promise<ProxyStream> {
  const name = `scripted-${features.join('-') || 'upstream'}`;
  const credential = await issueAgentCertificate(ws.pki, name);
  const metadata: Record<string, string> = { agentid: name };
  if (features.length > 0) metadata[MD_KANAL_FEATURES] = features.join(',');
  const agent = agentServiceStream(t, { ws, server, credential, metadata });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  return agent;
}

async function until(cond: () => boolean, what: string, timeoutMs: number): Promise<number> {
  const started = Date.now();
  while (!cond()) {
    if (Date.now() - started > timeoutMs) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await sleep(20);
  }
  return Date.now() - started;
}

function has(agent: ProxyStream, match: (p: Packet) => boolean): boolean {
  return agent.pending().some(match);
}

const REQUEST = Buffer.from('GET / HTTP/1.0\r\nHost: backend\r\n\r\n');

for (const transport of ['uds', 'tcp'] as const) {
  test(`${transport}: CONNECT, the request and a FIN in one go: the backend gets the request and the FIN, the client its answer`, async (t) => {
    const { ws, server } = await startProxy(t, { server: { name: `fin-${transport}`, frontend: transport } });
    const backend = await startAfterEofBackend(t);
    const request = Buffer.concat([REQUEST, Buffer.alloc(100_000, 'b')]);
    const results = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const s = await frontendClient(server, ws, transport);
        const got = ending(s, 15_000);
        // As `printf … | socat` does: everything, then shutdown(SHUT_WR), before any answer.
        s.end(Buffer.concat([Buffer.from(`CONNECT ${backend.address} HTTP/1.1\r\nHost: ${backend.address}\r\n\r\n`), request]));
        const r = await got;
        s.destroy();
        return r;
      }),
    );
    for (const r of results) {
      t.is(r.bytes.toString('latin1'), ESTABLISHED + answerFor(request));
      t.is(r.how, 'end', 'a clean FIN after the answer');
    }
    await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0, kanal_server_connections_open: 0 }, 10_000);
    const m = await scrapeMetrics(server.healthPort);
    t.falsy(m.get('kanal_dials_total{direction="cp_to_node",result="cancelled"}'), 'no dial was cancelled');
  });

  test(`${transport}: a FIN before the 200 follows the early bytes: KANAL_HALF_CLOSE with half-close, CLOSE_REQ without (upstream's agent)`, async (t) => {
    const ws = await makeWorkspace(t);
    for (const features of [[Feature.HalfClose], []]) {
      const server = await startServer(t, ws, { name: `early-fin-${transport}-${features.length}`, frontend: transport });
      const agent = await scriptedAgent(t, ws, server, features);
      const s = await frontendClient(server, ws, transport);
      const got = ending(s, 15_000);
      s.end(Buffer.concat([Buffer.from('CONNECT 10.1.2.3:80 HTTP/1.1\r\nHost: 10.1.2.3:80\r\n\r\n'), REQUEST]));
      const dial = await agent.take(PacketType.DIAL_REQ, () => true, 10_000);
      // The client's FIN has long reached the server when the dial is answered: the dial goes on.
      await sleep(300);
      t.false(
        has(agent, (p) => p.type === PacketType.DIAL_CLS),
        'the FIN did not cancel the dial',
      );
      const connectID = 7;
      await agent.send({ type: PacketType.DIAL_RSP, random: dial.random, connectID, error: '' });
      const data = await agent.take(PacketType.DATA, (p) => p.connectID === connectID, 10_000);
      t.is(Buffer.from(data.data).toString('latin1'), REQUEST.toString('latin1'), 'the early bytes, after the 200');
      if (features.length > 0) {
        await agent.take(PacketType.KANAL_HALF_CLOSE, (p) => p.connectID === connectID, 10_000);
        t.false(
          has(agent, (p) => p.type === PacketType.CLOSE_REQ),
          'a half-close, not a close',
        );
        // The other direction still flows, then ends.
        await agent.send({ type: PacketType.DATA, connectID, error: '', data: Buffer.from('HTTP/1.0 200 OK\r\n\r\nhello') });
        await agent.send({ type: PacketType.KANAL_HALF_CLOSE, connectID });
        const r = await got;
        t.is(r.bytes.toString('latin1'), `${ESTABLISHED}HTTP/1.0 200 OK\r\n\r\nhello`);
        t.is(r.how, 'end');
      } else {
        // Plain Konnectivity has no half-close: a FIN closes the connection, before the 200 as after it.
        await agent.take(PacketType.CLOSE_REQ, (p) => p.connectID === connectID, 10_000);
        const r = await got;
        t.is(r.bytes.toString('latin1'), ESTABLISHED);
        t.is(r.how, 'end', 'closed with a FIN: the client asked for it');
      }
      s.destroy();
      await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0, kanal_server_connections_open: 0 }, 10_000);
      await server.stop('SIGTERM');
    }
  });

  test(`${transport}: a client that went away is released at once; one that half-closed keeps its dial, and is found when it leaves`, async (t) => {
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws, {
      name: `gone-${transport}`,
      frontend: transport,
      extraArgs: ['--backend-dial-timeout', '60s', '--log-level', 'info'],
    });
    const agent = await scriptedAgent(t, ws, server, []);
    const connect = 'CONNECT 10.1.2.3:80 HTTP/1.1\r\nHost: 10.1.2.3:80\r\n\r\n';
    const dialsSoFar = (): bigint[] => agent.pending().flatMap((p) => (p.type === PacketType.DIAL_REQ ? [p.random] : []));
    const cancelled = (): Set<bigint> => new Set(agent.pending().flatMap((p) => (p.type === PacketType.DIAL_CLS ? [p.random] : [])));

    // Gone for sure: a reset (TCP), a close (a Unix socket, seen by the empty write that follows its FIN).
    const goneClients = await Promise.all(Array.from({ length: 20 }, () => frontendConnection(server, ws, transport)));
    for (const c of goneClients) {
      c.socket.on('error', () => undefined);
      c.socket.write(connect);
    }
    await until(() => dialsSoFar().length === goneClients.length, 'a dial for every client', 10_000);
    for (const c of goneClients) c.reset();
    const ms = await until(() => cancelled().size === goneClients.length, 'a DIAL_CLS for every client gone', 10_000);
    await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0 }, 10_000);
    t.log(`${transport}: ${goneClients.length} clients gone, their dials cancelled within ${ms} ms (dial timeout 60 s)`);

    // A FIN only: the dials go on (checked for longer than the server's once-a-second look at such clients).
    const halfClosed = await Promise.all(Array.from({ length: 20 }, () => frontendClient(server, ws, transport)));
    for (const c of halfClosed) {
      c.on('error', () => undefined);
      // Reading, so nothing unread (a TLS session ticket) turns the client's close into a reset.
      c.resume();
      c.end(connect);
    }
    await until(() => dialsSoFar().length === goneClients.length + halfClosed.length, 'a dial for every client', 10_000);
    await sleep(1500);
    t.is(cancelled().size, goneClients.length, 'no dial of a client that only half-closed was cancelled');
    t.is((await scrapeMetrics(server.healthPort)).get('kanal_server_pending_dials'), halfClosed.length);

    // Then they leave without a word. On a Unix socket the server's empty write fails within a second or
    // so; over TCP their FIN said all there is, and the server learns it when it writes to them.
    for (const c of halfClosed) c.destroy();
    if (transport === 'uds') {
      const leftMs = await until(
        () => cancelled().size === goneClients.length + halfClosed.length,
        'a DIAL_CLS for every half-closed client that left',
        5000,
      );
      t.log(`uds: ${halfClosed.length} half-closed clients left; their dials cancelled within ${leftMs} ms`);
    } else {
      await sleep(1500);
      t.is(cancelled().size, goneClients.length, 'over TCP a FIN and a quiet close look like a FIN');
      const pending = dialsSoFar().filter((id) => !cancelled().has(id));
      let connectID = 1;
      const ids: number[] = [];
      for (const random of pending) {
        const id = (connectID += 2);
        ids.push(id);
        await agent.send({ type: PacketType.DIAL_RSP, random, connectID: id, error: '' });
        // The 200 itself is taken by the kernel (the client's answers with a reset); the next write fails.
        await agent.send({ type: PacketType.DATA, connectID: id, error: '', data: Buffer.from('banner\r\n') });
      }
      const closeMs = await until(
        () => ids.every((id) => has(agent, (p) => p.type === PacketType.CLOSE_REQ && p.connectID === id)),
        'a CLOSE_REQ for every connection whose client had left',
        10_000,
      );
      t.log(`tcp: ${ids.length} half-closed clients that left: closed ${closeMs} ms after their dials were answered`);
    }
    await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0, kanal_server_connections_open: 0 }, 10_000);
  });
}

/** A command-line client that sends its input and then half-closes, if the machine has one. */
function halfClosingClient(): { argv: (uds: string) => string[]; name: string } | undefined {
  if (spawnSync('sh', ['-c', 'command -v socat']).status === 0)
    // -t: how long socat keeps reading after its input ended (default 0.5 s).
    return { name: 'socat', argv: (uds) => ['socat', '-t', '10', '-', `UNIX-CONNECT:${uds}`] };
  const nc = spawnSync('nc', ['-h'], { encoding: 'utf8' });
  if (nc.status !== null && `${nc.stdout}${nc.stderr}`.includes('-N')) return { name: 'nc -N', argv: (uds) => ['nc', '-N', '-U', uds] };
  return undefined;
}

test('socat (or nc -N): CONNECT, request and end of input through the Unix socket get the answer', async (t) => {
  const client = halfClosingClient();
  if (!client) {
    t.log('skipped: neither socat nor an nc with -N on this machine (apt-get install socat)');
    t.pass();
    return;
  }
  const { server } = await startProxy(t, { server: { name: 'socat' } });
  const backend = await startAfterEofBackend(t);
  const input = Buffer.concat([Buffer.from(`CONNECT ${backend.address} HTTP/1.1\r\nHost: ${backend.address}\r\n\r\n`), REQUEST]);
  const [cmd, ...args] = client.argv(server.uds);
  const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
  t.teardown(() => void child.kill('SIGKILL'));
  const out: Buffer[] = [];
  child.stdout.on('data', (c: Buffer) => out.push(c));
  child.stdin.end(input);
  const code = await new Promise<number | null>((resolve) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      resolve(null);
    }, 15_000);
    child.once('exit', (c) => {
      clearTimeout(timer);
      resolve(c);
    });
  });
  t.is(code, 0, `${client.name} exited`);
  t.is(Buffer.concat(out).toString('latin1'), ESTABLISHED + answerFor(REQUEST), `${client.name} got the answer`);
});
