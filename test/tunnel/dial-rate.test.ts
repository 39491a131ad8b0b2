/**
 * The dial rate of a tunnel (TunnelLimits.dialRate, --dial-rate-per-agent on
 * the server, --dial-rate on the agent; docs/limits.md): a token bucket per
 * direction. Dials over it are refused at once (never queued), named as
 * throttled, counted once each, and the bucket refills at its rate.
 */
import test from 'ava';
import { PassThrough } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { DialRate } from '../../src/domain/dial-rate.js';
import { DialError } from '../../src/tunnel/errors.js';
import type { InboundDialFailure } from '../../src/tunnel/tunnel-options.js';
import type { RefusalReason } from '../../src/domain/refusal-reason.js';
import { PacketType } from '../../src/wire/packet.js';
import { ALL_FEATURES } from '../../src/wire/features.js';
import { nextPacket, tunnelPair } from '../helpers/memory-stream.js';

test('DialRate: a burst at once, then one token per 1/rate s, never above the burst; 0 means no limit', (t) => {
  let now = 0;
  const rate = new DialRate(2, 3, () => now);
  t.deepEqual([rate.take(), rate.take(), rate.take(), rate.take()], [true, true, true, false]);
  now += 499;
  t.false(rate.take(), 'not a whole token after 499 ms at 2/s');
  now += 1;
  t.true(rate.take(), 'a whole token after 500 ms');
  t.false(rate.take());
  now += 60_000;
  t.deepEqual([rate.take(), rate.take(), rate.take(), rate.take()], [true, true, true, false], 'refilled to the burst, not beyond');
  rate.configure(2, 1);
  now += 60_000;
  t.deepEqual([rate.take(), rate.take()], [true, false], 'a smaller burst caps what was saved');
  const open = new DialRate(0, 1, () => now);
  t.true(Array.from({ length: 1000 }, () => open.take()).every(Boolean));
  t.is(rate.describe(), '2 dials/s, burst 1');
});

/** A dial handler that connects every dial to a stream nobody reads. */
const connectingHandler = () => Promise.resolve(new PassThrough());

test('our dials over the rate fail at once as exhausted, before a DIAL_REQ; exactly the burst gets through, and the rate refills', async (t) => {
  const limits: RefusalReason[] = [];
  let requests = 0;
  const pair = tunnelPair({
    features: ALL_FEATURES,
    serverDialHandler: () => {
      requests++;
      return connectingHandler();
    },
    agentOptions: {
      limits: { dialRate: 1, dialBurst: 4 },
      limitFlags: { dialRate: '--dial-rate' },
      refusalReasons: { dialRate: 'throttled' },
      onLimit: (_limit, reason) => {
        if (reason) limits.push(reason);
      },
    },
  });
  t.teardown(() => pair.close());
  const first = await Promise.allSettled(Array.from({ length: 10 }, (_, i) => pair.agent.dial(`h:${i + 1}`, { timeoutMs: 5000 })));
  const ok = first.filter((r) => r.status === 'fulfilled');
  const refused = first.flatMap((r) => (r.status === 'rejected' ? [r.reason as DialError] : []));
  t.is(ok.length, 4);
  t.is(refused.length, 6);
  for (const err of refused) {
    t.true(err instanceof DialError);
    t.is(err.failure, 'exhausted');
    t.is(err.refusal, 'throttled');
    t.is(err.message, 'too many dials: faster than 1 dials/s, burst 4 (--dial-rate)');
  }
  t.deepEqual(limits, Array<RefusalReason>(6).fill('throttled'));
  t.is(requests, 4, 'a throttled dial costs the peer nothing');

  // Load stops: 2.5 s later two tokens have come back (one a second), and only two.
  await sleep(2500);
  const second = await Promise.allSettled(Array.from({ length: 5 }, (_, i) => pair.agent.dial(`h:${i + 20}`, { timeoutMs: 5000 })));
  t.is(second.filter((r) => r.status === 'fulfilled').length, 2);
  t.is(requests, 6);
});

test("the peer's dials over the rate are answered with a DIAL_RSP error at once, reported once each with their dial ID, and not performed", async (t) => {
  const failures: InboundDialFailure[] = [];
  let performed = 0;
  const pair = tunnelPair({
    features: ALL_FEATURES,
    serverDialHandler: () => {
      performed++;
      return connectingHandler();
    },
    serverOptions: {
      limits: { dialRate: 1, dialBurst: 3 },
      refusalReasons: { dialRate: 'throttled' },
      limitFlags: { dialRate: '--dial-rate-per-agent' },
      onInboundDialFailed: (f) => failures.push(f),
    },
  });
  t.teardown(() => pair.close());
  // Sent raw: the agent's own (unlimited here) dialer is not in the way.
  const answers = Array.from({ length: 8 }, (_, i) => nextPacket(pair.link.a, PacketType.DIAL_RSP, (p) => p.random === BigInt(100 + i)));
  for (let i = 0; i < 8; i++)
    pair.link.a.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: `h:${i + 1}`, random: BigInt(100 + i) });
  const rsps = await Promise.all(answers);
  t.is(rsps.filter((p) => p.error === '').length, 3);
  const errors = rsps.filter((p) => p.error !== '');
  t.is(errors.length, 5);
  for (const p of errors) t.is(p.error, 'too many dials: faster than 1 dials/s, burst 3 (--dial-rate-per-agent)');
  t.is(performed, 3);
  t.is(failures.length, 5);
  t.deepEqual(failures.map((f) => f.dialID).sort(), errors.map((p) => p.random).sort());
  for (const f of failures) {
    t.is(f.reason, 'throttled');
    t.is(f.result, 'exhausted');
    t.is(f.error, 'too many dials: faster than 1 dials/s, burst 3 (--dial-rate-per-agent)');
  }
});
