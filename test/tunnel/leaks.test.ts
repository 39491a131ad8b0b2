/**
 * No leaks in the multiplexer: after thousands of dial/close cycles and
 * hundreds of cancellations mid-dial, every table is empty on both sides
 * and the process holds no more timers, immediates or handles than before.
 */
import test from 'ava';
import { PassThrough, type Duplex } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import type { DialHandler, InboundDial, Tunnel } from '../../src/tunnel/tunnel.js';
import { DialError } from '../../src/tunnel/errors.js';
import { ALL_FEATURES, NO_FEATURES } from '../../src/wire/features.js';
import { PacketType } from '../../src/wire/packet.js';
import { tunnelPair, waitFor } from '../helpers/memory-stream.js';
import { dialStream } from '../helpers/connection-stream.js';

function resourceCounts(): Map<string, number> {
  const counts = new Map<string, number>();
  for (const r of process.getActiveResourcesInfo()) counts.set(r, (counts.get(r) ?? 0) + 1);
  return counts;
}

/** Waits (bounded) until the active resources are back to `baseline` by type, and returns the last difference. */
async function settleTo(baseline: Map<string, number>): Promise<string[]> {
  let diff: string[] = [];
  for (let i = 0; i < 100; i++) {
    await sleep(20);
    const now = resourceCounts();
    diff = [];
    for (const type of new Set([...baseline.keys(), ...now.keys()])) {
      const extra = (now.get(type) ?? 0) - (baseline.get(type) ?? 0);
      if (extra > 0) diff.push(`${type} +${extra}`);
    }
    if (diff.length === 0) return diff;
  }
  return diff;
}

const zero = { connections: 0, pendingDials: 0, inboundDials: 0, windowGrowthBytes: 0, readPaused: false, detached: false };

/** Echo endpoints for "echo:*", dials that hang until aborted for "hang:*", refusals for "refuse:*". */
function handler(hung: InboundDial[]): DialHandler {
  return (dial) => {
    if (dial.address.startsWith('echo')) return Promise.resolve<Duplex>(new PassThrough());
    if (dial.address.startsWith('refuse')) return Promise.reject(new Error('connection refused'));
    hung.push(dial);
    return new Promise<Duplex>((_resolve, reject) => {
      dial.signal.addEventListener('abort', () => reject(new DialError('cancelled', 'aborted')), { once: true });
    });
  };
}

async function echoCycle(dialer: Tunnel, i: number): Promise<void> {
  const conn = await dialStream(dialer, `echo:${i}`, { timeoutMs: 5000 });
  const text = `cycle ${i}`;
  const echoed = new Promise<string>((resolve, reject) => {
    conn.once('data', (c: Buffer) => resolve(c.toString()));
    conn.once('error', reject);
  });
  conn.write(text);
  if ((await echoed) !== text) throw new Error(`cycle ${i}: bad echo`);
  // Alternate the ways a connection ends: abrupt destroy, and graceful end.
  const closed = new Promise<void>((resolve) => conn.once('close', () => resolve()));
  if (i % 2 === 0) conn.destroy();
  else {
    conn.resume();
    conn.end();
  }
  await closed;
}

async function inBatches(total: number, width: number, fn: (i: number) => Promise<void>): Promise<void> {
  for (let start = 0; start < total; start += width) {
    await Promise.all(Array.from({ length: Math.min(width, total - start) }, (_, k) => fn(start + k)));
  }
}

for (const [name, features] of [
  ['all features', ALL_FEATURES],
  ['plain Konnectivity', NO_FEATURES],
] as const) {
  test.serial(`${name}: 2,000 dial/close cycles and 500 cancellations leave empty tables and no extra resources`, async (t) => {
    const baseline = resourceCounts();
    const hung: InboundDial[] = [];
    const pair = tunnelPair({ features, agentDialHandler: handler(hung), serverDialHandler: handler(hung), logLevel: 'info' });
    t.teardown(() => pair.close());

    // 2,000 dial/echo/close cycles, both directions, 20 at a time.
    await inBatches(2000, 20, (i) => echoCycle(i % 2 === 0 ? pair.agent : pair.server, i));
    await waitFor(() => pair.agent.stats().connections === 0 && pair.server.stats().connections === 0, 'connections closed', 10_000);

    // 500 cancellations mid-dial: the performer has started dialling each one.
    let cancelled = 0;
    let timedOut = 0;
    await inBatches(500, 50, async (i) => {
      const dialer = i % 2 === 0 ? pair.agent : pair.server;
      const seenBefore = hung.length;
      if (i % 5 === 4) {
        // Every fifth one times out instead of being aborted.
        const err = await dialStream(dialer, `hang:${i}`, { timeoutMs: 30 }).then(
          () => undefined,
          (e: unknown) => e,
        );
        if (err instanceof DialError && err.failure === 'timeout') timedOut++;
        return;
      }
      const abort = new AbortController();
      const dialing = dialStream(dialer, `hang:${i}`, { timeoutMs: 5000, signal: abort.signal });
      await waitFor(() => hung.length > seenBefore && hung.some((d) => d.address === `hang:${i}`), 'performer started', 5000);
      abort.abort();
      const err = await dialing.then(
        () => undefined,
        (e: unknown) => e,
      );
      if (err instanceof DialError && err.failure === 'cancelled') cancelled++;
    });
    t.is(cancelled, 400);
    t.is(timedOut, 100);
    await waitFor(() => hung.every((d) => d.signal.aborted), 'every performer aborted', 5000);
    t.is(hung.length, 500);

    // And some refusals for good measure.
    await inBatches(100, 50, async (i) => {
      const err = await dialStream(pair.agent, `refuse:${i}`, { timeoutMs: 5000 }).then(
        () => undefined,
        (e: unknown) => e,
      );
      if (!(err instanceof DialError) || err.failure !== 'refused') throw new Error(`refusal ${i}: ${String(err)}`);
    });

    await waitFor(
      () => [pair.agent.stats(), pair.server.stats()].every((s) => s.connections === 0 && s.pendingDials === 0 && s.inboundDials === 0),
      'all tables empty',
      5000,
    );
    t.deepEqual(pair.agent.stats(), zero);
    t.deepEqual(pair.server.stats(), zero);
    t.false(pair.agent.closed || pair.server.closed);
    // 2,000 connections, 500 cancellations, nothing left: 500 DIAL_CLS were sent.
    const dialCls = [...pair.link.a.sent, ...pair.link.b.sent].filter((p) => p.type === PacketType.DIAL_CLS).length;
    t.is(dialCls, 500);

    // The tunnels are idle: no timers, immediates or handles beyond the baseline.
    const leftover = await settleTo(baseline);
    t.deepEqual(leftover, [], `active resources beyond baseline: ${leftover.join(', ')}`);

    // Closing the tunnels leaves nothing either.
    pair.close();
    await waitFor(() => pair.agent.closed && pair.server.closed, 'closed');
    t.deepEqual(await settleTo(baseline), []);
  });
}
