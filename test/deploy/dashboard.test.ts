/**
 * deploy/monitoring/kanal-dashboard.json as Grafana (10 and later) imports
 * it: a data source variable every panel and query uses, job/instance/tenant
 * variables every selector applies, panels laid out without overlap, every
 * query valid PromQL for promtool, and the label values the dashboard and
 * the alert rules match on known to the source. monitoring-metrics.test.ts
 * checks the metrics and labels against real processes.
 */
import fs from 'node:fs';
import path from 'node:path';
import test from 'ava';
import { stringify } from 'yaml';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { DIAL_RESULTS } from '../../src/domain/dial-result.js';
import { REFUSAL_REASONS } from '../../src/domain/refusal-reason.js';
import { analyse, expandGrafanaIntervals, type Selector } from './promql-labels.js';
import {
  allPanels,
  alerts,
  dashboardQueries,
  labelValuesQuery,
  loadDashboard,
  loadRules,
  promtool,
  REFUSAL_REASONS_NOT_YET_IN_SOURCE,
} from './monitoring-files.js';

const dashboard = loadDashboard();
const queries = dashboardQueries(dashboard);
const DATASOURCE = '${datasource}';
/** Every metric is known here: these tests look at structure and values, not at the registry. */
const anyMetric = (): ReadonlySet<string> => new Set();
const selectorsOf = (expr: string): Selector[] => analyse(expr, anyMetric).selectors;

test('variables: a Prometheus data source, then job, instance and tenant from it', (t) => {
  const vars = new Map(dashboard.templating.list.map((v) => [v.name, v]));
  t.deepEqual([...vars.keys()], ['datasource', 'job', 'instance', 'tenant']);
  t.is(vars.get('datasource')?.type, 'datasource');
  t.is(vars.get('datasource')?.query, 'prometheus');
  for (const name of ['job', 'instance', 'tenant']) {
    const v = vars.get(name)!;
    t.is(v.type, 'query', name);
    t.is(v.datasource?.uid, DATASOURCE, `${name} asks the chosen data source`);
    t.true(v.includeAll && v.multi, `${name}: All and several values`);
    // All as .* also matches series without the label: a server without tenants has none.
    t.is(v.allValue, '.*', name);
    t.notThrows(() => labelValuesQuery(v), name);
  }
  t.is(labelValuesQuery(vars.get('tenant')!).label, 'tenant');
  t.regex(JSON.stringify(vars.get('instance')!.query), /job=~\\"\$job\\"/, 'instance follows job');
});

test('panels: unique ids, a title and description each, the chosen data source, a grid without overlap', (t) => {
  const panels = allPanels(dashboard);
  t.is(new Set(panels.map((p) => p.id)).size, panels.length, 'unique panel ids');
  t.true(dashboard.schemaVersion >= 36, 'Grafana 10 schema');
  const cells = new Set<string>();
  for (const p of panels) {
    t.truthy(p.title, `panel ${p.id} has a title`);
    const g = p.gridPos!;
    t.true(g.x >= 0 && g.w > 0 && g.x + g.w <= 24, `${p.title}: within 24 columns`);
    for (let x = g.x; x < g.x + g.w; x++) {
      for (let y = g.y; y < g.y + g.h; y++) {
        t.false(cells.has(`${x},${y}`), `${p.title} overlaps another panel at ${x},${y}`);
        cells.add(`${x},${y}`);
      }
    }
    if (p.type === 'row') continue;
    t.truthy((p as { description?: string }).description, `${p.title}: a description`);
    t.is(p.datasource?.uid, DATASOURCE, `${p.title}: panel data source`);
    t.true((p.targets ?? []).length > 0, `${p.title}: queries`);
    for (const target of p.targets ?? []) t.is(target.datasource?.uid, DATASOURCE, `${p.title} ${target.refId}: query data source`);
  }
});

test('every selector of every query applies the job and instance variables', (t) => {
  for (const { where, expr } of queries) {
    for (const s of selectorsOf(expr)) {
      const has = (label: string, value: string): boolean =>
        s.matchers.some((m) => m.label === label && m.op === '=~' && m.value === value);
      t.true(has('job', '$job') && has('instance', '$instance'), `${where}: ${s.metric} applies $job and $instance`);
    }
  }
});

test('the dashboard shows what operators need: agents, dials, refusals, bytes, tunnels, resume, process, audit log', (t) => {
  const used = new Set(queries.flatMap((q) => selectorsOf(q.expr).map((s) => s.metric)));
  const wanted = [
    'konnectivity_network_proxy_server_ready_backend_connections',
    'konnectivity_network_proxy_agent_open_server_connections',
    'konnectivity_network_proxy_agent_known_server_count',
    'kanal_dials_total',
    'kanal_dial_duration_seconds_bucket',
    'kanal_refusals_total',
    'kanal_connection_bytes_total',
    'konnectivity_network_proxy_server_pending_backend_dials',
    'kanal_server_connections_open',
    'kanal_server_node_to_cp_connections',
    'kanal_agent_connections_open',
    'kanal_dead_tunnels_total',
    'konnectivity_network_proxy_agent_server_connection_failure_count',
    'kanal_resume_detached_tunnels',
    'kanal_resumes_total',
    'kanal_resume_duration_seconds_bucket',
    'process_cpu_seconds_total',
    'process_resident_memory_bytes',
    'nodejs_eventloop_lag_p99_seconds',
    'process_open_fds',
    'kanal_audit_lines_total',
    'kanal_audit_dropped_lines_total',
  ];
  t.deepEqual(
    wanted.filter((m) => !used.has(m)),
    [],
    'metrics the dashboard does not show',
  );
});

test('promtool parses every dashboard query (Grafana interval variables as durations)', async (t) => {
  const dir = scopedTempDir(t, 'kanal-dashboard-');
  const file = path.join(dir, 'dashboard-queries.yaml');
  const rules = queries.map((q, i) => ({ record: `dashboard:query_${i}`, expr: expandGrafanaIntervals(q.expr) }));
  fs.writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules }] }));
  const r = await promtool(['check', 'rules', file]);
  t.is(r.code, 0, `${r.stdout}${r.stderr}\nqueries by index:\n${queries.map((q, i) => `${i} ${q.where}`).join('\n')}`);
  t.regex(r.stdout, new RegExp(`SUCCESS: ${queries.length} rules found`));
  // The same check refuses a broken query, so a pass means something.
  fs.writeFileSync(file, stringify({ groups: [{ name: 'dashboard', rules: [{ record: 'dashboard:broken', expr: 'sum by (job (up)' }] }] }));
  const broken = await promtool(['check', 'rules', file]);
  t.not(broken.code, 0);
});

test('label values matched in the dashboard and the rules are values the source knows', (t) => {
  const known: Record<string, Record<string, ReadonlySet<string>>> = {
    kanal_refusals_total: { reason: new Set([...REFUSAL_REASONS, ...REFUSAL_REASONS_NOT_YET_IN_SOURCE]) },
    kanal_dials_total: { result: new Set(DIAL_RESULTS), direction: new Set(['cp_to_node', 'node_to_cp']) },
    kanal_connection_bytes_total: { direction: new Set(['cp_to_node', 'node_to_cp']), flow: new Set(['to_peer', 'from_peer']) },
    kanal_resumes_total: { result: new Set(['resumed', 'expired', 'refused']) },
    kanal_dead_tunnels_total: { reason: new Set(['keepalive_timeout', 'replaced']) },
    konnectivity_network_proxy_server_grpc_connections: { service_method: new Set(['Connect', 'Proxy']) },
  };
  const exprs = [...queries, ...alerts(loadRules()).map((r) => ({ where: r.alert!, expr: r.expr }))];
  let checked = 0;
  for (const { where, expr } of exprs) {
    for (const s of selectorsOf(expr)) {
      for (const m of s.matchers) {
        const vocabulary = known[s.metric]?.[m.label];
        if (!vocabulary || m.value.includes('$')) continue;
        const values = m.op.endsWith('~') ? m.value.split('|') : [m.value];
        for (const v of values) {
          checked++;
          t.true(vocabulary.has(v), `${where}: ${s.metric}{${m.label}${m.op}"${m.value}"}: ${v} is not a value of ${m.label}`);
        }
      }
    }
  }
  t.true(checked > 20, `${checked} values checked`);
});
