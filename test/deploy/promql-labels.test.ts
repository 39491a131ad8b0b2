/** promql-labels.ts: what a PromQL expression needs from a registry, and what it reports missing. */
import test from 'ava';
import { analyse, expandGrafanaIntervals, labelsFromExposition, tokenize, type LabelLookup } from './promql-labels.js';

const EXPOSITION = `# HELP dials_total Dials
# TYPE dials_total counter
dials_total{direction="cp_to_node",result="ok"} 3
dials_total{direction="node_to_cp",result="timeout"} 1
# TYPE dial_seconds histogram
dial_seconds_bucket{direction="cp_to_node",le="0.1"} 1
dial_seconds_bucket{direction="cp_to_node",le="+Inf"} 1
dial_seconds_sum{direction="cp_to_node"} 0.05
dial_seconds_count{direction="cp_to_node"} 1
# TYPE agents gauge
agents{tenant="one"} 1
agents 0
# TYPE refusals_total counter
`;

const registry = labelsFromExposition([EXPOSITION]);
const lookup: LabelLookup = (m) => registry.get(m);
const problems = (expr: string): string[] => analyse(expr, lookup).problems;

test('exposition: label names per series name, target labels added, histograms as their three series', (t) => {
  t.deepEqual([...registry.get('dials_total')!].sort(), ['direction', 'instance', 'job', 'result']);
  t.deepEqual([...registry.get('dial_seconds_bucket')!].sort(), ['direction', 'instance', 'job', 'le']);
  t.deepEqual([...registry.get('dial_seconds_count')!].sort(), ['direction', 'instance', 'job']);
  t.false(registry.has('dial_seconds'), 'a histogram has no series under its own name');
  t.deepEqual([...registry.get('agents')!].sort(), ['instance', 'job', 'tenant'], 'the union over series');
  t.deepEqual([...registry.get('refusals_total')!].sort(), ['instance', 'job'], 'declared, never incremented: no labels known');
  t.throws(() => labelsFromExposition(['{bad} 1\n']), { message: /not a sample line/ });
});

test('tokens: durations, numbers, strings with escapes, operators', (t) => {
  t.deepEqual(
    tokenize(`rate(x{a=~"b\\"c"}[1h30m]) > 1e3 # comment`).map((k) => `${k.kind}:${k.text}`),
    [
      'ident:rate',
      'op:(',
      'ident:x',
      'op:{',
      'ident:a',
      'op:=~',
      'string:b"c',
      'op:}',
      'op:[',
      'duration:1h30m',
      'op:]',
      'op:)',
      'op:>',
      'number:1e3',
    ],
  );
  t.throws(() => tokenize('x{a="b}'), { message: /unterminated string/ });
  t.throws(() => tokenize('rate(x[$unknown])'), { message: /unexpected "\$"/ });
});

test("Grafana's interval variables become durations; others stay", (t) => {
  t.is(expandGrafanaIntervals('rate(x{job=~"$job"}[$__rate_interval]) [${__interval}]'), 'rate(x{job=~"$job"}[5m]) [1m]');
});

test('a well-formed query against the registry has no problems, and its selectors are listed', (t) => {
  const a = analyse(
    `histogram_quantile(0.99, sum by (le, direction) (rate(dial_seconds_bucket{job=~"$job", direction="cp_to_node"}[$__rate_interval])))
     / on (direction) group_left sum by (direction) (rate(dials_total{result!="ok"}[5m]))`,
    lookup,
  );
  t.deepEqual(a.problems, []);
  t.deepEqual(
    a.selectors.map((s) => s.metric),
    ['dial_seconds_bucket', 'dials_total'],
  );
  t.deepEqual(a.selectors[1].matchers, [{ label: 'result', op: '!=', value: 'ok' }]);
});

test('an unknown metric and a matcher on a label the metric lacks are reported', (t) => {
  t.deepEqual(problems('rate(dials_totl[5m])'), ['dials_totl: no such metric']);
  t.deepEqual(problems('dials_total{reason="x"}'), ['dials_total{reason="x"}: dials_total has no label reason']);
  t.deepEqual(problems('{__name__="agents", tenant="one"}'), [], 'a name given as __name__');
  // Spelt-out alternatives: each must exist and have the matchers' labels; the result carries what all carry.
  t.deepEqual(problems('sum by (job) ({__name__=~"agents|dials_total"})'), []);
  t.deepEqual(problems('sum by (tenant) ({__name__=~"agents|dials_total"})'), ['sum by (tenant): no such label among instance, job']);
  t.deepEqual(problems('{__name__=~"agents|nothing", job="x"}'), ['nothing: no such metric']);
  t.deepEqual(problems('{__name__=~"agents|dials_total", tenant="one"}'), ['dials_total{tenant="one"}: dials_total has no label tenant']);
  t.is(problems('{__name__=~"agent.*"}').length, 1, 'a pattern is not a list of names');
});

test('grouping labels are checked against what the aggregated expression carries', (t) => {
  t.deepEqual(problems('sum by (direction) (rate(dials_total[5m]))'), []);
  t.deepEqual(problems('sum(rate(dials_total[5m])) by (reason)'), [
    'sum by (reason): no such label among direction, instance, job, result',
  ]);
  // The outer sum sees only what the inner kept.
  t.deepEqual(problems('max by (result) (sum by (direction) (dials_total))'), ['max by (result): no such label among direction']);
  t.deepEqual(problems('sum without (result) (dials_total) / sum without (le) (dial_seconds_count)'), [
    'sum without (le): no such label among direction, instance, job',
  ]);
  t.deepEqual(problems('topk by (direction) (3, dials_total)'), []);
});

test('histogram_quantile needs le: a _bucket series has it, a _count does not, nor a sum that dropped it', (t) => {
  t.deepEqual(problems('histogram_quantile(0.5, rate(dial_seconds_bucket[5m]))'), []);
  t.deepEqual(problems('histogram_quantile(0.5, rate(dial_seconds_count[5m]))'), [
    "histogram_quantile: its histogram's le: no such label among direction, instance, job",
  ]);
  t.deepEqual(problems('histogram_quantile(0.5, sum by (direction) (rate(dial_seconds_bucket[5m])))'), [
    "histogram_quantile: its histogram's le: no such label among direction",
  ]);
});

test('vector matching: on() on both sides, group_left labels from the one side, results as Prometheus labels them', (t) => {
  t.deepEqual(problems('dials_total / on (job, instance) group_left (tenant) agents'), []);
  t.deepEqual(problems('dials_total / on (tenant) agents'), [
    'on (tenant), left side: no such label among direction, instance, job, result',
  ]);
  t.deepEqual(problems('dials_total * on (direction) group_left (le) sum by (direction) (dial_seconds_count)'), [
    'group_left (le): no such label among direction',
  ]);
  // One-to-one with on(): only the on() labels remain.
  t.deepEqual(problems('sum by (result) (dials_total / on (job, instance) agents)'), [
    'sum by (result): no such label among instance, job',
  ]);
  t.deepEqual(problems('sum by (tenant) (dials_total or agents)'), [], 'or: the union');
  t.deepEqual(
    problems('sum by (direction) (agents and on (job) dials_total)'),
    ['sum by (direction): no such label among instance, job, tenant'],
    'and: the left side',
  );
  t.deepEqual(problems('sum by (direction) (2 * dials_total > bool 1)'), [], 'a scalar side keeps the vector');
});

test('ranges, subqueries, offsets and @ are read past; precedence groups as PromQL does', (t) => {
  t.deepEqual(problems('max_over_time(agents[1h:1m] offset 5m) > 0 and agents @ end() == 0'), []);
  t.deepEqual(problems('count_values("value", agents)'), []);
  t.deepEqual(problems('sum by (value) (count_values("value", agents))'), []);
  t.deepEqual(problems('label_replace(agents, "node", "$1", "tenant", "(.*)")'), []);
  t.deepEqual(problems('label_replace(agents, "node", "$1", "pod", "(.*)")'), [
    'label_replace: source label pod: no such label among instance, job, tenant',
  ]);
  // `a + b * on (job) c` is `a + (b * on (job) c)`: a's labels; read left to right, only job would remain.
  t.deepEqual(problems('sum by (tenant) (agents + dials_total * on (job) agents)'), []);
  t.deepEqual(problems('sum by (tenant) ((agents + dials_total) * on (job) agents)'), ['sum by (tenant): no such label among job']);
  t.deepEqual(problems('-sum by (le) (dial_seconds_bucket) ^ 2 ^ 3'), []);
  t.throws(() => analyse('sum(agents', lookup), { message: /unexpected end/ });
  t.throws(() => analyse('agents agents', lookup), { message: /after a whole expression/ });
});
