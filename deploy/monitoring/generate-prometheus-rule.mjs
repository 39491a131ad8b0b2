#!/usr/bin/env node
// Writes kanal-alerts.prometheusrule.yaml, the Prometheus Operator's PrometheusRule, from
// kanal-alerts.rules.yaml: the same groups under `spec:`, comments and formatting kept, so the two
// never differ. `--stdout` prints instead of writing (test/deploy/alert-rules.test.ts compares).
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const rules = readFileSync(join(here, 'kanal-alerts.rules.yaml'), 'utf8');
const start = rules.search(/^groups:$/m);
if (start < 0) throw new Error('kanal-alerts.rules.yaml: no top-level `groups:` line');

const header = `# GENERATED from kanal-alerts.rules.yaml by generate-prometheus-rule.mjs: edit that file, then run
# \`node deploy/monitoring/generate-prometheus-rule.mjs\`. Apply with \`kubectl apply -n <namespace> -f\`;
# add the labels your Prometheus's ruleSelector picks (deploy/README.md).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kanal
  labels:
    app.kubernetes.io/name: kanal
spec:
`;
const body = rules
  .slice(start)
  .split('\n')
  .map((line) => (line === '' ? line : `  ${line}`))
  .join('\n');
const out = header + body;

if (process.argv.includes('--stdout')) process.stdout.write(out);
else writeFileSync(join(here, 'kanal-alerts.prometheusrule.yaml'), out);
