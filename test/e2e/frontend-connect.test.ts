/**
 * The HTTP CONNECT frontend keeps no work for clients that left, and holds
 * no connection past its limits (docs/frontends.md), on the Unix socket and on
 * mTLS TCP:
 * - a client that goes away (a reset; on a Unix socket, a close), with or
 *   without a FIN first, before its dial is answered cancels it: DIAL_CLS
 *   reaches the agent and the pending dial leaves the table at once, long
 *   before the dial timeout (a FIN alone is a half-close and keeps the dial:
 *   connect-half-close.test.ts);
 * - a request head must be complete within --frontend-header-timeout from
 *   accept, however slowly its bytes trickle in, and fit in 16 KiB;
 * - when the backend speaks first, its bytes never come before the
 *   "200 Connection Established" line, and bytes a
 *   client sends right after its CONNECT reach the backend.
 */
import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { PacketType } from '../../src/wire/packet.js';
import {
  makeWorkspace,
  readExactly,
  scrapeMetrics,
  startBannerBackend,
  startProxy,
  startServer,
  frontendConnection,
  waitMetrics,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import type { ProxyStream } from '../helpers/e2e-grpc-client.js';
import { agentServiceStream } from '../helpers/agent-service-stream.js';

/** An agent that registers and never answers a dial: it only records what the server sends. */
async function silentAgent(t: ExecutionContext, ws: Workspace, server: KanalServerProcess): Promise<ProxyStream> {
  const credential = await issueAgentCertificate(ws.pki, 'silent-agent');
  const agent = agentServiceStream(t, { ws, server, credential, metadata: { agentid: 'silent-agent' } });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  return agent;
}

function randomsOf(agent: ProxyStream, type: PacketType.DIAL_REQ | PacketType.DIAL_CLS): Set<bigint> {
  return new Set(agent.pending().flatMap((p) => (p.type === type ? [p.random] : [])));
}

async function until(cond: () => boolean, what: string, timeoutMs: number): Promise<number> {
  const started = Date.now();
  while (!cond()) {
    if (Date.now() - started > timeoutMs) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await sleep(20);
  }
  return Date.now() - started;
}

/** What `socket` receives until it ends, fails or closes (or `timeoutMs` passes). */
function received(socket: net.Socket, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    const done = (): void => {
      clearTimeout(timer);
      resolve(Buffer.concat(chunks));
    };
    const timer = setTimeout(done, timeoutMs);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('end', done);
    socket.once('close', done);
    socket.once('error', done);
  });
}

const CLIENTS = 200;
const DIAL_TIMEOUT = '60s';

for (const transport of ['uds', 'tcp'] as const) {
  test(`${transport}: CONNECT clients that go away before the dial is answered cancel it at once (DIAL_CLS to the agent, no pending dial left)`, async (t) => {
    const ws = await makeWorkspace(t);
    const server = await startServer(t, ws, {
      name: `cancel-${transport}`,
      frontend: transport,
      extraArgs: ['--backend-dial-timeout', DIAL_TIMEOUT, '--log-level', 'info'],
    });
    const agent = await silentAgent(t, ws, server);
    const clients = await Promise.all(Array.from({ length: CLIENTS }, () => frontendConnection(server, ws, transport)));
    for (const c of clients) c.socket.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n');
    await until(() => randomsOf(agent, PacketType.DIAL_REQ).size === CLIENTS, 'every dial reached the agent', 20_000);
    t.is((await scrapeMetrics(server.healthPort)).get('kanal_server_pending_dials'), CLIENTS);

    // Half leave with a reset (a plain close on a Unix socket), half with a FIN and then a reset: over
    // TCP found in the kernel's TCP state (Node reads no more after a FIN), on a Unix socket by an empty write.
    // (The pause lets the client's FIN go out: libuv refuses a reset while it is being sent.)
    clients.forEach((c, i) => {
      if (i % 2 === 0) c.reset();
      else {
        c.socket.end();
        setTimeout(() => c.reset(), 100);
      }
    });
    const dialed = randomsOf(agent, PacketType.DIAL_REQ);
    const ms = await until(() => randomsOf(agent, PacketType.DIAL_CLS).size === CLIENTS, 'a DIAL_CLS for every dial', 20_000);
    const sorted = (ids: Set<bigint>): string[] => [...ids].map(String).sort();
    t.deepEqual(sorted(randomsOf(agent, PacketType.DIAL_CLS)), sorted(dialed), 'each DIAL_CLS names a dial the server had sent');
    await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0 }, 10_000);
    t.log(`${transport}: ${CLIENTS} clients left; every dial cancelled within ${ms} ms (dial timeout ${DIAL_TIMEOUT})`);
    const m = await scrapeMetrics(server.healthPort);
    t.is(m.get('kanal_dials_total{direction="cp_to_node",result="cancelled"}'), CLIENTS);
  });

  test(`${transport}: a request head must be complete within --frontend-header-timeout, however slowly it comes, and fit in 16 KiB`, async (t) => {
    const { ws, server } = await startProxy(t, {
      server: { name: `head-${transport}`, frontend: transport, extraArgs: ['--frontend-header-timeout', '2s'] },
    });
    const closedAfter = async (feed: (s: net.Socket) => NodeJS.Timeout | undefined): Promise<{ ms: number; answer: string }> => {
      // From before connecting: the server counts from its accept, which comes later.
      const started = Date.now();
      const { socket } = await frontendConnection(server, ws, transport);
      const chunks: Buffer[] = [];
      socket.on('data', (c: Buffer) => chunks.push(c));
      const timer = feed(socket);
      // The server's FIN (a Unix-socket client here keeps its own half open, as it asked).
      await new Promise<void>((resolve) => {
        const cap = setTimeout(resolve, 15_000);
        const done = (): void => {
          clearTimeout(cap);
          resolve();
        };
        socket.once('end', done);
        socket.once('close', done);
      });
      clearInterval(timer);
      socket.destroy();
      return { ms: Date.now() - started, answer: Buffer.concat(chunks).toString('latin1') };
    };
    const unfinished = await closedAfter((s) => {
      s.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: 127.0.0.1:9\r\n');
      return undefined;
    });
    const trickle = await closedAfter((s) => {
      s.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\n');
      return setInterval(() => s.write('X-Slow: 1\r\n'), 200);
    });
    const silent = await closedAfter(() => undefined);
    for (const [name, r] of [
      ['headers that never finish', unfinished],
      ['headers trickling in', trickle],
      ['nothing at all', silent],
    ] as const) {
      t.true(r.ms >= 1900, `${name}: closed after ${r.ms} ms, before the header timeout`);
      t.true(r.ms < 15_000, `${name}: still open 15 s later`);
      t.log(`${transport}, ${name}: closed after ${r.ms} ms`);
    }
    t.regex(unfinished.answer, /^HTTP\/1\.1 408 Request Timeout\r\n/);
    t.regex(trickle.answer, /^HTTP\/1\.1 408 Request Timeout\r\n/);
    t.is(silent.answer, '', 'a client that sent nothing gets nothing');
    await server.waitForLog((l) => l.refusal === 'frontend_header_timeout', 5000, 'header timeout refusal');

    // Too large: 431, and the refusal's log line stays small. (Writing the rest may fail once the server has answered.)
    const { socket } = await frontendConnection(server, ws, transport);
    const answer = received(socket, 10_000);
    socket.write(`CONNECT ${'a'.repeat(1 << 20)}:443 HTTP/1.1\r\nHost: x\r\n\r\n`);
    t.regex((await answer).toString('latin1'), /^HTTP\/1\.1 431 Request Header Fields Too Large\r\n/);
    socket.destroy();
    const line = await server.waitForLog((l) => l.code === 'HPE_HEADER_OVERFLOW', 5000, 'header overflow refusal');
    t.true(JSON.stringify(line).length < 1024);
  });

  test(`${transport}: a backend that speaks first: the 200 line always comes before its first byte, and early client bytes reach it`, async (t) => {
    const { ws, server } = await startProxy(t, {
      server: { name: `order-${transport}`, frontend: transport, extraArgs: ['--log-level', 'info'] },
    });
    const banner = Buffer.from('220 banner from a backend that speaks first\r\n');
    const backend = await startBannerBackend(t, banner);
    const established = Buffer.from('HTTP/1.1 200 Connection Established\r\n\r\n');
    const early = Buffer.from('early bytes sent with the CONNECT');
    const want = Buffer.concat([established, banner, early]);
    const dials = transport === 'uds' ? 300 : 100;
    let ok = 0;
    for (let batch = 0; batch < dials; batch += 50) {
      const results = await Promise.all(
        Array.from({ length: 50 }, async () => {
          const { socket } = await frontendConnection(server, ws, transport);
          const reading = readExactly(socket, want.length, 10_000);
          socket.write(Buffer.concat([Buffer.from(`CONNECT ${backend.address} HTTP/1.1\r\nHost: ${backend.address}\r\n\r\n`), early]));
          const got = await reading;
          socket.destroy();
          return got;
        }),
      );
      for (const got of results) {
        if (got.equals(want)) ok++;
        else t.fail(`got ${JSON.stringify(got.toString('latin1'))}`);
      }
    }
    t.is(ok, dials);
    await waitMetrics(server.healthPort, { kanal_server_pending_dials: 0 }, 10_000);
  });
}
