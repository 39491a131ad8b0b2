/**
 * When the audit log cannot be written: every line lost is counted as
 * write_error, one warning is logged for the whole episode, and the caller
 * never notices. Real failures only: /dev/full (every write ENOSPC), and a
 * regular file past the process's file size limit (EFBIG; prlimit in a child).
 */
import test from 'ava';
import { run } from '../../kit/launch/run-to-end.js';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { openAuditLog } from '../../src/audit/audit-log.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { capturedLog, metricValue, type LogLine } from '../helpers/audit-log.js';
import { waitUntil } from '../helpers/probes.js';

const CHILD = path.join(path.dirname(fileURLToPath(import.meta.url)), 'fixtures', 'audit-child.js');

test('a device that refuses every write (/dev/full): lines dropped as write_error, one warning, retried without end', async (t) => {
  const registry = new Registry();
  const captured = capturedLog();
  const audit = await openAuditLog({
    file: { path: '/dev/full', maxBytes: 1000, maxBackups: 0, maxAgeDays: 0 },
    registry,
    log: captured.log,
  });
  t.teardown(() => audit.close(100));
  const dropped = async (): Promise<number | undefined> =>
    metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'write_error' });
  for (let i = 0; i < 5; i++) audit.write({ i });
  await waitUntil(async () => (await dropped()) === 5, 'five lines are dropped', 10_000);
  // Written while the device is being reopened: they wait, then fail at the next try (a second later).
  for (let i = 5; i < 8; i++) audit.write({ i });
  await waitUntil(async () => (await dropped()) === 8, 'the next three are dropped after the retry', 10_000);
  t.is(await metricValue(registry, 'kanal_audit_lines_total'), 0);
  const warnings = captured.warnings();
  t.is(warnings.length, 1, JSON.stringify(warnings));
  t.is(warnings[0].reason, 'write_error');
  t.regex(String(warnings[0].cause), /ENOSPC/);
});

test('/dev/null takes every line (a character device is written, never rotated)', async (t) => {
  const registry = new Registry();
  const audit = await openAuditLog({
    file: { path: '/dev/null', maxBytes: 100, maxBackups: 1, maxAgeDays: 1 },
    registry,
    log: capturedLog().log,
  });
  for (let i = 0; i < 500; i++) audit.write({ i, pad: 'z'.repeat(200) });
  await audit.close();
  t.is(await metricValue(registry, 'kanal_audit_lines_total'), 500);
  t.is(await metricValue(registry, 'kanal_audit_rotations_total'), 0);
});

test('a regular file past the file size limit (EFBIG): the whole lines that fit are counted written, the rest write_error, one warning', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-efbig-');
  const file = path.join(dir, 'audit.log');
  // 64 lines of 1 KiB fit under the limit; the write of the rest fails, and so does the retry a second later.
  const {
    code,
    stdout: out,
    stderr: err,
  } = await run('prlimit', ['--fsize=65536', process.execPath, CHILD, 'file', file, '200', '1024'], {
    timeoutMs: 60_000,
  });
  t.is(code, 0, err);
  const result = JSON.parse(out) as { written: number; writeErrors: number; shutdown: number; warnings: LogLine[] };
  t.is(result.written, 64);
  t.is(result.writeErrors, 136);
  t.is(result.shutdown, 0);
  t.is(result.warnings.length, 1, JSON.stringify(result.warnings));
  t.regex(String(result.warnings[0].cause), /EFBIG/);
});
