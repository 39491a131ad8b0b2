/**
 * One client's bytes must never hurt the server ("P" and a
 * FIN on the Unix socket crashed it with ERR_STREAM_UNSHIFT_AFTER_END_EVENT,
 * dropping every agent's tunnels).
 *
 * The sniffer on its own: every prefix of the HTTP/2 preface and of a
 * CONNECT request, then a FIN, an abrupt close, or an error, gives a verdict
 * and never throws. Then every frontend of the real CLI (Unix socket and
 * mTLS TCP, each --mode) takes the same prefixes followed by a FIN and by a
 * reset: the server stays up, its agent stays connected, tunnels opened
 * before keep working, new ones open, and its file descriptors come back to
 * their count before the fuzzing.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { sniffProtocol } from '../../src/server/frontends/protocol-sniffer.js';
import { FRONTENDS } from '../../src/server/frontends/frontend-registry.js';
import { unixSocketPair } from '../helpers/unix-socket-pair.js';
import {
  connectUnix,
  echoRoundTrip,
  fdCount,
  frontendProxyStream,
  httpConnect,
  makeWorkspace,
  startEchoBackend,
  startPair,
  tlsToFrontend,
  tlsToFrontendRaw,
  waitClosed,
  waitMetrics,
  type Backend,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n', 'latin1');
const connectRequest = (address: string): Buffer => Buffer.from(`CONNECT ${address} HTTP/1.1\r\nHost: ${address}\r\n\r\n`, 'latin1');

/** Every prefix of `b`, the empty one and `b` itself included. */
function prefixes(b: Buffer): Buffer[] {
  return Array.from({ length: b.length + 1 }, (_, n) => b.subarray(0, n));
}

// ---------- the sniffer alone ----------

const socketPair = unixSocketPair;

const ENDINGS = ['FIN', 'close', 'error'] as const;

test('the sniffer: every prefix of the HTTP/2 preface and of a CONNECT request, then a FIN, a close or an error, gets a verdict and never throws', async (t) => {
  const expect = (bytes: Buffer): string => {
    if (bytes.length === 0) return 'closed';
    const n = Math.min(bytes.length, PREFACE.length);
    if (!bytes.subarray(0, n).equals(PREFACE.subarray(0, n))) return 'http-connect';
    return n === PREFACE.length ? 'grpc' : 'closed';
  };
  let cases = 0;
  for (const bytes of [...prefixes(PREFACE), ...prefixes(connectRequest('127.0.0.1:9')).slice(1)]) {
    for (const ending of ENDINGS) {
      const [server, client] = await socketPair(t);
      const verdict = sniffProtocol(server, 5000, FRONTENDS).then((r) => (r.kind === 'door' ? r.door.name : r.kind));
      if (bytes.length > 0) client.write(bytes);
      await sleep(1);
      if (ending === 'FIN') client.end();
      else if (ending === 'close') client.destroy();
      else server.destroy(new Error('simulated failure'));
      const got = await verdict;
      // Bytes that decide nothing yet end as 'closed'; an error may also beat bytes still in flight.
      const want = ending === 'error' ? [expect(bytes), 'closed'] : [expect(bytes)];
      t.true(want.includes(got), `${JSON.stringify(bytes.toString('latin1'))} + ${ending}: ${got}`);
      if ((got === 'grpc' || got === 'http-connect') && !server.destroyed) {
        // The bytes are back in the socket for the next parser.
        server.on('error', () => undefined);
        const back = await new Promise<Buffer>((resolve) => {
          const chunks: Buffer[] = [];
          server.on('data', (c: Buffer) => chunks.push(c));
          server.once('close', () => resolve(Buffer.concat(chunks)));
          server.once('end', () => resolve(Buffer.concat(chunks)));
          server.resume();
        });
        t.true(bytes.equals(back.subarray(0, bytes.length)), `${JSON.stringify(bytes.toString('latin1'))}: bytes put back`);
      }
      server.destroy();
      client.destroy();
      cases++;
    }
  }
  t.log(`${cases} cases`);
});

test('the sniffer: a socket already ended or destroyed when sniffing starts is "closed"', async (t) => {
  const [server, client] = await socketPair(t);
  server.destroy();
  t.like(await sniffProtocol(server, 1000, FRONTENDS), { kind: 'closed' });
  client.destroy();
  const [idle] = await socketPair(t);
  t.like(await sniffProtocol(idle, 50, FRONTENDS), { kind: 'timeout' });
  idle.destroy();
});

// ---------- every frontend of the real CLI ----------

type Transport = 'uds' | 'tcp';
type Mode = 'both' | 'grpc' | 'http-connect';

interface Fuzzed {
  ws: Workspace;
  server: KanalServerProcess;
  echo: Backend;
}

/** Opens a raw connection to the frontend (inside TLS for TCP); `abort` resets (TCP) or drops (Unix socket) it. */
async function rawClient(f: Fuzzed, transport: Transport): Promise<{ socket: net.Socket; abort: () => void }> {
  if (transport === 'uds') {
    const s = await connectUnix(f.server.uds);
    s.on('error', () => undefined);
    return { socket: s, abort: () => s.destroy() };
  }
  const { raw, tls } = await tlsToFrontendRaw(f.server, f.ws);
  tls.on('error', () => undefined);
  return { socket: tls, abort: () => raw.resetAndDestroy() };
}

/** Sends `bytes`, then FIN (waiting, bounded, for the server to close) or a reset. */
async function poke(f: Fuzzed, transport: Transport, bytes: Buffer, ending: 'FIN' | 'reset'): Promise<void> {
  const { socket, abort } = await rawClient(f, transport);
  socket.resume();
  if (bytes.length > 0) socket.write(bytes);
  if (ending === 'reset') {
    await sleep(5);
    abort();
    return;
  }
  socket.end();
  await waitClosed(socket, 15_000).catch(() => undefined);
  socket.destroy();
}

/** Tunnels that must outlive the fuzzing: a CONNECT and a gRPC dial, as the mode allows. */
async function openLongLived(t: ExecutionContext, f: Fuzzed, transport: Transport, mode: Mode): Promise<() => Promise<void>> {
  const checks: (() => Promise<void>)[] = [];
  if (mode !== 'grpc') {
    const s = await httpConnect(
      transport === 'uds' ? await connectUnix(f.server.uds) : await tlsToFrontend(f.server, f.ws),
      f.echo.address,
    );
    t.teardown(() => void s.destroy());
    checks.push(async () => {
      t.true(await echoRoundTrip(s, randomBytes(8192)), 'the CONNECT tunnel opened before still echoes');
    });
  }
  if (mode !== 'http-connect') {
    const stream = frontendProxyStream(t, f.server, f.ws);
    const dial = await stream.dial(f.echo.address);
    t.is(dial.error, '');
    checks.push(async () => {
      t.true(await stream.echoes(dial.connectID, randomBytes(8192), 10_000), 'the gRPC tunnel opened before still echoes');
    });
  }
  return async () => {
    for (const check of checks) await check();
  };
}

async function fdsBackTo(pid: number, baseline: number, timeoutMs: number): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  let n = fdCount(pid);
  while (n > baseline && Date.now() < deadline) {
    await sleep(200);
    n = fdCount(pid);
  }
  return n;
}

for (const transport of ['uds', 'tcp'] as const) {
  test.serial(
    `every --mode on the ${transport === 'uds' ? 'Unix socket' : 'mTLS TCP'} frontend: prefixes of the HTTP/2 preface and of CONNECT, then FIN or reset, harm nothing and leak nothing`,
    async (t) => {
      const ws = await makeWorkspace(t);
      const echo = await startEchoBackend(t);
      for (const mode of ['both', 'grpc', 'http-connect'] as const) {
        const { server, agent } = await startPair(t, ws, {
          server: { name: `fuzz-${transport}-${mode}`, frontend: transport, extraArgs: ['--mode', mode, '--log-level', 'info'] },
          agent: { agentID: `agent-${transport}-${mode}` },
        });
        const f: Fuzzed = { ws, server, echo };
        const stillWorking = await openLongLived(t, f, transport, mode);
        // One round first, so that whatever Node opens once (and keeps) is in the baseline.
        const inputs = [...prefixes(PREFACE), ...prefixes(connectRequest(echo.address)).slice(1)];
        await Promise.all(inputs.map((b) => poke(f, transport, b, 'FIN')));
        const baseline = fdCount(server.pid);
        for (const ending of ['FIN', 'reset'] as const) {
          await Promise.all(inputs.map((b) => poke(f, transport, b, ending)));
        }
        t.true(server.running(), `${mode}: the server is still running`);
        const fds = await fdsBackTo(server.pid, baseline, 20_000);
        t.true(fds <= baseline, `${mode}: ${fds} file descriptors open, ${baseline} before the fuzzing`);
        await stillWorking();
        const fresh = await openLongLived(t, f, transport, mode);
        await fresh();
        await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 5000);
        t.true(agent.running(), `${mode}: the agent is still running`);
        t.log(`${transport} --mode ${mode}: ${inputs.length * 3} fuzzing connections; fds ${baseline} before, ${fds} after`);
        await agent.stop();
        await server.stop();
      }
    },
  );
}
