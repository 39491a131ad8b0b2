/**
 * Dial allowances kept per identity across its tunnels (tunnel/dial-allowances.ts,
 * docs/limits.md): one bucket and one set of counts for every tunnel of an
 * identity, kept after its last tunnel until the buckets are full again, a
 * new identity of a full group no fuller than its most drained member, and a
 * bounded table whose overflow never resets an entry. A fake clock throughout.
 */
import test from 'ava';
import { PassThrough } from 'node:stream';
import { DialAllowance, type DialHoldings } from '../../src/tunnel/dial-allowance.js';
import { DialAllowances } from '../../src/tunnel/dial-allowances.js';
import { DialError } from '../../src/tunnel/errors.js';
import { AgentRegistry } from '../../src/server/agents/agent-registry.js';
import { unauthenticatedCredential } from '../../src/server/identity/agent-credential.js';
import { ALL_FEATURES } from '../../src/wire/features.js';
import { tunnelPair, waitFor } from '../helpers/memory-stream.js';

const LIMITS = { dialRate: 1, dialBurst: 5 };
const NOTHING: DialHoldings = { inboundPending: 0, inboundConnections: 0, outboundPending: 0, outboundConnections: 0 };

function clock(): { now: () => number; advance(ms: number): void } {
  let t = 0;
  return { now: () => t, advance: (ms) => (t += ms) };
}

/** Takes from `a`'s outbound bucket until it refuses; how many it gave. */
function drain(a: DialAllowance, max = 1000): number {
  let n = 0;
  while (n < max && a.outbound.take()) n++;
  return n;
}

test('one identity gets one allowance whatever its tunnels; its counts are the sum of theirs', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  const a = table.allowanceFor('cred', 'node-1', LIMITS);
  t.is(table.allowanceFor('cred', 'node-1', LIMITS), a, 'a second tunnel, or a reconnect, gets the same one');
  t.not(table.allowanceFor('cred', 'node-2', LIMITS), a);
  t.not(table.allowanceFor('other', 'node-1', LIMITS), a, 'the same agentID under another credential is another agent');
  const leaveA = a.join(() => ({ ...NOTHING, inboundPending: 2, outboundConnections: 3 }));
  const leaveB = a.join(() => ({ ...NOTHING, inboundPending: 1, inboundConnections: 4 }));
  t.deepEqual(a.holdings(), { inboundPending: 3, inboundConnections: 4, outboundPending: 0, outboundConnections: 3 });
  leaveA();
  leaveA();
  t.deepEqual(a.holdings(), { ...NOTHING, inboundPending: 1, inboundConnections: 4 });
  leaveB();
  t.false(a.inUse);
});

test('an identity without a tunnel keeps its bucket until it is full again, then is forgotten', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  const a = table.allowanceFor('cred', 'node-1', LIMITS);
  const leave = a.join(() => NOTHING);
  t.is(drain(a), 5);
  leave();
  c.advance(2000);
  table.sweep(true);
  t.is(table.size, 1, 'kept: two tokens back of five');
  const again = table.allowanceFor('cred', 'node-1', LIMITS);
  t.is(again, a, 'the reconnect finds what it left');
  t.is(drain(again), 2, 'and no more than the refill');
  const leaveAgain = again.join(() => NOTHING);
  c.advance(60_000);
  table.sweep(true);
  t.is(table.size, 1, 'never forgotten while a tunnel uses it, however long');
  leaveAgain();
  c.advance(60_000);
  table.sweep(true);
  t.is(table.size, 0, 'full again and unused: forgotten');
  t.is(drain(table.allowanceFor('cred', 'node-1', LIMITS)), 5, 'a new one, full, as the old one would have been');
});

test('the sweep runs at most once a second on its own, and forgets unlimited identities as soon as they are unused', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  for (let i = 0; i < 10; i++) table.allowanceFor('cred', `n-${i}`, { dialRate: 0, dialBurst: 100 }).join(() => NOTHING)();
  // The first lookup swept (nothing was unused yet); the rest wait for the next sweep.
  t.is(table.size, 10);
  table.sweep();
  t.is(table.size, 10, 'not again within the second');
  c.advance(1000);
  table.sweep();
  t.is(table.size, 0);
});

test('a new agentID of a credential at its bound starts no fuller than the drained one it replaces', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  const first = table.allowanceFor('cred', 'node-1', LIMITS);
  drain(first);
  first.join(() => NOTHING)();
  let total = 5;
  // A node announcing a new agentID at each reconnect, bound one agent per credential.
  for (let i = 0; i < 50; i++) {
    c.advance(100);
    const next = table.allowanceFor('cred', `invented-${i}`, LIMITS, 1);
    total += drain(next);
    next.join(() => NOTHING)();
  }
  t.true(total <= 5 + 5 + 1, `${total} dials in 5 s at 1/s burst 5`);
  t.is(table.size, 1, 'the group stays at its bound');
  c.advance(1000);
  t.is(drain(table.allowanceFor('cred', 'node-1', LIMITS, 1)), 1, 'the first, back, inherits too');
  // Another credential is untouched.
  t.is(drain(table.allowanceFor('other', 'node-9', LIMITS, 1)), 5);
  // Below its bound a group's new agents are full: a shared credential's honest nodes are not each other's.
  const shared = new DialAllowances({ now: c.now });
  drain(shared.allowanceFor('daemonset', 'a', LIMITS, 3));
  t.is(drain(shared.allowanceFor('daemonset', 'b', LIMITS, 3)), 5);
});

test('a new identity of a full group never takes the place of one a tunnel uses', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  const live = table.allowanceFor('cred', 'node-1', LIMITS);
  live.join(() => NOTHING);
  drain(live);
  const next = table.allowanceFor('cred', 'node-2', LIMITS, 1);
  t.is(drain(next), 0, 'inherits the live one');
  t.is(table.allowanceFor('cred', 'node-1', LIMITS, 1), live, 'which stays');
  t.is(table.size, 2);
});

test('a full table makes newcomers share one overflow allowance; no entry is reset or displaced', (t) => {
  const c = clock();
  const table = new DialAllowances({ maxEntries: 3, now: c.now });
  const leaves: (() => void)[] = [];
  const held = ['a', 'b', 'c'].map((id) => {
    const a = table.allowanceFor(id, id, LIMITS);
    leaves.push(a.join(() => NOTHING));
    drain(a);
    return a;
  });
  const o1 = table.allowanceFor('d', 'd', LIMITS);
  const o2 = table.allowanceFor('e', 'e', LIMITS);
  t.is(o1, o2, 'newcomers share');
  t.false(held.includes(o1));
  t.is(table.size, 3);
  const leave = o1.join(() => NOTHING);
  t.true(table.overflowing);
  t.is(drain(o1), 5, 'one burst for all of them');
  t.is(drain(o2), 0);
  for (const [i, id] of ['a', 'b', 'c'].entries()) t.is(table.allowanceFor(id, id, LIMITS), held[i], `${id} kept its own`);
  leave();
  // Once an entry is unused and full again, a newcomer gets its own.
  leaves[0]();
  c.advance(4000);
  t.is(table.allowanceFor('f', 'f', LIMITS), o1, 'not yet: a has four tokens of five back');
  c.advance(1000);
  const own = table.allowanceFor('f', 'f', LIMITS);
  t.false(held.includes(own));
  t.not(own, o1);
  t.is(table.size, 3);
});

test('a reload changes the rate of an identity known already, keeping its tokens', (t) => {
  const c = clock();
  const table = new DialAllowances({ now: c.now });
  const a = table.allowanceFor('cred', 'node-1', LIMITS);
  t.is(drain(a, 2), 2);
  t.is(table.allowanceFor('cred', 'node-1', { dialRate: 1, dialBurst: 2 }), a);
  t.is(drain(a), 2, 'three were left; the new burst caps them at two');
});

test('the registry keeps one allowance per credential + agentID, bounded by --max-agents-per-credential', (t) => {
  const c = clock();
  const registry = new AgentRegistry(1, Number.POSITIVE_INFINITY, new DialAllowances({ now: c.now }));
  const cred = unauthenticatedCredential('10.0.0.1');
  const a = registry.allowanceFor(cred, 'node-1', LIMITS);
  t.is(registry.allowanceFor(unauthenticatedCredential('10.0.0.1'), 'node-1', LIMITS), a, 'keyed by the credential, not the object');
  drain(a);
  a.join(() => NOTHING)();
  t.is(drain(registry.allowanceFor(cred, 'node-2', LIMITS)), 0, 'a new agentID of the same node inherits');
  t.is(drain(registry.allowanceFor(unauthenticatedCredential('10.0.0.2'), 'node-1', LIMITS)), 5);
});

test('tunnels sharing an allowance share its counts: a dial refused by one tunnel for what the other holds, allowed once that one closes', async (t) => {
  const shared = new DialAllowance({ limits: { dialRate: 0, dialBurst: 1 } });
  const options = { allowance: shared, limits: { maxOutboundConnections: 3 }, limitFlags: { maxOutboundConnections: '--flag' } };
  const pairs = [0, 1].map(() =>
    tunnelPair({ features: ALL_FEATURES, serverDialHandler: () => Promise.resolve(new PassThrough()), agentOptions: options }),
  );
  t.teardown(() => pairs.forEach((p) => p.close()));
  await pairs[0].agent.dial('h:1', { timeoutMs: 5000 });
  await pairs[0].agent.dial('h:2', { timeoutMs: 5000 });
  await pairs[1].agent.dial('h:3', { timeoutMs: 5000 });
  const refused = await t.throwsAsync(pairs[1].agent.dial('h:4', { timeoutMs: 5000 }), { instanceOf: DialError });
  t.is(refused?.failure, 'exhausted');
  t.regex(refused?.message ?? '', /: 3, limit 3 \(--flag\)$/);
  t.deepEqual(shared.holdings(), { inboundPending: 0, inboundConnections: 0, outboundPending: 0, outboundConnections: 3 });
  pairs[0].close();
  await waitFor(() => shared.holdings().outboundConnections === 1, 'the closed tunnel to give its connections back');
  await pairs[1].agent.dial('h:5', { timeoutMs: 5000 });
  pairs[1].close();
  await waitFor(() => !shared.inUse, 'closed tunnels to leave');
});
