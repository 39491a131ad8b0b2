/** docs/metrics.md lists every value of Kanal's metric label vocabularies, and nothing else under those names. */
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import test from 'ava';
import { DIAL_RESULTS } from '../../src/domain/dial-result.js';
import { REFUSAL_REASONS } from '../../src/domain/refusal-reason.js';
import { DROP_REASONS } from '../../src/audit/audit-metrics.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const doc = fs.readFileSync(path.join(REPO, 'docs', 'metrics.md'), 'utf8');

/** The paragraph or table of docs/metrics.md that starts with `heading`, up to the next blank line. */
function section(heading: string): string {
  const start = doc.indexOf(heading);
  if (start < 0) throw new Error(`docs/metrics.md has no ${heading}`);
  const end = doc.indexOf('\n\n', start + heading.length + 1);
  return doc.slice(start, end < 0 ? undefined : end);
}

/** Every `code` span of `text`. */
function codeSpans(text: string): Set<string> {
  return new Set([...text.matchAll(/`([^`]+)`/g)].map((m) => m[1]));
}

test('docs/metrics.md lists each kanal_dials_total result', (t) => {
  const listed = codeSpans(section('`kanal_dials_total{direction,result}`'));
  for (const result of DIAL_RESULTS) t.true(listed.has(result), `${result} is missing`);
});

test('docs/metrics.md lists each kanal_refusals_total reason, and no other', (t) => {
  const table = section('| where | reasons |');
  const listed = [...codeSpans(table)];
  for (const reason of REFUSAL_REASONS) t.true(listed.includes(reason), `${reason} is missing`);
  const known = new Set<string>(REFUSAL_REASONS);
  t.deepEqual(
    listed.filter((r) => !known.has(r)),
    [],
    'reasons the source does not know',
  );
});

test('docs/metrics.md lists each kanal_audit_dropped_lines_total reason', (t) => {
  const listed = codeSpans(section('`kanal_audit_dropped_lines_total{reason}`'));
  for (const reason of DROP_REASONS) t.true(listed.has(reason), `${reason} is missing`);
});

test("docs/metrics.md names the per-client metrics (a clients: list's)", (t) => {
  for (const name of ['kanal_frontend_client_dials_total{client,result}', 'kanal_frontend_client_connections{client}'])
    t.true(doc.includes(`\`${name}\``), `${name} is missing`);
});
