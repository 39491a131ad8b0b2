/**
 * Resume (docs/protocol.md): a tunnel whose stream is lost keeps its
 * connections detached, and on a new stream both sides tell what they
 * received and resend the rest: every byte once and in order, FINs included,
 * dials pending across the loss answered once; what cannot be resumed is
 * closed, and nothing is left behind.
 */
import test, { type ExecutionContext } from 'ava';
import { createHash } from 'node:crypto';
import type { Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Feature, type FeatureSet } from '../../src/wire/features.js';
import { PacketType } from '../../src/wire/packet.js';
import { Tunnel, type DialHandler } from '../../src/tunnel/tunnel.js';
import { splice } from '../../src/tunnel/splice.js';
import { v8Gc } from '../../src/common/v8-gc.js';
import { ACK_DELAY_MS } from '../../src/tunnel/connection-rules.js';
import { captureLogger, createMemoryLink, duplexPair, readAll, waitFor, type MemoryLink } from '../helpers/memory-stream.js';

const RESUME: FeatureSet = new Set([Feature.Window, Feature.HalfClose, Feature.Resume]);

const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');

function pattern(n: number, seed: number): Buffer {
  const b = Buffer.allocUnsafe(n);
  for (let i = 0; i < n; i++) b[i] = (i * 7 + seed + (i >> 11)) & 0xff;
  return b;
}

interface Pair {
  agent: Tunnel;
  server: Tunnel;
  link: MemoryLink;
  /** The far ends of the agent's dials (the "pods"), in order. */
  far: Duplex[];
  agentLog: ReturnType<typeof captureLogger>;
  serverLog: ReturnType<typeof captureLogger>;
  /** Bytes both sides sent again after a loss. */
  replayed: { bytes: number };
  /** Loses the stream (both ends see a reset, what is in flight is gone) and, after `downMs`, puts a new one under both tunnels. */
  cut(downMs?: number): Promise<void>;
}

function resumablePair(t: ExecutionContext, opts: { resumeTimeoutMs?: number; dialHandler?: DialHandler } = {}): Pair {
  const far: Duplex[] = [];
  const dialHandler: DialHandler =
    opts.dialHandler ??
    (() => {
      const [mine, theirs] = duplexPair();
      theirs.on('error', () => undefined);
      far.push(theirs);
      return Promise.resolve(mine);
    });
  const agentLog = captureLogger('debug');
  const serverLog = captureLogger('debug');
  const resumeTimeoutMs = opts.resumeTimeoutMs ?? 5000;
  const replayed = { bytes: 0 };
  const onReplayed = (n: number): void => {
    replayed.bytes += n;
  };
  const pair: Pair = {
    replayed,
    link: createMemoryLink(),
    far,
    agentLog,
    serverLog,
    agent: undefined as unknown as Tunnel,
    server: undefined as unknown as Tunnel,
    async cut(downMs = 20) {
      const lost = pair.link;
      lost.a.destroy(new Error('connection reset'));
      await waitFor(() => pair.agent.detached && pair.server.detached, 'both sides detached');
      await sleep(downMs);
      pair.link = createMemoryLink();
      t.true(pair.server.reattach(pair.link.b), 'server resumes');
      t.true(pair.agent.reattach(pair.link.a), 'agent resumes');
    },
  };
  pair.agent = new Tunnel(pair.link.a, { side: 'agent', features: RESUME, log: agentLog.log, dialHandler, resumeTimeoutMs, onReplayed });
  pair.server = new Tunnel(pair.link.b, { side: 'server', features: RESUME, log: serverLog.log, resumeTimeoutMs, onReplayed });
  t.teardown(() => {
    pair.agent.close();
    pair.server.close();
  });
  return pair;
}

/** A server-side dial through the pair, joined to a local duplex: returns the test's end of it and the pod's end. */
async function open(pair: Pair, address = 'pod:80'): Promise<{ client: Duplex; pod: Duplex }> {
  const conn = await pair.server.dial(address, { timeoutMs: 5000 });
  const [mine, client] = duplexPair();
  client.on('error', () => undefined);
  splice(mine, conn);
  await waitFor(() => pair.far.length > 0, 'the pod end exists');
  return { client, pod: pair.far[pair.far.length - 1] };
}

async function writeAll(s: Duplex, data: Buffer, chunk = 64 * 1024): Promise<void> {
  for (let off = 0; off < data.length; off += chunk) {
    if (!s.write(data.subarray(off, off + chunk))) await new Promise((resolve) => s.once('drain', resolve));
  }
}

function empty(...tunnels: Tunnel[]): boolean {
  return tunnels.every((tu) => {
    const s = tu.stats();
    return s.connections === 0 && s.pendingDials === 0 && s.inboundDials === 0;
  });
}

test('16 MiB each way cross three lost streams byte-exact, and the FINs arrive once', async (t) => {
  const pair = resumablePair(t);
  const { client, pod } = await open(pair);
  const up = pattern(16 * 1024 * 1024, 1);
  const down = pattern(16 * 1024 * 1024, 2);
  const gotUp = readAll(pod);
  const gotDown = readAll(client);
  const sending = Promise.all([writeAll(client, up).then(() => client.end()), writeAll(pod, down).then(() => pod.end())]);
  for (let i = 0; i < 3; i++) {
    await sleep(15);
    await pair.cut();
  }
  await sending;
  const [u, d] = await Promise.all([gotUp, gotDown]);
  t.is(u.length, up.length);
  t.is(sha(u), sha(up));
  t.is(d.length, down.length);
  t.is(sha(d), sha(down));
  await waitFor(() => empty(pair.agent, pair.server), 'tables empty');
  t.false(pair.agent.detached || pair.server.detached);
  t.true(pair.replayed.bytes > 0, 'the cuts lost bytes in flight, and they were sent again');
  t.log(`bytes sent again: ${pair.replayed.bytes}`);
});

test('a line-by-line stream continues after a lost stream with no line lost or repeated', async (t) => {
  const pair = resumablePair(t);
  const { client, pod } = await open(pair);
  let text = '';
  client.setEncoding('utf8');
  client.on('data', (s: string) => (text += s));
  let n = 0;
  const timer = setInterval(() => pod.write(`line ${n++}\n`), 2);
  await sleep(40);
  await pair.cut(50);
  await sleep(40);
  await pair.cut(10);
  await sleep(40);
  clearInterval(timer);
  const last = n - 1;
  await waitFor(() => text.endsWith(`line ${last}\n`), 'every line arrived');
  const lines = text.trimEnd().split('\n');
  t.deepEqual(
    lines,
    Array.from({ length: n }, (_, i) => `line ${i}`),
  );
});

test('a half-closed connection resumes: the data after the FIN still flows back', async (t) => {
  const pair = resumablePair(t);
  const { client, pod } = await open(pair);
  const request = pattern(300_000, 3);
  const gotRequest = readAll(pod);
  await writeAll(client, request);
  client.end();
  await pair.cut();
  t.is(sha(await gotRequest), sha(request), 'the request and its FIN arrived once');
  const reply = pattern(5_000_000, 4);
  const gotReply = readAll(client);
  await writeAll(pod, reply.subarray(0, 2_000_000));
  await pair.cut();
  await writeAll(pod, reply.subarray(2_000_000));
  pod.end();
  t.is(sha(await gotReply), sha(reply));
  await waitFor(() => empty(pair.agent, pair.server), 'tables empty');
});

test('a dial pending when the stream is lost is answered once on the new one', async (t) => {
  const far: Duplex[] = [];
  let release: () => void = () => undefined;
  const gate = new Promise<void>((resolve) => (release = resolve));
  const pair = resumablePair(t, {
    dialHandler: async () => {
      await gate;
      const [mine, theirs] = duplexPair();
      theirs.on('error', () => undefined);
      far.push(theirs);
      return mine;
    },
  });
  const dialing = pair.server.dial('pod:80', { timeoutMs: 5000 });
  await waitFor(() => pair.agent.stats().inboundDials === 1, 'the agent performs the dial');
  pair.link.a.destroy(new Error('connection reset'));
  await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
  // The dial connects while there is no stream: its DIAL_RSP is lost with it.
  release();
  await waitFor(() => pair.agent.stats().connections === 1, 'the agent holds the connection');
  pair.link = createMemoryLink();
  const dialReqs: bigint[] = [];
  pair.link.b.tap((p) => (p.type === PacketType.DIAL_REQ ? dialReqs.push(p.random) : undefined));
  pair.server.reattach(pair.link.b);
  pair.agent.reattach(pair.link.a);
  const conn = await dialing;
  t.is(dialReqs.length, 1, 'the server asked once more');
  const [mine, client] = duplexPair();
  splice(mine, conn);
  const got = readAll(client);
  far[0].end(Buffer.from('hello after the loss'));
  t.is((await got).toString(), 'hello after the loss');
  client.end();
  await waitFor(() => empty(pair.agent, pair.server), 'tables empty');
  t.is(far.length, 1, 'dialled once');
});

test('a connection closed on one side while detached is closed on the other at resume', async (t) => {
  const pair = resumablePair(t);
  const a = await open(pair);
  const b = await open(pair);
  pair.link.a.destroy(new Error('connection reset'));
  await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
  a.client.destroy(); // abrupt: the server side closes it while there is no stream
  await waitFor(() => pair.server.stats().connections === 1, 'the server forgot it');
  pair.link = createMemoryLink();
  pair.server.reattach(pair.link.b);
  pair.agent.reattach(pair.link.a);
  await waitFor(() => pair.agent.stats().connections === 1, 'the agent closed it too');
  await waitFor(() => a.pod.destroyed, 'its pod end is closed');
  const got = readAll(b.client);
  b.pod.end(Buffer.from('the other one lives'));
  t.is((await got).toString(), 'the other one lives');
  t.true(
    pair.agentLog.lines.some((l) => /no longer holds it/.test(l.msg)),
    'the agent says why',
  );
});

test('not resumed within the timeout: both sides close, tables and windows empty', async (t) => {
  const pair = resumablePair(t, { resumeTimeoutMs: 300 });
  const { client, pod } = await open(pair);
  await writeAll(client, pattern(100_000, 5));
  const clientClosed = new Promise<Error | undefined>((resolve) => client.once('close', () => resolve(client.errored ?? undefined)));
  pair.link.a.destroy(new Error('connection reset'));
  await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
  await waitFor(() => pair.agent.closed && pair.server.closed, 'both closed after the timeout', 3000);
  await clientClosed;
  await waitFor(() => pod.destroyed, 'pod end closed');
  t.true(empty(pair.agent, pair.server));
  t.is(pair.agent.retainedBytes() + pair.server.retainedBytes(), 0);
  t.is(pair.agent.stats().windowGrowthBytes + pair.server.stats().windowGrowthBytes, 0);
});

test('a resume entry that claims bytes never sent closes that connection only', async (t) => {
  const pair = resumablePair(t);
  const victim = await open(pair);
  const other = await open(pair);
  await writeAll(victim.client, pattern(1000, 6));
  pair.link.a.destroy(new Error('connection reset'));
  await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
  pair.link = createMemoryLink();
  const victimID = [...Array(8).keys()].map((i) => 2 * i + 1).find((id) => pair.agent.connection(id)) ?? 0;
  // The agent's side of the stream lies about the victim: it "received" more than the server sent.
  pair.link.a.tap((p) => {
    if (p.type === PacketType.KANAL_RESUME && p.connectID === victimID) p.received = 10_000_000;
  });
  pair.server.reattach(pair.link.b);
  pair.agent.reattach(pair.link.a);
  await waitFor(() => pair.server.stats().connections === 1, 'the server closed the victim');
  t.true(pair.serverLog.lines.some((l) => /resume entry cannot be true/.test(l.msg)));
  const got = readAll(other.client);
  other.pod.end(Buffer.from('unaffected'));
  t.is((await got).toString(), 'unaffected');
});

test('without resume negotiated a lost stream closes the tunnel at once, as before', async (t) => {
  const link = createMemoryLink();
  const features: FeatureSet = new Set([Feature.Window, Feature.HalfClose]);
  const agent = new Tunnel(link.a, { side: 'agent', features, log: captureLogger().log, resumeTimeoutMs: 5000 });
  const server = new Tunnel(link.b, { side: 'server', features, log: captureLogger().log, resumeTimeoutMs: 5000 });
  t.teardown(() => (agent.close(), server.close()));
  link.a.destroy(new Error('connection reset'));
  await waitFor(() => agent.closed && server.closed, 'both closed');
  t.false(agent.resumable);
});

test('a clean end of the stream is not a loss: the tunnel closes', async (t) => {
  const pair = resumablePair(t);
  await open(pair);
  pair.agent.close();
  await waitFor(() => pair.server.closed, 'the server closed');
  t.false(pair.server.detached);
});

test('1,000 lost streams with traffic: tables, kept bytes and listeners back to where they started, heap flat', async (t) => {
  const pair = resumablePair(t);
  const gc = v8Gc();
  const heap = (): number => {
    gc?.({ type: 'major', execution: 'sync' });
    return process.memoryUsage().heapUsed;
  };
  const { client, pod } = await open(pair);
  pod.pipe(pod); // the pod echoes
  let echoed = 0;
  client.on('data', (c: Buffer) => (echoed += c.length));
  const listeners = (): number =>
    (['close', 'detached', 'resumed', 'drain-requested'] as const).reduce(
      (n, e) => n + pair.agent.listenerCount(e) + pair.server.listenerCount(e),
      0,
    );
  const startListeners = listeners();
  let before = 0;
  let sent = 0;
  for (let i = 0; i < 1000; i++) {
    const chunk = pattern(2000 + (i % 7) * 1000, i);
    client.write(chunk);
    sent += chunk.length;
    if (i === 100) before = heap();
    pair.link.a.destroy(new Error('connection reset'));
    await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
    pair.link = createMemoryLink();
    pair.server.reattach(pair.link.b);
    pair.agent.reattach(pair.link.a);
  }
  await waitFor(() => echoed === sent, 'every byte came back', 10_000);
  await sleep(ACK_DELAY_MS * 2);
  t.is(listeners(), startListeners, 'no listener left per resume');
  t.is(pair.agent.stats().connections, 1);
  t.true(pair.agent.retainedBytes() + pair.server.retainedBytes() < 64 * 1024, 'what was kept is acknowledged');
  const growth = heap() - before;
  t.log(`heap growth over 900 resumes: ${Math.round(growth / 1024)} KiB`);
  if (gc) t.true(growth < 4 * 1024 * 1024, `heap grew ${growth} bytes`);
  client.destroy();
  await waitFor(() => empty(pair.agent, pair.server), 'tables empty');
  t.is(pair.agent.retainedBytes() + pair.server.retainedBytes(), 0);
});

test('a peer acknowledging bytes never sent loses that connection, with one line; the others go on', async (t) => {
  const pair = resumablePair(t);
  const victim = await open(pair);
  const other = await open(pair);
  await writeAll(victim.client, pattern(5000, 7));
  const victimID = [...Array(8).keys()].map((i) => 2 * i + 1).find((id) => pair.server.connection(id)) ?? 0;
  for (let i = 0; i < 50; i++) {
    pair.link.a.send({ type: PacketType.KANAL_WINDOW, connectID: victimID, increment: 0, acknowledged: 1_000_000_000 });
  }
  await waitFor(() => pair.server.stats().connections === 1, 'the server closed the victim');
  t.is(pair.serverLog.matching('peer acknowledged').length, 1, 'one line, not one per packet');
  const got = readAll(other.client);
  other.pod.end(Buffer.from('unaffected'));
  t.is((await got).toString(), 'unaffected');
});

test('a dial asked for again for a connection the peer already resumed is ignored: no second answer, no replay', async (t) => {
  const pair = resumablePair(t);
  const { client, pod } = await open(pair);
  pair.link.a.destroy(new Error('connection reset'));
  await waitFor(() => pair.agent.detached && pair.server.detached, 'both detached');
  pair.link = createMemoryLink();
  const conn = pair.agent.connection(1);
  t.truthy(conn);
  const answers: number[] = [];
  pair.link.a.tap((p) => (p.type === PacketType.DIAL_RSP ? answers.push(p.connectID) : undefined));
  // The server "asks again", within its list, for the dial of a connection it lists itself.
  let injected = false;
  pair.link.b.tap((p) => {
    if (p.type !== PacketType.KANAL_RESUME_END || injected) return;
    injected = true;
    pair.link.b.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: 'pod:80', random: conn?.dialID ?? 0n });
  });
  pair.server.reattach(pair.link.b);
  pair.agent.reattach(pair.link.a);
  await waitFor(() => !(conn?.suspended ?? true), 'resumed');
  await sleep(50);
  t.true(injected);
  t.deepEqual(answers, []);
  t.is(pair.far.length, 1, 'not dialled again');
  const got = readAll(client);
  pod.end(Buffer.from('once'));
  t.is((await got).toString(), 'once');
});
