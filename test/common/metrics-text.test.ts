import test from 'ava';
import { Counter, Histogram, Registry } from 'prom-client';
import { mergeExpositions, renderEach } from '../../src/common/metrics-text.js';

function tenantRegistry(tenant: string): Registry {
  const registry = new Registry();
  registry.setDefaultLabels({ tenant });
  const dials = new Counter({ name: 'dials_total', help: 'Dials', labelNames: ['result'], registers: [registry] });
  const seconds = new Histogram({ name: 'dial_seconds', help: 'Dial time', buckets: [0.1, 1], registers: [registry] });
  dials.inc({ result: 'ok' });
  seconds.observe(0.5);
  return registry;
}

test("several registries merge into one exposition: each family once with every registry's samples, histograms kept whole", async (t) => {
  const texts = await renderEach([tenantRegistry('a'), tenantRegistry('b')]);
  const merged = mergeExpositions(texts);
  const lines = merged.trimEnd().split('\n');
  t.is(lines.filter((l) => l === '# HELP dials_total Dials').length, 1, 'HELP once');
  t.is(lines.filter((l) => l === '# TYPE dial_seconds histogram').length, 1, 'TYPE once');
  t.true(lines.includes('dials_total{result="ok",tenant="a"} 1'));
  t.true(lines.includes('dials_total{result="ok",tenant="b"} 1'));
  // Every sample of a family follows its TYPE line, before the next family's HELP.
  const family = (name: string): string[] => {
    const start = lines.indexOf(`# HELP ${name} ${name === 'dials_total' ? 'Dials' : 'Dial time'}`);
    const next = lines.findIndex((l, i) => i > start && l.startsWith('# HELP'));
    return lines.slice(start, next < 0 ? lines.length : next);
  };
  const histogram = family('dial_seconds');
  t.is(histogram.filter((l) => l.startsWith('dial_seconds_bucket')).length, 6, 'three buckets of each tenant');
  t.is(histogram.filter((l) => l.startsWith('dial_seconds_count')).length, 2);
  t.is(family('dials_total').filter((l) => l !== '' && !l.startsWith('#')).length, 2);
});

test('a registry rendered alone and merged alone is the same text', async (t) => {
  const r = tenantRegistry('a');
  t.is(mergeExpositions([await r.metrics()]), await r.metrics());
});
