/**
 * No byte lost with upstream peers: upstream Konnectivity has no
 * per-connection flow control, so a reader slower than the sender must be
 * met with back-pressure (the stream pauses, as upstream does), never by
 * closing the connection. 32 MiB each way, fast readers and readers at
 * 4 MiB/s, through upstream's agent under a Kanal server and a Kanal agent
 * under upstream's server, on the gRPC frontend (the kube-apiserver's own
 * konnectivity-client, and a client that reads slowly) and HTTP CONNECT.
 * Skips with the reason when upstream's binaries are absent.
 */
import test, { type ExecutionContext } from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  connectUnix,
  httpConnect,
  makeWorkspace,
  readExactly,
  readHashed,
  scrapeMetrics,
  sha256,
  startAgent,
  startHttpBackend,
  startServer,
  startSinkBackend,
  startSourceBackend,
  throttle,
  waitStatus,
  waitUntil,
  writeAll,
  type Backend,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { ProxyStream } from '../helpers/e2e-grpc-client.js';
import { PacketType } from '../../src/wire/packet.js';
import { runUpstreamTestClient, startUpstreamAgent, startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';

const unavailable = upstreamUnavailableReason();
const maybe = unavailable ? test.skip : test.serial;
if (unavailable) skippedBecause('upstream transfer tests', unavailable);

type Mode = 'grpc' | 'http-connect';

const MiB = 1024 * 1024;
const SIZE = 32 * MiB;
const SLOW = 4 * MiB; // bytes per second
const TRANSFER_TIMEOUT_MS = 60_000;
const payload = randomBytes(SIZE);
const payloadHash = sha256(payload);
/** What upstream's test client fetches: it logs the body as text, so the body is hex. */
const page = Buffer.from(randomBytes(SIZE / 2).toString('hex'));
const pageHash = sha256(page);

interface Backends {
  source: Backend;
  fastSink: Backend;
  slowSink: Backend;
  web: Backend;
}

async function backends(t: Parameters<typeof startSourceBackend>[0]): Promise<Backends> {
  return {
    // Clients speak first: upstream's CONNECT frontend races a backend that does (see its README).
    source: await startSourceBackend(t, payload, { afterFirstByte: true }),
    fastSink: await startSinkBackend(t, SIZE),
    slowSink: await startSinkBackend(t, SIZE, { bytesPerSecond: SLOW }),
    web: await startHttpBackend(t, page),
  };
}

/** The kube-apiserver's konnectivity-client fetches the 32 MiB page through the frontend. */
async function fetchPage(ws: Workspace, uds: string, web: Backend, mode: Mode): Promise<string> {
  const r = await runUpstreamTestClient(ws, {
    mode,
    uds,
    host: '127.0.0.1',
    port: web.port,
    path: 'page',
    bodyBytes: page.length,
    timeoutMs: TRANSFER_TIMEOUT_MS,
  });
  if (r.code !== 0 || !r.body)
    throw new Error(
      `proxy-test-client (${mode}) exited ${r.code}: ${r.log
        .split('\n')
        .filter((l) => l.startsWith('E'))
        .join(' | ')
        .slice(0, 600)}`,
    );
  return `${r.body.length === page.length && sha256(r.body) === pageHash ? 'intact' : `NOT intact (${r.body.length} bytes)`}`;
}

async function connectTo(uds: string, address: string): Promise<net.Socket> {
  const s = await httpConnect(await connectUnix(uds), address, 15_000);
  s.on('error', () => undefined); // a failure shows as a short or corrupt transfer
  return s;
}

/** CONNECT download from the source backend, read at `rate` (bytes/s) or as fast as possible. */
async function connectDownload(uds: string, source: Backend, rate?: number): Promise<string> {
  const s = await connectTo(uds, source.address);
  try {
    s.write('G');
    return (await readHashed(s, SIZE, TRANSFER_TIMEOUT_MS, rate)) === payloadHash ? 'intact' : 'NOT intact';
  } finally {
    s.destroy();
  }
}

/** CONNECT upload to a sink backend, which answers with the hash of what it read. */
async function connectUpload(uds: string, sink: Backend): Promise<string> {
  const s = await connectTo(uds, sink.address);
  try {
    const answer = readExactly(s, 64, TRANSFER_TIMEOUT_MS);
    await writeAll(s, payload);
    return (await answer).toString() === payloadHash ? 'intact' : 'NOT intact';
  } finally {
    s.destroy();
  }
}

async function grpcDial(uds: string, address: string): Promise<{ stream: ProxyStream; connectID: number }> {
  const stream = new ProxyStream(`unix://${uds}`);
  const { connectID, error } = await stream.dial(address);
  if (error) {
    stream.cancel();
    throw new Error(`DIAL_RSP error: ${error}`);
  }
  return { stream, connectID };
}

/** gRPC frontend (no Kanal features, as konnectivity-client) download at `rate` or as fast as possible. */
async function grpcDownload(uds: string, source: Backend, rate?: number): Promise<string> {
  const { stream, connectID } = await grpcDial(uds, source.address);
  try {
    await stream.send({ type: PacketType.DATA, connectID, error: '', data: Buffer.from('G') });
    return (await stream.readHashed(connectID, SIZE, TRANSFER_TIMEOUT_MS, rate)) === payloadHash ? 'intact' : 'NOT intact';
  } finally {
    stream.cancel();
  }
}

async function grpcUpload(uds: string, sink: Backend): Promise<string> {
  const { stream, connectID } = await grpcDial(uds, sink.address);
  try {
    await stream.write(connectID, payload);
    return (await stream.read(connectID, 64, TRANSFER_TIMEOUT_MS)).toString() === payloadHash ? 'intact' : 'NOT intact';
  } finally {
    stream.cancel();
  }
}

/** Runs named transfers at once; every one must be intact. */
async function allIntact(
  t: { log(...v: unknown[]): void; deepEqual(a: unknown, b: unknown, m?: string): void },
  transfers: Record<string, Promise<string>>,
): Promise<void> {
  const t0 = Date.now();
  const names = Object.keys(transfers);
  const results = await Promise.all(names.map((n) => transfers[n].catch((err: Error) => `failed: ${err.message}`)));
  t.log(`${names.join(', ')}: ${Date.now() - t0} ms`);
  t.deepEqual(Object.fromEntries(names.map((n, i) => [n, results[i]])), Object.fromEntries(names.map((n) => [n, 'intact'])));
}

/** Download and upload through one frontend, with the client (or backend) reading at `rate` or as fast as it can. */
const transfers: Record<
  Mode,
  { download: (uds: string, b: Backends, rate?: number) => Promise<string>; upload: (uds: string, sink: Backend) => Promise<string> }
> = {
  grpc: { download: (uds, b, rate) => grpcDownload(uds, b.source, rate), upload: grpcUpload },
  'http-connect': { download: (uds, b, rate) => connectDownload(uds, b.source, rate), upload: connectUpload },
};

/** Each pairing with an upstream peer: starts it in `mode` and returns the frontend socket and the Kanal side's log. */
const pairings = {
  'upstream agent under a Kanal server': async (t: ExecutionContext, ws: Workspace, mode: Mode) => {
    const server = await startServer(t, ws, { extraArgs: ['--mode', mode] });
    await startUpstreamAgent(t, ws, server, { agentID: 'upstream-node' });
    await waitStatus(server.readyzUrl(), 200, 10_000);
    return { uds: server.uds, kanal: server };
  },
  'Kanal agent under an upstream server': async (t: ExecutionContext, ws: Workspace, mode: Mode) => {
    const server = await startUpstreamServer(t, ws, { mode });
    return { uds: server.uds, kanal: await startAgent(t, ws, server, { agentID: 'kanal-node' }) };
  },
};

for (const [pairing, start] of Object.entries(pairings)) {
  for (const mode of ['grpc', 'http-connect'] as const) {
    maybe(
      `${pairing}, ${mode === 'grpc' ? 'gRPC frontend' : 'HTTP CONNECT'}: 32 MiB each way intact, with fast and 4 MiB/s readers`,
      async (t) => {
        t.timeout(180_000);
        const ws = await makeWorkspace(t);
        const b = await backends(t);
        const { uds, kanal } = await start(t, ws, mode);
        const { download, upload } = transfers[mode];
        await allIntact(t, { 'konnectivity-client (proxy-test-client) download': fetchPage(ws, uds, b.web, mode) });
        await allIntact(t, { 'fast download': download(uds, b), 'fast upload': upload(uds, b.fastSink) });
        await allIntact(t, { 'download read at 4 MiB/s': download(uds, b, SLOW), 'upload to a 4 MiB/s reader': upload(uds, b.slowSink) });
        t.false(
          kanal.logLines().some((l) => /too slow|closing connection/.test(l.msg)),
          'no connection was closed for slowness',
        );
      },
    );
  }
}

maybe(
  'upstream agent: a reader that stalls holds the whole stream, as upstream; when its client gives up the neighbour finishes intact',
  async (t) => {
    t.timeout(120_000);
    const ws = await makeWorkspace(t);
    const b = await backends(t);
    const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect'] });
    await startUpstreamAgent(t, ws, server, { agentID: 'upstream-node' });
    await waitStatus(server.readyzUrl(), 200, 10_000);
    // The neighbour first (a paused stream would hold its DIAL_RSP too), reading at 4 MiB/s.
    const neighbour = await connectTo(server.uds, b.source.address);
    neighbour.write('G');
    const hash = createHash('sha256');
    let got = 0;
    neighbour.on('data', (c: Buffer) => {
      hash.update(c);
      got += c.length;
    });
    throttle(neighbour, SLOW);
    neighbour.resume();
    const stalled = await connectTo(server.uds, b.source.address);
    stalled.write('G');
    stalled.pause(); // never reads
    await waitUntil(
      async () => (await scrapeMetrics(server.healthPort)).get('kanal_server_streams_read_paused') === 1,
      'the agent stream pauses',
      10_000,
    );
    // The neighbour drains what was already on its way, then waits with the stalled reader.
    let last = -1;
    for (let i = 0; i < 100 && got !== last; i++) {
      last = got;
      await sleep(500);
    }
    t.true(got < SIZE, `the neighbour waits behind the stalled reader (${got} bytes so far)`);
    t.log(`neighbour moved ${(got / MiB).toFixed(1)} MiB before it waited`);
    stalled.destroy(); // its client gives up: the pause is released
    const deadline = Date.now() + TRANSFER_TIMEOUT_MS;
    while (got < SIZE && Date.now() < deadline) await sleep(100);
    t.is(got, SIZE);
    t.is(hash.digest('hex'), payloadHash);
    neighbour.destroy();
  },
);
