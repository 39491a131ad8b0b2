/**
 * Metrics with held series (src/domain/series-metrics.ts) scrape to the text
 * prom-client's own Counter and Histogram give for the same events: labelled
 * and label-less, default labels (a tenant's registry), series never counted,
 * zero(), remove() and reset() with the series still held afterwards.
 */
import test from 'ava';
import { Counter, Histogram, Registry } from 'prom-client';
import { SeriesCounter, SeriesHistogram } from '../../src/domain/series-metrics.js';

const BUCKETS = [0.001, 0.01, 0.1, 1];

function registries(defaultLabels?: Record<string, string>): { ours: Registry; theirs: Registry } {
  const ours = new Registry();
  const theirs = new Registry();
  if (defaultLabels) {
    ours.setDefaultLabels(defaultLabels);
    theirs.setDefaultLabels(defaultLabels);
  }
  return { ours, theirs };
}

test('a held histogram scrapes as prom-client: labelled, label-less, values on bounds and beyond, default labels', async (t) => {
  for (const defaults of [undefined, { tenant: 'beta' }]) {
    const { ours, theirs } = registries(defaults);
    const h = new SeriesHistogram<'direction'>({
      name: 'h_seconds',
      help: 'h',
      labelNames: ['direction'],
      buckets: BUCKETS,
      registers: [ours],
    });
    const p = new Histogram<'direction'>({
      name: 'h_seconds',
      help: 'h',
      labelNames: ['direction'],
      buckets: BUCKETS,
      registers: [theirs],
    });
    const bare = new SeriesHistogram({ name: 'bare_seconds', help: 'b', registers: [ours] });
    const pBare = new Histogram({ name: 'bare_seconds', help: 'b', registers: [theirs] });
    t.is(await ours.metrics(), await theirs.metrics(), 'nothing observed: the label-less series at zero, no labelled one');

    const held = h.series({ direction: 'cp_to_node' });
    h.series({ direction: 'node_to_cp' }); // held, never observed: not shown
    for (const v of [0.0005, 0.001, 0.002, 0.1, 0.5, 3, 1e9]) {
      held.observe(v);
      p.observe({ direction: 'cp_to_node' }, v);
      bare.observe(v);
      pBare.observe(v);
    }
    h.observe({ direction: 'node_to_cp' }, 0.05);
    p.observe({ direction: 'node_to_cp' }, 0.05);
    h.labels('node_to_cp').observe(0.2);
    p.labels('node_to_cp').observe(0.2);
    held.observe(Number.NaN); // not counted; prom-client would throw
    t.is(await ours.metrics(), await theirs.metrics());
    t.deepEqual(await ours.getMetricsAsJSON(), await theirs.getMetricsAsJSON());
  }
});

test('zero, remove and reset: as prom-client, and a held series counts again afterwards', async (t) => {
  const { ours, theirs } = registries();
  const h = new SeriesHistogram<'r'>({ name: 'h', help: 'h', labelNames: ['r'], buckets: BUCKETS, registers: [ours] });
  const p = new Histogram<'r'>({ name: 'h', help: 'h', labelNames: ['r'], buckets: BUCKETS, registers: [theirs] });
  const held = h.series({ r: 'a' });
  h.zero({ r: 'z' });
  p.zero({ r: 'z' });
  held.observe(0.5);
  p.observe({ r: 'a' }, 0.5);
  t.is(await ours.metrics(), await theirs.metrics(), 'zeroed');
  h.remove({ r: 'a' });
  p.remove({ r: 'a' });
  t.is(await ours.metrics(), await theirs.metrics(), 'removed');
  ours.resetMetrics();
  theirs.resetMetrics();
  t.is(await ours.metrics(), await theirs.metrics(), 'reset');
  held.observe(0.005);
  p.observe({ r: 'a' }, 0.005);
  t.is(await ours.metrics(), await theirs.metrics(), 'the held series after the reset');
  t.throws(() => h.series({ nope: 'x' } as never), { message: /no label nope/ });
});

test('a held counter scrapes as prom-client: its counts folded in at each scrape, inc(0) makes a series, reset', async (t) => {
  const { ours, theirs } = registries({ tenant: 'alpha' });
  const c = new SeriesCounter<'direction' | 'flow'>({ name: 'b_total', help: 'b', labelNames: ['direction', 'flow'], registers: [ours] });
  const p = new Counter<'direction' | 'flow'>({ name: 'b_total', help: 'b', labelNames: ['direction', 'flow'], registers: [theirs] });
  const to = c.series({ direction: 'cp_to_node', flow: 'to_peer' });
  const from = c.series({ direction: 'cp_to_node', flow: 'from_peer' });
  c.series({ direction: 'node_to_cp', flow: 'to_peer' }); // never counted: not shown
  t.is(await ours.metrics(), await theirs.metrics(), 'nothing counted');
  to.inc(100);
  to.inc(5);
  from.inc(0);
  p.inc({ direction: 'cp_to_node', flow: 'to_peer' }, 105);
  p.inc({ direction: 'cp_to_node', flow: 'from_peer' }, 0);
  t.is(await ours.metrics(), await theirs.metrics());
  t.is(await ours.metrics(), await theirs.metrics(), 'a second scrape adds nothing twice');
  to.inc(1);
  c.inc({ direction: 'cp_to_node', flow: 'to_peer' }); // prom-client's own inc still counts
  p.inc({ direction: 'cp_to_node', flow: 'to_peer' }, 2);
  t.is(await ours.metrics(), await theirs.metrics());
  to.inc(7);
  ours.resetMetrics();
  theirs.resetMetrics();
  t.is(await ours.metrics(), await theirs.metrics(), 'reset drops what was pending');
  to.inc(3);
  p.inc({ direction: 'cp_to_node', flow: 'to_peer' }, 3);
  t.deepEqual(await ours.getMetricsAsJSON(), await theirs.getMetricsAsJSON());
});
