/**
 * The server as a relay between two tunnels, in memory: a frontend stream
 * (the KAS's konnectivity-client, ProxyService) whose dials the server
 * performs by dialling through an agent tunnel and splicing the two
 * tunnelled connections. Uses the real createGrpcFrontend, BackendDialer
 * and AgentRegistry; only the transport is the in-memory link.
 */
import test from 'ava';
import { PassThrough, type Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { Tunnel, type DialHandler, type InboundDial } from '../../src/tunnel/tunnel.js';
import type { TunnelLimits } from '../../src/tunnel/limits.js';
import { DialError } from '../../src/tunnel/errors.js';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import { BackendDialer } from '../../src/server/frontends/backend-dialer.js';
import { createGrpcFrontend } from '../../src/server/frontends/grpc-frontend.js';
import { parseAgentIdentifiers } from '../../src/wire/agent-identifiers.js';
import { unauthenticatedCredential } from '../../src/server/identity/agent-credential.js';
import { GrpcStatus, type IncomingStream } from '../../src/transport/transport.js';
import { Feature, formatFeatures, parseFeatures, type FeatureSet } from '../../src/wire/features.js';
import { MD_KANAL_FEATURES } from '../../src/wire/metadata.js';
import { PacketType } from '../../src/wire/packet.js';
import {
  captureLogger,
  createMemoryLink,
  drainOrClose,
  sinkEndpoint,
  waitFor,
  type MemoryLink,
  type Sink,
} from '../helpers/memory-stream.js';
import { dialStream } from '../helpers/connection-stream.js';

const KiB = 1024;
const MiB = 1024 * 1024;
const WINDOW: FeatureSet = new Set([Feature.Window, Feature.HalfClose]);

interface Relay {
  /** The KAS side of the frontend stream. */
  kas: Tunnel;
  /** The agent side of the agent stream. */
  agent: Tunnel;
  /** The server's two tunnels. */
  serverFrontend: () => Tunnel;
  serverAgent: Tunnel;
  frontendLink: MemoryLink;
  agentLink: MemoryLink;
  registry: AgentRegistry;
  logs: ReturnType<typeof captureLogger>;
  idle(): boolean;
  close(): void;
}

function relay(opts: { features: FeatureSet; agentDialHandler: DialHandler; limits?: Partial<TunnelLimits>; withAgent?: boolean }): Relay {
  const logs = captureLogger();
  const registry = new AgentRegistry();
  const dialer = new BackendDialer({ registry, timeoutMs: 5000, log: logs.log });
  // Agent stream.
  const agentLink = createMemoryLink();
  const agent = new Tunnel(agentLink.a, {
    side: 'agent',
    features: opts.features,
    log: captureLogger().log,
    limits: opts.limits,
    dialHandler: opts.agentDialHandler,
  });
  const serverAgent = new Tunnel(agentLink.b, { side: 'server', features: opts.features, log: logs.log, limits: opts.limits });
  if (opts.withAgent !== false) {
    registry.add({
      agentID: 'node-1',
      credential: unauthenticatedCredential('memory'),
      identifiers: parseAgentIdentifiers(''),
      tunnel: serverAgent,
      peer: 'memory',
      connectedAt: new Date(),
    });
  }
  // Frontend stream, accepted by the real gRPC frontend handler.
  const frontendLink = createMemoryLink({
    metadataB: new Map(opts.features.size > 0 ? [[MD_KANAL_FEATURES, [formatFeatures(opts.features)]]] : []),
  });
  let frontendTunnel: Tunnel | undefined;
  let acceptedHeaders: Record<string, string> = {};
  const incoming: IncomingStream = {
    metadata: frontendLink.b.metadata,
    peer: 'memory-kas',
    context: undefined,
    accept(headers) {
      acceptedHeaders = headers;
      return frontendLink.b;
    },
    reject(code: GrpcStatus, message: string) {
      throw new Error(`unexpected reject ${code} ${message}`);
    },
  };
  createGrpcFrontend({ dialer, log: logs.log, track: (t) => (frontendTunnel = t), limits: opts.limits })(incoming);
  const negotiated = parseFeatures(acceptedHeaders[MD_KANAL_FEATURES]);
  const kas = new Tunnel(frontendLink.a, { side: 'agent', features: negotiated, log: captureLogger().log, limits: opts.limits });
  const all = (): Tunnel[] => [kas, agent, serverAgent, frontendTunnel!];
  return {
    kas,
    agent,
    serverFrontend: () => frontendTunnel!,
    serverAgent,
    frontendLink,
    agentLink,
    registry,
    logs,
    idle: () => all().every((t) => t.stats().connections === 0 && t.stats().pendingDials === 0 && t.stats().inboundDials === 0),
    close() {
      for (const t of all()) t.close();
    },
  };
}

function closed(s: Duplex): Promise<void> {
  return new Promise((resolve) => (s.closed ? resolve() : s.once('close', () => resolve())));
}

function hanging(seen: InboundDial[]): DialHandler {
  return (dial) => {
    seen.push(dial);
    return new Promise<Duplex>((_resolve, reject) =>
      dial.signal.addEventListener('abort', () => reject(new Error('aborted')), { once: true }),
    );
  };
}

test('KAS -> server -> agent: bytes flow both ways through two spliced tunnels; all four tables empty after', async (t) => {
  const r = relay({ features: WINDOW, agentDialHandler: () => Promise.resolve(new PassThrough()) });
  t.teardown(() => r.close());
  t.deepEqual([...r.kas.features].sort(), ['half-close', 'window'], 'features negotiated on the frontend stream');
  const conns = await Promise.all([1, 2, 3, 4].map((i) => dialStream(r.kas, `pod-${i}:80`, { timeoutMs: 5000 })));
  for (const [i, c] of conns.entries()) {
    const got = new Promise<string>((resolve) => c.once('data', (b: Buffer) => resolve(b.toString())));
    c.write(`hello ${i}`);
    t.is(await got, `hello ${i}`);
  }
  t.is(r.serverAgent.stats().connections, 4);
  t.is(r.serverFrontend().stats().connections, 4);
  // KAS-side connectIDs are assigned by the server (even).
  t.true(conns.every((c) => c.connection.connectID % 2 === 0));
  for (const c of conns) c.destroy();
  await waitFor(() => r.idle(), 'all tables empty');
  t.pass();
});

test('KAS cancels a pending dial: DIAL_CLS reaches the agent and its dial is aborted', async (t) => {
  const seen: InboundDial[] = [];
  const r = relay({ features: WINDOW, agentDialHandler: hanging(seen) });
  t.teardown(() => r.close());
  const abort = new AbortController();
  const dialing = dialStream(r.kas, 'pod:80', { timeoutMs: 5000, signal: abort.signal });
  await waitFor(() => seen.length === 1, 'agent started dialling');
  t.is(r.serverFrontend().stats().inboundDials, 1);
  t.is(r.serverAgent.stats().pendingDials, 1);
  abort.abort();
  const err = await t.throwsAsync(dialing);
  t.is((err as DialError).failure, 'cancelled');
  await waitFor(() => seen[0].signal.aborted, 'agent dial aborted');
  t.true(
    r.agentLink.b.sent.some((p) => p.type === PacketType.DIAL_CLS),
    'server sent DIAL_CLS to the agent',
  );
  await waitFor(() => r.idle(), 'all tables empty');
});

test('agent refusal and no agent become DIAL_RSP errors for the KAS', async (t) => {
  const refusing = relay({
    features: WINDOW,
    agentDialHandler: () => Promise.reject(new Error('dial tcp 10.1.2.3:80: connect: connection refused')),
  });
  t.teardown(() => refusing.close());
  const err = await t.throwsAsync(refusing.kas.dial('10.1.2.3:80', { timeoutMs: 5000 }));
  t.is((err as DialError).failure, 'refused');
  t.regex(err.message, /connection refused/);

  const lonely = relay({ features: WINDOW, agentDialHandler: () => Promise.resolve(new PassThrough()), withAgent: false });
  t.teardown(() => lonely.close());
  const none = await t.throwsAsync(lonely.kas.dial('pod:80', { timeoutMs: 5000 }));
  t.regex(none.message, /no agent/);
  await waitFor(() => refusing.idle() && lonely.idle(), 'tables empty');
});

test('the KAS stream goes away: the agent-side connections are closed too', async (t) => {
  const far: Sink[] = [];
  const r = relay({
    features: WINDOW,
    agentDialHandler: () => {
      const s = sinkEndpoint();
      far.push(s);
      return Promise.resolve(s);
    },
  });
  t.teardown(() => r.close());
  const conns = await Promise.all([1, 2, 3].map((i) => dialStream(r.kas, `pod-${i}:80`, { timeoutMs: 5000 })));
  for (const c of conns) c.on('error', () => undefined);
  t.is(r.agent.stats().connections, 3);
  r.frontendLink.a.destroy(new Error('KAS restarted'));
  await Promise.all(far.map((s) => closed(s)));
  await waitFor(() => r.agent.stats().connections === 0 && r.serverAgent.stats().connections === 0, 'agent side empty');
  t.false(r.serverAgent.closed, 'the agent tunnel itself survives');
});

test('the agent tunnel goes away: the KAS connections are closed with an error', async (t) => {
  const r = relay({ features: WINDOW, agentDialHandler: () => Promise.resolve(new PassThrough()) });
  t.teardown(() => r.close());
  const conns = await Promise.all([1, 2].map((i) => dialStream(r.kas, `pod-${i}:80`, { timeoutMs: 5000 })));
  const errors: Error[] = [];
  for (const c of conns) c.on('error', (e: Error) => errors.push(e)).resume();
  r.agentLink.a.destroy(new Error('agent crashed'));
  await Promise.all(conns.map((c) => closed(c)));
  t.is(errors.length, 2);
  await waitFor(() => r.serverFrontend().stats().connections === 0 && r.kas.stats().connections === 0, 'frontend side empty');
  t.false(r.serverFrontend().closed, 'the KAS stream survives');
});

test('back-pressure across the relay: a KAS that stops reading one connection stalls only that connection, with bounded memory on the server', async (t) => {
  const windowBytes = 128 * KiB;
  const sources: PassThrough[] = [];
  const r = relay({
    features: WINDOW,
    limits: { windowBytes, maxDataBytes: 16 * KiB },
    // The pod side: a stream the test writes into (pod -> KAS direction).
    agentDialHandler: () => {
      const p = new PassThrough({ highWaterMark: 16 * KiB });
      sources.push(p);
      return Promise.resolve(p);
    },
  });
  t.teardown(() => r.close());
  const slow = await dialStream(r.kas, 'slow:80', { timeoutMs: 5000 });
  const fast = await dialStream(r.kas, 'fast:80', { timeoutMs: 5000 });
  for (const c of [slow, fast]) c.on('error', (e: Error) => t.log(`connection error: ${e.message}`));
  const [slowPod, fastPod] = sources as [PassThrough, PassThrough];
  // The slow KAS reader never reads; the fast one counts.
  let fastGot = 0;
  fast.on('data', (b: Buffer) => (fastGot += b.length));

  // Pods write as fast as they are allowed to.
  const pump = (pod: PassThrough, total: number): { written: () => number; stop: () => void; done: Promise<void> } => {
    let written = 0;
    let stopped = false;
    const chunk = Buffer.alloc(64 * KiB, 0x5a);
    const done = (async () => {
      while (written < total && !pod.destroyed && !stopped) {
        written += chunk.length;
        if (!pod.write(chunk)) await drainOrClose(pod);
      }
    })();
    return { written: () => written, stop: () => (stopped = true), done };
  };
  const slowPump = pump(slowPod, 64 * MiB);
  const fastPump = pump(fastPod, 16 * MiB);
  await fastPump.done;
  await waitFor(() => fastGot === 16 * MiB, 'fast KAS reader got everything', 20_000);
  await sleep(50);
  const written = slowPump.written();
  t.log(`slow connection: pod wrote ${written} B before being held back`);
  // Everything the slow pod wrote is buffered somewhere along the path: bounded by a few windows and buffers.
  t.true(written <= 4 * windowBytes + 256 * KiB, `pod wrote ${written} B while nobody read`);
  await sleep(100);
  t.is(slowPump.written(), written, 'the slow connection stays stalled');
  t.false(slow.destroyed, 'with flow control the stalled connection is kept, not killed');
  // Resume the slow reader: the rest flows.
  slowPump.stop();
  let slowGot = 0;
  slow.on('data', (b: Buffer) => (slowGot += b.length));
  await slowPump.done;
  slowPod.end();
  await waitFor(() => slowGot === slowPump.written(), 'slow reader catches up', 20_000);
  t.is(slowGot, written, 'nothing was lost while stalled');
  t.pass();
});
