/** The ring of per-minute counts behind /status's "refusals in the last 1, 5 and 15 minutes" (src/domain/recent-events.ts). */
import test from 'ava';
import { addCounts, RecentEvents } from '../../src/domain/recent-events.js';

const MINUTE = 60_000;

/** A ring on a clock the test moves. */
function ring(): { events: RecentEvents; at: (ms: number) => void } {
  let now = 10 * MINUTE;
  return { events: new RecentEvents(() => now), at: (ms) => (now = ms) };
}

test('an empty ring reports nothing', (t) => {
  t.deepEqual(new RecentEvents().counts(), { refusals: {}, throttles: {} });
});

test('events are counted in every window that holds their minute, refusals apart from throttles', (t) => {
  const { events, at } = ring();
  events.add('destination_not_allowed');
  events.add('destination_not_allowed', 2);
  events.add('read_pause_slow_reader');
  at(13 * MINUTE + 5000);
  events.add('agent_pending_dials');
  const c = events.counts();
  t.deepEqual(c.refusals.destination_not_allowed, { '1m': 0, '5m': 3, '15m': 3 });
  t.deepEqual(c.refusals.agent_pending_dials, { '1m': 1, '5m': 1, '15m': 1 });
  t.deepEqual(c.throttles.read_pause_slow_reader, { '1m': 0, '5m': 1, '15m': 1 });
  t.false('read_pause_slow_reader' in c.refusals, 'a throttle is not a refusal');
});

test('"1m" keeps an event of the previous minute; 16 minutes later it is gone from every window', (t) => {
  const { events, at } = ring();
  at(10 * MINUTE + 59_000);
  events.add('agent_metadata');
  at(11 * MINUTE + 1000);
  t.is(events.counts().refusals.agent_metadata?.['1m'], 1, 'two seconds later it is still in the last minute');
  at(25 * MINUTE + 59_000);
  t.is(events.counts().refusals.agent_metadata?.['15m'], 1, 'fifteen whole minutes later: still in 15m');
  at(26 * MINUTE);
  t.deepEqual(events.counts(), { refusals: {}, throttles: {} });
});

test('a slot reused after the ring went round starts from zero', (t) => {
  const { events, at } = ring();
  events.add('agent_metadata', 5);
  at(26 * MINUTE); // same slot (16 minutes on)
  events.add('agent_metadata');
  t.deepEqual(events.counts().refusals.agent_metadata, { '1m': 1, '5m': 1, '15m': 1 });
});

test('addCounts sums rings window by window', (t) => {
  const a = ring();
  const b = ring();
  a.events.add('agent_metadata');
  b.events.add('agent_metadata', 2);
  b.events.add('stream_closed_peer_not_reading');
  const sum = addCounts(a.events.counts(), b.events.counts());
  t.deepEqual(sum.refusals.agent_metadata, { '1m': 3, '5m': 3, '15m': 3 });
  t.deepEqual(sum.throttles.stream_closed_peer_not_reading, { '1m': 1, '5m': 1, '15m': 1 });
});
