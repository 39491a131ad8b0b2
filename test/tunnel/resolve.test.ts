/**
 * Names resolved by the far side of a tunnel (KANAL_RESOLVE_REQ / RSP,
 * src/tunnel/resolve-requests.ts and resolve-answers.ts) over an in-memory
 * tunnel pair: answers, IP literals, failures naming the name and resolver,
 * timeouts, cancels, the bounds on both sides, and what a closing or lost
 * stream does to requests in flight.
 */
import test from 'ava';
import { Tunnel } from '../../src/tunnel/tunnel.js';
import { DialError } from '../../src/tunnel/errors.js';
import { Cancel, type CancelSignal } from '../../src/common/cancel.js';
import { NameNotResolved, type ResolveAnswer, type ResolveHandler } from '../../src/tunnel/name-resolution.js';
import { MAX_PENDING_RESOLVES } from '../../src/tunnel/resolve-requests.js';
import { MAX_CONCURRENT_RESOLVES } from '../../src/tunnel/resolve-answers.js';
import { encodePacket } from '../../src/wire/codec.js';
import { PacketType } from '../../src/wire/packet.js';
import { ALL_FEATURES, Feature, type FeatureSet } from '../../src/wire/features.js';
import { captureLogger, createMemoryLink, nextPacket, tunnelPair, waitFor } from '../helpers/memory-stream.js';

const NO_RESOLVE: FeatureSet = new Set([...ALL_FEATURES].filter((f) => f !== Feature.Resolve));

async function rejection(p: Promise<unknown>): Promise<DialError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof DialError) return err;
    throw new Error(`expected DialError, got ${String(err)}`, { cause: err });
  }
  throw new Error('expected a rejection, got an answer');
}

/** A handler whose answers the test gives: each call waits until released (or its signal aborts). */
function heldHandler(): { handler: ResolveHandler; calls: { name: string; signal: CancelSignal; answer(a: ResolveAnswer): void }[] } {
  const calls: { name: string; signal: CancelSignal; answer(a: ResolveAnswer): void }[] = [];
  const handler: ResolveHandler = (name, signal) =>
    new Promise<ResolveAnswer>((resolve, reject) => {
      signal.addEventListener('abort', () => reject(new Error('aborted')));
      calls.push({ name, signal, answer: resolve });
    });
  return { handler, calls };
}

function pairWith(handler: ResolveHandler | undefined, features: FeatureSet = ALL_FEATURES) {
  return tunnelPair({ features, agentOptions: handler ? { resolveHandler: handler } : {} });
}

test('a name is resolved by the agent: addresses, resolver and TTL come back', async (t) => {
  const seen: string[] = [];
  const pair = pairWith((name) => {
    seen.push(name);
    return Promise.resolve({ addresses: ['10.96.0.1', 'fd00::1'], resolver: 'cluster DNS 10.96.0.10:53', ttlSeconds: 30 });
  });
  t.teardown(() => pair.close());
  const got = await pair.server.resolve('kubernetes.default.svc', { timeoutMs: 5000 });
  t.deepEqual(got, { addresses: ['10.96.0.1', 'fd00::1'], resolver: 'cluster DNS 10.96.0.10:53', ttlSeconds: 30 });
  t.deepEqual(seen, ['kubernetes.default.svc']);
  const req = pair.link.b.sent.find((p) => p.type === PacketType.KANAL_RESOLVE_REQ);
  t.like(req, { name: 'kubernetes.default.svc', timeoutMs: 5000 });
});

test('an IP literal is answered here, without asking the agent, even an upstream one', async (t) => {
  const pair = pairWith(undefined, NO_RESOLVE);
  t.teardown(() => pair.close());
  t.deepEqual(await pair.server.resolve('10.0.0.5', { timeoutMs: 1000 }), { addresses: ['10.0.0.5'], resolver: 'IP literal' });
  t.deepEqual(await pair.server.resolve('[fd00::5]', { timeoutMs: 1000 }), { addresses: ['fd00::5'], resolver: 'IP literal' });
  t.deepEqual(await pair.server.resolve('::1', { timeoutMs: 1000 }), { addresses: ['::1'], resolver: 'IP literal' });
  t.false(pair.link.b.sent.some((p) => p.type === PacketType.KANAL_RESOLVE_REQ));
});

test('without the resolve feature a name is unresolved, naming it and that the agent does not resolve names', async (t) => {
  const pair = pairWith(() => Promise.resolve({ addresses: ['10.0.0.1'], resolver: 'x' }), NO_RESOLVE);
  t.teardown(() => pair.close());
  const err = await rejection(pair.server.resolve('db.prod.svc', { timeoutMs: 1000 }));
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /db\.prod\.svc/);
  t.regex(err.message, /agent does not resolve names.*upstream agent/);
  t.false(pair.link.b.sent.some((p) => p.type === PacketType.KANAL_RESOLVE_REQ));
});

test('a name the agent cannot resolve is unresolved, naming the name, the reason and the resolver', async (t) => {
  const pair = pairWith(() => Promise.reject(new NameNotResolved('NXDOMAIN', 'cluster DNS 10.96.0.10:53')));
  t.teardown(() => pair.close());
  const err = await rejection(pair.server.resolve('nope.default.svc', { timeoutMs: 5000 }));
  t.is(err.failure, 'unresolved');
  t.is(err.message, 'cannot resolve nope.default.svc: NXDOMAIN (resolver: cluster DNS 10.96.0.10:53)');
});

test('an agent without a resolve handler answers with an error; an answer without addresses is unresolved', async (t) => {
  const pair = pairWith(undefined);
  t.teardown(() => pair.close());
  const err = await rejection(pair.server.resolve('x.svc', { timeoutMs: 5000 }));
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /does not resolve names/);
  const empty = pairWith(() => Promise.resolve({ addresses: ['not-an-ip'], resolver: 'system resolver' }));
  t.teardown(() => empty.close());
  const none = await rejection(empty.server.resolve('y.example', { timeoutMs: 5000 }));
  t.is(none.message, 'cannot resolve y.example: no addresses (resolver: system resolver)');
});

test('the agent keeps its answer within the packet bounds: 16 IP literals, texts of 256 bytes', async (t) => {
  const many = Array.from({ length: 40 }, (_, i) => (i % 2 ? `10.0.0.${i}` : `bogus-${i}`));
  const pair = pairWith(() => Promise.resolve({ addresses: many, resolver: 'é'.repeat(300) }));
  t.teardown(() => pair.close());
  const got = await pair.server.resolve('big.example', { timeoutMs: 5000 });
  t.is(got.addresses.length, 16);
  t.true(got.addresses.every((a) => a.startsWith('10.0.0.')));
  // The server bounds peer text for its own messages, too.
  t.true(got.resolver.length < 120, got.resolver);
  const long = pairWith(() => Promise.reject(new Error('x'.repeat(10_000))));
  t.teardown(() => long.close());
  const err = await rejection(long.server.resolve('long.example', { timeoutMs: 5000 }));
  t.true(err.message.length < 400, `${err.message.length} characters`);
});

test('an agent that does not answer in time: unresolved naming the timeout; its late answer is dropped', async (t) => {
  const held = heldHandler();
  const pair = pairWith(held.handler);
  t.teardown(() => pair.close());
  const err = await rejection(pair.server.resolve('slow.example', { timeoutMs: 100 }));
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /slow\.example: the agent did not answer within 100 ms/);
  // The agent was told the asker's timeout, and gives up too (its handler is cancelled).
  await waitFor(() => held.calls.length === 1 && held.calls[0].signal.aborted, 'the agent to cancel its lookup');
  held.calls[0].answer({ addresses: ['10.0.0.1'], resolver: 'late' });
  t.false(pair.link.a.sent.some((p) => p.type === PacketType.KANAL_RESOLVE_RSP));
});

test('a requester cancel rejects at once', async (t) => {
  const held = heldHandler();
  const pair = pairWith(held.handler);
  t.teardown(() => pair.close());
  const cancel = new Cancel();
  const pending = rejection(pair.server.resolve('c.example', { timeoutMs: 10_000, signal: cancel }));
  await waitFor(() => held.calls.length === 1, 'the request to reach the agent');
  cancel.abort();
  t.is((await pending).failure, 'cancelled');
  const aborted = new Cancel();
  aborted.abort();
  t.is((await rejection(pair.server.resolve('d.example', { timeoutMs: 1000, signal: aborted }))).failure, 'cancelled');
});

test(`at most ${MAX_PENDING_RESOLVES} resolves pending per tunnel: the next is exhausted, before the agent is asked`, async (t) => {
  const held = heldHandler();
  const pair = pairWith(held.handler);
  t.teardown(() => pair.close());
  const pending = Array.from({ length: MAX_PENDING_RESOLVES }, (_, i) =>
    pair.server.resolve(`n${i}.example`, { timeoutMs: 10_000 }).then(
      (a) => a,
      (err: unknown) => err,
    ),
  );
  const err = await rejection(pair.server.resolve('one-more.example', { timeoutMs: 10_000 }));
  t.is(err.failure, 'exhausted');
  t.regex(err.message, /one-more\.example: 64 names are being resolved/);
  await waitFor(() => held.calls.length === MAX_PENDING_RESOLVES, 'all 64 to reach the agent');
  for (const c of held.calls) c.answer({ addresses: ['10.1.1.1'], resolver: 'system resolver' });
  const all = await Promise.all(pending);
  t.true(all.every((a) => !(a instanceof Error)));
  // Room again once answered.
  await waitFor(() => held.calls.length === MAX_PENDING_RESOLVES, 'settled');
  const again = pair.server.resolve('again.example', { timeoutMs: 10_000 });
  await waitFor(() => held.calls.length === MAX_PENDING_RESOLVES + 1, 'the next request to go out');
  held.calls[MAX_PENDING_RESOLVES].answer({ addresses: ['10.1.1.2'], resolver: 'system resolver' });
  t.deepEqual((await again).addresses, ['10.1.1.2']);
});

test(`the agent resolves at most ${MAX_CONCURRENT_RESOLVES} at once and answers the rest with an error at once`, async (t) => {
  const held = heldHandler();
  const link = createMemoryLink();
  const logs = captureLogger();
  const agent = new Tunnel(link.a, { side: 'agent', features: ALL_FEATURES, log: logs.log, resolveHandler: held.handler });
  t.teardown(() => agent.close());
  link.b.on('packet', () => undefined);
  for (let i = 1; i <= MAX_CONCURRENT_RESOLVES + 1; i++)
    link.b.send({ type: PacketType.KANAL_RESOLVE_REQ, requestID: BigInt(i), name: `n${i}.example`, timeoutMs: 10_000 });
  const refused = await nextPacket(link.b, PacketType.KANAL_RESOLVE_RSP);
  t.is(refused.requestID, BigInt(MAX_CONCURRENT_RESOLVES + 1));
  t.regex(refused.error, /64 names are being resolved already/);
  t.is(held.calls.length, MAX_CONCURRENT_RESOLVES);
  held.calls[0].answer({ addresses: ['10.2.0.1'], resolver: 'system resolver', ttlSeconds: 5 });
  const answered = await nextPacket(link.b, PacketType.KANAL_RESOLVE_RSP);
  t.like(answered, { requestID: 1n, addresses: ['10.2.0.1'], error: '', resolver: 'system resolver', ttl: 5 });
  // Closing the tunnel cancels every lookup, and nothing more is answered.
  agent.close();
  t.true(held.calls.slice(1).every((c) => c.signal.aborted));
});

test('closing the tunnel rejects every pending resolve with tunnel-closed; resolve on a closed tunnel too', async (t) => {
  const held = heldHandler();
  const pair = pairWith(held.handler);
  t.teardown(() => pair.close());
  const pending = [1, 2, 3].map((i) => rejection(pair.server.resolve(`p${i}.example`, { timeoutMs: 10_000 })));
  await waitFor(() => held.calls.length === 3, 'the requests to reach the agent');
  pair.server.close();
  for (const err of await Promise.all(pending)) {
    t.is(err.failure, 'tunnel-closed');
    t.regex(err.message, /cannot resolve p\d\.example: tunnel closed/);
  }
  t.is((await rejection(pair.server.resolve('after.example', { timeoutMs: 1000 }))).failure, 'tunnel-closed');
  await waitFor(() => held.calls.every((c) => c.signal.aborted), "the agent's lookups to be cancelled");
});

test('a lost stream (resume) rejects pending resolves at once rather than replaying them', async (t) => {
  const held = heldHandler();
  const pair = tunnelPair({
    features: ALL_FEATURES,
    agentOptions: { resolveHandler: held.handler, resumeTimeoutMs: 60_000 },
    serverOptions: { resumeTimeoutMs: 60_000 },
  });
  t.teardown(() => pair.close());
  const pending = rejection(pair.server.resolve('lost.example', { timeoutMs: 10_000 }));
  await waitFor(() => held.calls.length === 1, 'the request to reach the agent');
  pair.link.b.destroy(new Error('cut'));
  const err = await pending;
  t.is(err.failure, 'tunnel-closed');
  t.regex(err.message, /lost\.example: the tunnel's stream was lost/);
  await waitFor(() => pair.server.detached && pair.agent.detached, 'both sides to detach');
  t.true(held.calls[0].signal.aborted);
});

test('a malformed answer (17 addresses) is ignored like any malformed packet; the request times out', async (t) => {
  const link = createMemoryLink();
  const logs = captureLogger();
  const server = new Tunnel(link.b, { side: 'server', features: ALL_FEATURES, log: logs.log });
  t.teardown(() => server.close());
  link.a.on('packet', (p) => {
    if (p.type !== PacketType.KANAL_RESOLVE_REQ) return;
    // Built by hand: encodePacket writes what it is given; the decoder refuses it.
    const bad = encodePacket({
      type: PacketType.KANAL_RESOLVE_RSP,
      requestID: p.requestID,
      addresses: Array.from({ length: 17 }, (_, i) => `10.3.0.${i}`),
      error: '',
      resolver: 'flood',
    });
    link.a.sendRaw(bad);
  });
  const err = await rejection(server.resolve('flood.example', { timeoutMs: 300 }));
  t.is(err.failure, 'unresolved');
  t.regex(err.message, /did not answer within 300 ms/);
  t.true(logs.lines.some((l) => /malformed/.test(l.msg) && /more than 16 elements/.test(JSON.stringify(l))));
});

test('resolve packets without the negotiated feature are ignored', async (t) => {
  const held = heldHandler();
  const link = createMemoryLink();
  const logs = captureLogger();
  const agent = new Tunnel(link.a, { side: 'agent', features: NO_RESOLVE, log: logs.log, resolveHandler: held.handler });
  t.teardown(() => agent.close());
  link.b.on('packet', () => undefined);
  link.b.send({ type: PacketType.KANAL_RESOLVE_REQ, requestID: 5n, name: 'x.example' });
  await waitFor(() => logs.lines.some((l) => /feature was not negotiated/.test(l.msg)), 'the warning');
  t.is(held.calls.length, 0);
  t.false(link.a.sent.some((p) => p.type === PacketType.KANAL_RESOLVE_RSP));
});

test('a name longer than 253 bytes or empty is refused here', async (t) => {
  const pair = pairWith(() => Promise.resolve({ addresses: ['10.0.0.1'], resolver: 'x' }));
  t.teardown(() => pair.close());
  t.is((await rejection(pair.server.resolve('a'.repeat(254), { timeoutMs: 1000 }))).failure, 'unresolved');
  t.is((await rejection(pair.server.resolve('', { timeoutMs: 1000 }))).failure, 'unresolved');
});
