/**
 * deploy/monitoring/kanal-alerts.rules.yaml with promtool: the rules parse,
 * the PrometheusRule is generated from them and current, each alert has
 * its annotations and a runbook section, and kanal-alerts.scenarios.yaml's
 * series prove that no alert fires on a control plane without nodes or one
 * scaled to zero, and that each alert fires when it should.
 */
import fs from 'node:fs';
import path from 'node:path';
import test, { type ExecutionContext } from 'ava';
import { parse, stringify } from 'yaml';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { run } from '../../kit/launch/run-to-end.js';
import {
  alerts,
  expandAnnotation,
  headingAnchor,
  loadRules,
  MONITORING,
  PROMETHEUS_RULE_FILE,
  promtool,
  REPO,
  RULES_FILE,
  type Rule,
  type RuleGroup,
} from './monitoring-files.js';

const groups = loadRules();
const ALERTS = alerts(groups);
const byName = new Map(ALERTS.map((r) => [r.alert!, r]));

interface ExpectedAlert {
  exp_labels: Record<string, string>;
  exp_annotations?: Record<string, string>;
}
interface AlertRuleTest {
  eval_time: string;
  alertname: string;
  exp_alerts: ExpectedAlert[];
}
interface Scenario {
  name: string;
  interval: string;
  input_series: { series: string; values: string }[];
  alert_rule_test?: AlertRuleTest[];
  quiet_at?: string[];
}
interface ScenarioFile {
  evaluation_interval: string;
  tests: Scenario[];
}

const scenarios = parse(fs.readFileSync(path.join(REPO, 'test', 'deploy', 'kanal-alerts.scenarios.yaml'), 'utf8')) as ScenarioFile;

/** The scenarios as promtool reads them: annotations filled in from the rules, quiet_at spelled out. */
function promtoolTests(file: ScenarioFile): object {
  return {
    rule_files: [RULES_FILE],
    evaluation_interval: file.evaluation_interval,
    tests: file.tests.map(({ quiet_at, ...s }) => {
      const listed = s.alert_rule_test ?? [];
      const quiet = (quiet_at ?? []).flatMap((eval_time) =>
        ALERTS.filter((r) => !listed.some((l) => l.alertname === r.alert && l.eval_time === eval_time)).map((r) => ({
          eval_time,
          alertname: r.alert!,
          exp_alerts: [],
        })),
      );
      const alert_rule_test = [...listed, ...quiet].map((l) => {
        const rule = byName.get(l.alertname);
        if (!rule) throw new Error(`scenario "${s.name}": no alert ${l.alertname} in the rules`);
        return {
          ...l,
          exp_alerts: l.exp_alerts.map((e) => ({
            exp_labels: e.exp_labels,
            exp_annotations: Object.fromEntries(
              Object.entries(rule.annotations ?? {}).map(([k, v]) => [k, expandAnnotation(v, e.exp_labels)]),
            ),
          })),
        };
      });
      return { ...s, alert_rule_test };
    }),
  };
}

async function promtoolTestRules(t: ExecutionContext, file: ScenarioFile): Promise<{ code: number | null; out: string }> {
  const dir = scopedTempDir(t, 'kanal-alerts-');
  const testsFile = path.join(dir, 'kanal-alerts.test.yaml');
  fs.writeFileSync(testsFile, stringify(promtoolTests(file)));
  const r = await promtool(['test', 'rules', testsFile]);
  return { code: r.code, out: r.stdout + r.stderr };
}

test('promtool accepts the rules file', async (t) => {
  const r = await promtool(['check', 'rules', RULES_FILE]);
  t.is(r.code, 0, r.stdout + r.stderr);
  t.regex(r.stdout, new RegExp(`SUCCESS: ${ALERTS.length} rules found`));
});

test('the PrometheusRule is generated from the rules file, is current, and promtool accepts its groups', async (t) => {
  const generated = await run(process.execPath, [path.join(MONITORING, 'generate-prometheus-rule.mjs'), '--stdout'], { timeoutMs: 30_000 });
  t.is(generated.code, 0, generated.stderr);
  t.is(
    fs.readFileSync(PROMETHEUS_RULE_FILE, 'utf8'),
    generated.stdout,
    'kanal-alerts.prometheusrule.yaml is stale: run node deploy/monitoring/generate-prometheus-rule.mjs',
  );
  const manifest = parse(generated.stdout) as {
    apiVersion: string;
    kind: string;
    metadata: { name: string };
    spec: { groups: RuleGroup[] };
  };
  t.is(manifest.apiVersion, 'monitoring.coreos.com/v1');
  t.is(manifest.kind, 'PrometheusRule');
  t.is(manifest.metadata.name, 'kanal');
  t.deepEqual(manifest.spec.groups, groups);
  const dir = scopedTempDir(t, 'kanal-prometheusrule-');
  const specFile = path.join(dir, 'spec.yaml');
  fs.writeFileSync(specFile, stringify({ groups: manifest.spec.groups }));
  const r = await promtool(['check', 'rules', specFile]);
  t.is(r.code, 0, r.stdout + r.stderr);
});

test('every alert has a severity, a summary, a description and a runbook section in docs/operations.md', (t) => {
  const ops = fs.readFileSync(path.join(REPO, 'docs', 'operations.md'), 'utf8');
  const alertsSection = ops.slice(ops.indexOf('\n## Alerts'));
  t.true(ops.includes('\n## Alerts'), 'docs/operations.md has an "Alerts" section');
  const anchors = new Set([...alertsSection.matchAll(/^###\s+(.+)$/gm)].map((m) => headingAnchor(m[1])));
  t.true(ALERTS.length >= 10, `${ALERTS.length} alerts`);
  for (const r of ALERTS as (Rule & { alert: string })[]) {
    t.true(['critical', 'warning'].includes(r.labels?.severity ?? ''), `${r.alert}: severity critical or warning`);
    for (const key of ['summary', 'description', 'runbook_url']) t.truthy(r.annotations?.[key], `${r.alert}: ${key}`);
    const url = r.annotations?.runbook_url ?? '';
    t.is(url, `docs/operations.md#${headingAnchor(r.alert)}`, `${r.alert}: runbook_url names its own section`);
    t.true(anchors.has(headingAnchor(r.alert)), `${r.alert}: docs/operations.md "Alerts" has a section ### ${r.alert}`);
    // Each description says why it stays quiet without nodes (the reasoning the rules promise).
    t.regex(r.annotations?.description ?? '', /without nodes|no nodes|Nodes play no part/, `${r.alert}: the no-nodes reasoning`);
    t.notThrows(() => expandAnnotation(r.annotations?.summary ?? '', {}), `${r.alert}: summary template`);
  }
});

test('the scenarios cover every alert: all quiet without nodes and scaled to zero, each one seen firing', (t) => {
  const [noNodes, scaledToZero] = scenarios.tests;
  t.regex(noNodes.name, /without nodes/);
  t.true((noNodes.quiet_at ?? []).length >= 3, 'no alert at several times on a control plane without nodes');
  t.deepEqual(noNodes.alert_rule_test ?? [], [], 'nothing fires there');
  t.regex(scaledToZero.name, /scaled to zero/);
  t.true(
    (scaledToZero.quiet_at ?? []).some((at) => parseInt(at) >= 8),
    'quiet long after the scale-down',
  );
  const firing = new Set(
    scenarios.tests.flatMap((s) => (s.alert_rule_test ?? []).filter((l) => l.exp_alerts.length > 0).map((l) => l.alertname)),
  );
  t.deepEqual(
    ALERTS.map((r) => r.alert).filter((a) => !firing.has(a!)),
    [],
    'alerts no scenario shows firing',
  );
});

test('promtool test rules: every scenario holds', async (t) => {
  const r = await promtoolTestRules(t, scenarios);
  t.is(r.code, 0, r.out);
  t.regex(r.out, /SUCCESS/);
});

test('the harness can fail: a scenario expecting an alert on a cluster without nodes fails promtool', async (t) => {
  const [noNodes, ...rest] = scenarios.tests;
  const wrong: Scenario = {
    ...noNodes,
    alert_rule_test: [
      {
        eval_time: '2h',
        alertname: 'KanalServerLostAllAgents',
        exp_alerts: [{ exp_labels: { severity: 'critical', job: 'kanal-server', instance: 's1:8095' } }],
      },
    ],
  };
  const r = await promtoolTestRules(t, { ...scenarios, tests: [wrong, ...rest] });
  t.not(r.code, 0, r.out);
  t.regex(r.out, /alertname: KanalServerLostAllAgents, time: 2h/);
});

test('annotation templates: $labels filled in, if-blocks kept only when the label is set, other forms refused', (t) => {
  t.is(
    expandAnnotation('on {{ $labels.instance }}{{ if $labels.tenant }} (tenant {{ $labels.tenant }}){{ end }}', { instance: 'a:1' }),
    'on a:1',
  );
  t.is(
    expandAnnotation('on {{ $labels.instance }}{{ if $labels.tenant }} (tenant {{ $labels.tenant }}){{ end }}', {
      instance: 'a:1',
      tenant: 'x',
    }),
    'on a:1 (tenant x)',
  );
  t.throws(() => expandAnnotation('{{ $value }}', {}), { message: /cannot fill in/ });
});
