// Both directions on one tunnel under load, every byte checked with sha256:
//
//   node -> CP: test -> Unix socket -> relay (node netns) -> ADVERTISE_IP:7443 (agent listener)
//               -> tunnel -> server -> echo on CP_ADDR:7443 (cp netns, allow-listed)
//   CP -> node: test -> server frontend (Unix socket, HTTP CONNECT) -> tunnel -> agent
//               -> echo on NODE_ADDR:9000 (node netns)
//
// Every client sends its bytes, half-closes, and reads the echo to the end.

import test, { type ExecutionContext } from 'ava';
import { levelAtLeast } from '../../kit/launch/log-reader.js';
import { skippedBecause } from '../helpers/skipped.js';
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { netnsUnavailableReason } from '../../kit/launch/netns.js';
import {
  ADVERTISE_IP,
  createTopology,
  destroyAllTopologies,
  startAgent,
  startServer,
  type NsProcess,
  type Topology,
} from '../helpers/node-topology.js';
import { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';

const ECHO_LOCAL = 7443;
const CP_ECHO_PORT = 7443;
const NODE_ECHO_PORT = 9000;
const MiB = 1024 * 1024;

const unavailable = await netnsUnavailableReason();
test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) skippedBecause('node <-> control plane load tests', unavailable);
const kernelTest = unavailable ? test.skip : test;

interface Stack {
  topo: Topology;
  server: NsProcess;
  agent: NsProcess;
  /** Unix socket relayed to ADVERTISE_IP:ECHO_LOCAL inside the node namespace. */
  nodeToCp: string;
  /** CONNECT address of the echo inside the node namespace. */
  cpToNode: string;
}

async function stack(t: ExecutionContext): Promise<Stack> {
  const topo = await createTopology();
  t.teardown(() => topo.destroy());
  await topo.services(topo.cp, 'cp-services', [{ kind: 'echo', name: 'cp-echo', host: topo.cpAddr, port: CP_ECHO_PORT }]);
  const server = await startServer(topo, { allowed: [`${topo.cpAddr}:${CP_ECHO_PORT}`] });
  const agent = await startAgent(topo, { targets: [`${ECHO_LOCAL}:${topo.cpAddr}:${CP_ECHO_PORT}`] });
  const nodeToCp = topo.socketPath('node-to-cp');
  await topo.services(topo.node, 'node-services', [
    { kind: 'echo', name: 'node-echo', host: topo.nodeAddr, port: NODE_ECHO_PORT },
    { kind: 'relay', name: 'node-to-cp', listen: { path: nodeToCp }, to: { host: ADVERTISE_IP, port: ECHO_LOCAL } },
  ]);
  return { topo, server, agent, nodeToCp, cpToNode: `${topo.nodeAddr}:${NODE_ECHO_PORT}` };
}

interface EchoResult {
  sent: number;
  received: number;
  sentSha: string;
  receivedSha: string;
  ms: number;
}

/**
 * Writes random bytes (a fixed amount, or until `stop` fires), half-closes,
 * and reads the echo until EOF, hashing both sides. Bounded by timeoutMs.
 */
function echoRoundTrip(
  sock: net.Socket,
  opts: { bytes?: number; stop?: AbortSignal; chunk?: number; timeoutMs: number; onData?: (n: number) => void },
): Promise<EchoResult> {
  const chunk = opts.chunk ?? 64 * 1024;
  const t0 = performance.now();
  const sentHash = createHash('sha256');
  const receivedHash = createHash('sha256');
  let sent = 0;
  let received = 0;
  return new Promise<EchoResult>((resolve, reject) => {
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`echo round trip timed out after ${opts.timeoutMs} ms (sent ${sent}, received ${received})`));
    }, opts.timeoutMs);
    sock.on('data', (c: Buffer) => {
      received += c.length;
      receivedHash.update(c);
      opts.onData?.(c.length);
    });
    sock.once('error', (err) => {
      clearTimeout(timer);
      reject(err);
    });
    sock.once('end', () => {
      clearTimeout(timer);
      resolve({ sent, received, sentSha: sentHash.digest('hex'), receivedSha: receivedHash.digest('hex'), ms: performance.now() - t0 });
      sock.destroy();
    });
    sock.resume(); // httpConnect hands the socket over paused
    const more = (): boolean => (opts.bytes !== undefined ? sent < opts.bytes : !opts.stop?.aborted);
    const pump = (): void => {
      while (more()) {
        const n = opts.bytes !== undefined ? Math.min(chunk, opts.bytes - sent) : chunk;
        const buf = randomBytes(n);
        sentHash.update(buf);
        sent += n;
        if (!sock.write(buf)) {
          sock.once('drain', pump);
          return;
        }
      }
      sock.end();
    };
    opts.stop?.addEventListener('abort', () => {
      if (sock.writableLength === 0 && !sock.writableEnded) pump();
    });
    pump();
  });
}

function nodeToCpSocket(s: Stack): Promise<net.Socket> {
  return connectUnix(s.nodeToCp);
}

async function cpToNodeSocket(s: Stack): Promise<net.Socket> {
  return httpConnect(await connectUnix(s.topo.uds), s.cpToNode);
}

function checkEcho(t: ExecutionContext, r: EchoResult, what: string): void {
  t.is(r.received, r.sent, `${what}: bytes back`);
  t.is(r.receivedSha, r.sentSha, `${what}: sha256`);
}

kernelTest('100 concurrent node -> control plane connections while control plane -> node traffic flows on the same tunnel', async (t) => {
  t.timeout(180_000);
  const s = await stack(t);

  // Control plane -> node: 8 streams writing until told to stop.
  const stop = new AbortController();
  let cpToNodeBytes = 0;
  const background = await Promise.all(Array.from({ length: 8 }, () => cpToNodeSocket(s)));
  const backgroundDone = background.map((sock) =>
    echoRoundTrip(sock, { stop: stop.signal, chunk: 16 * 1024, timeoutMs: 150_000, onData: (n) => (cpToNodeBytes += n) }),
  );
  // Make sure it is flowing before the burst starts.
  const flowing = Date.now() + 10_000;
  while (cpToNodeBytes < 4 * MiB && Date.now() < flowing) await new Promise((r) => setTimeout(r, 20));
  t.true(cpToNodeBytes >= 4 * MiB, `control plane -> node traffic is flowing (${cpToNodeBytes} bytes)`);

  // Node -> control plane: 100 connections at once, 256 KiB each.
  const before = cpToNodeBytes;
  const burstStart = performance.now();
  const burst = await Promise.allSettled(
    Array.from({ length: 100 }, async () => echoRoundTrip(await nodeToCpSocket(s), { bytes: 256 * 1024, timeoutMs: 120_000 })),
  );
  const burstMs = performance.now() - burstStart;
  const duringBurst = cpToNodeBytes - before;
  stop.abort();
  const rejected = burst.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
  t.deepEqual(
    rejected.map((r) => String(r.reason)),
    [],
    'every node -> control plane connection completed',
  );
  for (const r of burst) if (r.status === 'fulfilled') checkEcho(t, r.value, 'node -> CP');
  t.true(duringBurst > 0, 'control plane -> node traffic kept flowing during the burst');

  const bg = await Promise.all(backgroundDone);
  for (const r of bg) checkEcho(t, r, 'CP -> node');
  t.log(
    `100 x 256 KiB node -> CP in ${burstMs.toFixed(0)} ms; meanwhile ${(duringBurst / MiB).toFixed(1)} MiB echoed CP -> node ` +
      `(${(bg.reduce((a, r) => a + r.sent, 0) / MiB).toFixed(1)} MiB over 8 streams in total)`,
  );

  t.deepEqual(
    [s.server, s.agent].flatMap((p) => p.jsonLines().filter((l) => levelAtLeast(l.level, 'error'))),
    [],
    'no error-level log lines',
  );
});

kernelTest('64 MiB each way, both directions at once, sha256 intact', async (t) => {
  t.timeout(240_000);
  const s = await stack(t);
  const size = 64 * MiB;
  const [up, down] = await Promise.all([
    nodeToCpSocket(s).then((sock) => echoRoundTrip(sock, { bytes: size, timeoutMs: 200_000 })),
    cpToNodeSocket(s).then((sock) => echoRoundTrip(sock, { bytes: size, timeoutMs: 200_000 })),
  ]);
  checkEcho(t, up, 'node -> CP 64 MiB');
  checkEcho(t, down, 'CP -> node 64 MiB');
  t.is(up.sent, size);
  t.is(down.sent, size);
  const rate = (r: EchoResult): string => `${((2 * r.sent) / MiB / (r.ms / 1000)).toFixed(0)} MiB/s`;
  t.log(
    `node -> CP: 64 MiB out + 64 MiB back in ${up.ms.toFixed(0)} ms (${rate(up)}); CP -> node: ${down.ms.toFixed(0)} ms (${rate(down)})`,
  );
});
