/**
 * src/domain/default-metrics.ts registers what prom-client's
 * collectDefaultMetrics does, in its order, with the same help and types;
 * its CPU counters count this process's CPU time.
 */
import test from 'ava';
import { collectDefaultMetrics as promClientDefaults, Registry as PromRegistry } from 'prom-client';
import { collectDefaultMetrics } from '../../src/domain/default-metrics.js';
import { Registry } from '../../src/domain/prom-client.js';

/** The # HELP and # TYPE lines of an exposition: what a scraper learns of each metric. */
async function descriptions(r: PromRegistry): Promise<string[]> {
  return (await r.metrics()).split('\n').filter((l) => l.startsWith('# '));
}

test("the default metrics are prom-client's, named, described and ordered as its own", async (t) => {
  const theirs = new PromRegistry();
  promClientDefaults({ register: theirs, eventLoopMonitoringPrecision: 1000 });
  const ours = new Registry();
  collectDefaultMetrics(ours, { eventLoopMonitoringPrecision: 1000 });
  const expected = await descriptions(theirs);
  t.true(expected.length > 20, 'prom-client registered its default metrics');
  t.deepEqual(await descriptions(ours), expected);
});

test('the CPU counters add the CPU used since the last scrape', async (t) => {
  const r = new Registry();
  collectDefaultMetrics(r);
  const value = async (name: string): Promise<number> => (await r.getSingleMetric(name)!.get()).values[0].value;
  const spin = Date.now() + 30;
  while (Date.now() < spin); // burn some CPU so the counters must move
  const user = await value('process_cpu_user_seconds_total');
  const system = await value('process_cpu_system_seconds_total');
  const total = await value('process_cpu_seconds_total');
  t.true(user > 0, 'user CPU was counted');
  t.true(Math.abs(total - (user + system)) < 0.002, 'the total is user + system');
  // A second scrape adds; it never goes back.
  t.true((await value('process_cpu_user_seconds_total')) >= user);
});
