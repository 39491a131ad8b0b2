/**
 * deploy/monitoring/ as the tests read it: the alert rules, the Grafana
 * dashboard and its queries, promtool, and the metric names that other work
 * adds and this branch does not export yet.
 */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { run, type RunResult } from '../../kit/launch/run-to-end.js';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
export const MONITORING = path.join(REPO, 'deploy', 'monitoring');
export const RULES_FILE = path.join(MONITORING, 'kanal-alerts.rules.yaml');
export const PROMETHEUS_RULE_FILE = path.join(MONITORING, 'kanal-alerts.prometheusrule.yaml');
export const DASHBOARD_FILE = path.join(MONITORING, 'kanal-dashboard.json');

/**
 * Metrics the dashboard and rules may use before the source exports them,
 * label names included: the label check accepts them as if scraped. Empty:
 * every metric they name must show in the scrapes.
 */
export const NOT_YET_EXPORTED: Readonly<Record<string, readonly string[]>> = {};

/** Refusal reasons the rules may name before the source has them; empty as NOT_YET_EXPORTED. */
export const REFUSAL_REASONS_NOT_YET_IN_SOURCE: readonly string[] = [];

export interface Rule {
  alert?: string;
  record?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

export interface RuleGroup {
  name: string;
  rules: Rule[];
}

export function loadRules(file = RULES_FILE): RuleGroup[] {
  const doc = parse(fs.readFileSync(file, 'utf8')) as { groups?: RuleGroup[] };
  if (!Array.isArray(doc.groups)) throw new Error(`${file}: no groups`);
  return doc.groups;
}

export const alerts = (groups: readonly RuleGroup[]): Rule[] => groups.flatMap((g) => g.rules).filter((r) => r.alert !== undefined);

/** A Grafana panel as far as the tests read it (rows nest theirs under `panels`). */
export interface Panel {
  id: number;
  type: string;
  title: string;
  datasource?: { type?: string; uid?: string };
  targets?: { expr?: string; refId: string; datasource?: { type?: string; uid?: string } }[];
  panels?: Panel[];
  gridPos?: { x: number; y: number; w: number; h: number };
}

export interface TemplateVariable {
  name: string;
  type: string;
  query?: string | { query: string };
  datasource?: { type?: string; uid?: string };
  includeAll?: boolean;
  allValue?: string;
  multi?: boolean;
}

export interface Dashboard {
  title: string;
  uid: string;
  schemaVersion: number;
  panels: Panel[];
  templating: { list: TemplateVariable[] };
}

export function loadDashboard(): Dashboard {
  return JSON.parse(fs.readFileSync(DASHBOARD_FILE, 'utf8')) as Dashboard;
}

/** Every panel, rows' nested panels included. */
export function allPanels(d: Dashboard): Panel[] {
  return d.panels.flatMap((p) => [p, ...(p.panels ?? [])]);
}

/** Every query of the dashboard: each panel target's expr, named by panel title and refId. */
export function dashboardQueries(d: Dashboard): { where: string; expr: string }[] {
  return allPanels(d).flatMap((p) =>
    (p.targets ?? []).filter((t) => t.expr !== undefined).map((t) => ({ where: `panel "${p.title}" ${t.refId}`, expr: t.expr! })),
  );
}

/** A query variable's `label_values(selector, label)`, split; throws for any other form. */
export function labelValuesQuery(v: TemplateVariable): { selector: string; label: string } {
  const q = typeof v.query === 'string' ? v.query : (v.query?.query ?? '');
  const m = /^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$/s.exec(q.trim());
  if (!m) throw new Error(`variable ${v.name}: ${q} is not label_values(selector, label)`);
  return { selector: m[1], label: m[2] };
}

/** promtool from Debian's prometheus package (scripts/setup.sh installs it). */
export function promtool(args: readonly string[]): Promise<RunResult> {
  return run('promtool', args, { timeoutMs: 60_000 });
}

/**
 * An alert's annotation as Prometheus fills it in for `labels`: only
 * `{{ $labels.x }}` and `{{ if $labels.x }}…{{ end }}` are used (and
 * understood here); anything else throws, so a new form is added here first.
 */
export function expandAnnotation(text: string, labels: Readonly<Record<string, string>>): string {
  const withIfs = text.replace(/\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}/gs, (_, l: string, body: string) => (labels[l] ? body : ''));
  const out = withIfs.replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, l: string) => labels[l] ?? '');
  if (out.includes('{{')) throw new Error(`an annotation template this test cannot fill in: ${text}`);
  return out;
}

/** GitHub's anchor for a Markdown heading: lower case, punctuation but - and _ dropped, spaces to -. */
export function headingAnchor(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}
