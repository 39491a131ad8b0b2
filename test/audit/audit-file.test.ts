/**
 * The audit log in a regular file (src/audit/file-sink.ts), on real files in
 * a temp dir: every record one JSON line, in order; rotation at exactly the
 * size limit with lumberjack's names; old files deleted by count and by age
 * (faked by name); a failed rotation counted, warned once, and the file
 * written on; the path checked at start with a message naming the flag.
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Registry } from 'prom-client';
import { AuditLogPathError, auditLogPathProblem, openAuditLog, type AuditLog } from '../../src/audit/audit-log.js';
import { auditLogFileOptions, auditSettings } from '../../src/audit/settings.js';
import { readSettings } from '../../src/settings/table.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { capturedLog, metricValue, recordOfSize } from '../helpers/audit-log.js';
import { waitUntil } from '../helpers/probes.js';

const BACKUP = /^audit-(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3})\.log$/;

interface Opened {
  audit: AuditLog;
  registry: Registry;
  file: string;
  dir: string;
  captured: ReturnType<typeof capturedLog>;
}

async function open(
  t: ExecutionContext,
  o: { maxBytes?: number; maxBackups?: number; maxAgeDays?: number; dir?: string } = {},
): Promise<Opened> {
  const dir = o.dir ?? scopedTempDir(t, 'kanal-audit-');
  const file = path.join(dir, 'audit.log');
  const registry = new Registry();
  const captured = capturedLog();
  const audit = await openAuditLog({
    file: { path: file, maxBytes: o.maxBytes ?? 100 * 1024 * 1024, maxBackups: o.maxBackups ?? 0, maxAgeDays: o.maxAgeDays ?? 0 },
    registry,
    log: captured.log,
  });
  t.teardown(() => audit.close(100));
  return { audit, registry, file, dir, captured };
}

function linesOf(file: string): { i: number }[] {
  const text = fs.readFileSync(file, 'utf8');
  if (text === '') return [];
  if (!text.endsWith('\n')) throw new Error(`${file} does not end with a newline`);
  return text
    .slice(0, -1)
    .split('\n')
    .map((l) => JSON.parse(l) as { i: number });
}

const backups = (dir: string): string[] =>
  fs
    .readdirSync(dir)
    .filter((n) => BACKUP.test(n))
    .sort();

/** A backup name for `ms`, derived here from the ISO form (independently of src/audit/backup-names.ts). */
const fakeBackup = (ms: number): string => `audit-${new Date(ms).toISOString().replace(/:/g, '-').replace('Z', '')}.log`;

test('each record is one JSON line, in order, appended to what the file held; newlines inside strings stay escaped', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-');
  fs.writeFileSync(path.join(dir, 'audit.log'), `${JSON.stringify({ i: -1 })}\n`);
  const { audit, registry, file } = await open(t, { dir });
  for (let i = 0; i < 2000; i++) audit.write({ i, note: `line\nbreak "${i}"`, at: new Date(0) });
  await audit.close();
  const lines = linesOf(file);
  t.deepEqual(
    lines.map((l) => l.i),
    Array.from({ length: 2001 }, (_, i) => i - 1),
  );
  t.is((lines[1] as unknown as { note: string }).note, 'line\nbreak "0"');
  t.is(await metricValue(registry, 'kanal_audit_lines_total'), 2000);
  t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'queue_full' }), 0);
  t.is(await metricValue(registry, 'kanal_audit_queued_bytes'), 0);
});

test('a new file is created with mode 0600, as the kube-apiserver creates its audit file', async (t) => {
  const { audit, file } = await open(t);
  audit.write({ i: 0 });
  await audit.close();
  t.is(fs.statSync(file).mode & 0o777, 0o600);
});

test('rotation at exactly the size limit: a file holds up to maxBytes, the next line goes to a new one; backups named as lumberjack does', async (t) => {
  const { audit, registry, file, dir } = await open(t, { maxBytes: 1000 });
  for (let i = 0; i < 10; i++) audit.write(recordOfSize(i, 100));
  await waitUntil(async () => (await metricValue(registry, 'kanal_audit_lines_total')) === 10, '10 lines are written', 10_000);
  t.is(fs.statSync(file).size, 1000, 'ten lines of 100 bytes fill the file exactly');
  t.deepEqual(backups(dir), [], 'no rotation at exactly the limit');

  for (let i = 10; i < 36; i++) audit.write(recordOfSize(i, 100));
  await audit.close();
  const names = backups(dir);
  t.is(names.length, 3, names.join(', '));
  for (const name of names) t.is(fs.statSync(path.join(dir, name)).size, 1000, name);
  t.is(fs.statSync(file).size, 600);
  const all = [...names.map((n) => path.join(dir, n)), file].flatMap(linesOf).map((l) => l.i);
  t.deepEqual(
    all,
    Array.from({ length: 36 }, (_, i) => i),
    'backups in name order, then the file, hold every line in order',
  );
  const stamps = names.map((n) => Date.parse(`${BACKUP.exec(n)![1].replace(/T(\d\d)-(\d\d)-(\d\d)/, 'T$1:$2:$3')}Z`));
  for (const ms of stamps) t.true(Math.abs(Date.now() - ms) < 60_000, 'the time in the name is now, in UTC');
  t.is(await metricValue(registry, 'kanal_audit_rotations_total'), 3);
});

test('a line larger than the size limit is dropped and counted (too_large); the others are written', async (t) => {
  const { audit, registry, file, captured } = await open(t, { maxBytes: 1000 });
  audit.write(recordOfSize(0, 100));
  audit.write(recordOfSize(1, 1001));
  audit.write(recordOfSize(2, 1000));
  await audit.close();
  t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'too_large' }), 1);
  t.deepEqual(
    [...backups(path.dirname(file)).map((n) => path.join(path.dirname(file), n)), file].flatMap(linesOf).map((l) => l.i),
    [0, 2],
  );
  t.is(captured.warnings().filter((w) => w.reason === 'too_large').length, 1);
});

test('backups beyond --audit-log-maxbackup are deleted, the newest by the time in their name kept; other files are left', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-');
  const hour = 3600_000;
  const fakes = [1, 2, 3].map((h) => fakeBackup(Date.now() - h * hour));
  const others = ['audit-notes.log', 'other-2020-01-01T00-00-00.000.log', 'audit.log.1'];
  for (const name of [...fakes, ...others]) fs.writeFileSync(path.join(dir, name), 'old\n');
  const { audit } = await open(t, { dir, maxBytes: 200, maxBackups: 2 });
  for (let i = 0; i < 3; i++) audit.write(recordOfSize(i, 100));
  await audit.close();
  await waitUntil(() => backups(dir).length === 2, 'two backups are left', 10_000);
  const left = backups(dir);
  t.true(left.includes(fakes[0]), 'the newest fake (an hour old) is kept');
  t.false(left.includes(fakes[1]));
  t.false(left.includes(fakes[2]));
  for (const name of others) t.true(fs.existsSync(path.join(dir, name)), `${name} is left`);
});

test('backups older than --audit-log-maxage days are deleted; younger ones kept', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-');
  const day = 24 * 3600_000;
  const young = fakeBackup(Date.now() - day / 2);
  const old = [fakeBackup(Date.now() - 2 * day), fakeBackup(Date.UTC(2020, 0, 1))];
  for (const name of [young, ...old]) fs.writeFileSync(path.join(dir, name), 'old\n');
  const { audit } = await open(t, { dir, maxBytes: 200, maxAgeDays: 1 });
  for (let i = 0; i < 3; i++) audit.write(recordOfSize(i, 100));
  await audit.close();
  await waitUntil(() => old.every((n) => !fs.existsSync(path.join(dir, n))), 'the old backups are deleted', 10_000);
  t.true(fs.existsSync(path.join(dir, young)));
  t.is(backups(dir).length, 2, 'the young fake and the new backup');
});

test('a rotation that fails (the directory refuses renames) is counted and warned once; the file is written on', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-');
  const { audit, registry, file, captured } = await open(t, { dir, maxBytes: 200 });
  // An immutable directory (chattr +i) refuses renames even to root; the file in it stays writable.
  execFileSync('chattr', ['+i', dir]);
  t.teardown(() => execFileSync('chattr', ['-i', dir]));
  for (let i = 0; i < 6; i++) audit.write(recordOfSize(i, 100));
  await waitUntil(async () => (await metricValue(registry, 'kanal_audit_lines_total')) === 6, 'six lines are written', 10_000);
  t.true((await metricValue(registry, 'kanal_audit_rotation_failures_total'))! >= 1);
  t.is(await metricValue(registry, 'kanal_audit_rotations_total'), 0);
  t.deepEqual(
    linesOf(file).map((l) => l.i),
    [0, 1, 2, 3, 4, 5],
    'written on past the size',
  );
  const warnings = captured.warnings();
  t.is(warnings.length, 1, JSON.stringify(warnings));
  // The next file is created (under a private name) before the current one moves: that is what the directory refuses first.
  t.is(warnings[0].step, 'open');
  t.regex(String(warnings[0].cause), /EPERM/);
  t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'write_error' }), 0);
});

test('the start fails naming --audit-log-path: no directory, a directory as the path, a socket; --dry-run gets the same message', async (t) => {
  const dir = scopedTempDir(t, 'kanal-audit-');
  const missing = path.join(dir, 'nope', 'audit.log');
  const problem = auditLogPathProblem(missing);
  t.is(
    problem,
    `--audit-log-path ${missing}: the directory ${path.join(dir, 'nope')} does not exist (create it, or name a file in another)`,
  );
  const registry = new Registry();
  const err = await t.throwsAsync(
    openAuditLog({ file: { path: missing, maxBytes: 1000, maxBackups: 0, maxAgeDays: 0 }, registry, log: capturedLog().log }),
    { instanceOf: AuditLogPathError },
  );
  t.is(err?.message ?? '(no error)', problem ?? '(no problem)');

  const plain = path.join(dir, 'plain');
  fs.writeFileSync(plain, '');
  t.is(
    auditLogPathProblem(path.join(plain, 'audit.log')),
    `--audit-log-path ${path.join(plain, 'audit.log')}: ${plain} is not a directory`,
  );
  t.regex(
    auditLogPathProblem(dir) ?? '',
    /^--audit-log-path .*: is a directory; name a file, a FIFO or a character device, or - for stdout$/,
  );

  const sock = path.join(dir, 'sock');
  const server = net.createServer().listen(sock);
  await new Promise((r) => server.once('listening', r));
  t.teardown(() => void server.close());
  t.regex(auditLogPathProblem(sock) ?? '', /: is a socket;/);

  t.is(auditLogPathProblem(path.join(dir, 'audit.log')), undefined);
  t.is(auditLogPathProblem('-'), undefined);
  t.is(auditLogPathProblem(undefined), undefined);
});

test('the settings: kube-apiserver names and meanings; maxsize in MiB (0: 100), negative values refused naming the flag', (t) => {
  const read = (given: Record<string, unknown>) =>
    auditLogFileOptions(readSettings(auditSettings, { 'audit-log-maxsize': 0, 'audit-log-maxbackup': 0, 'audit-log-maxage': 0, ...given }));
  t.is(read({}), undefined, 'no path: no audit log');
  t.is(read({ 'audit-log-path': '' }), undefined, 'an empty path: no audit log');
  t.deepEqual(read({ 'audit-log-path': '-' }), { path: '-', maxBytes: 100 * 1024 * 1024, maxBackups: 0, maxAgeDays: 0 });
  t.deepEqual(read({ 'audit-log-path': '/var/log/a.log', 'audit-log-maxsize': 1, 'audit-log-maxbackup': 3, 'audit-log-maxage': 7 }), {
    path: '/var/log/a.log',
    maxBytes: 1024 * 1024,
    maxBackups: 3,
    maxAgeDays: 7,
  });
  for (const flag of ['audit-log-maxsize', 'audit-log-maxbackup', 'audit-log-maxage']) {
    t.throws(() => read({ 'audit-log-path': '-', [flag]: -1 }), { message: `--${flag} must be a whole number of at least 0, got -1` });
    t.throws(() => read({ 'audit-log-path': '-', [flag]: 1.5 }), { message: `--${flag} must be a whole number of at least 0, got 1.5` });
  }
  t.throws(() => read({ 'audit-log-path': '-', 'audit-log-maxsize': 2 ** 50 }), { message: /--audit-log-maxsize .* is too large/ });
});
