/**
 * The audit file is the server's own (src/common/owned-files.ts,
 * src/audit/file-sink.ts), tried as a local attacker does it: the real
 * `nobody` user prepares the path in a directory every user may write (mode
 * 1777, as /tmp). A planted symbolic link, a file or FIFO of nobody's, and a
 * file anyone may write are refused at the start naming --audit-log-path and
 * the path (the sinks refuse them too when opened directly, past the start
 * check); rotation counts and deletes only backups it wrote, whatever
 * `audit-2099-…` names nobody planted; a symbolic link planted while the
 * file is written is never followed. Needs root (to become nobody).
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Registry } from 'prom-client';
import { AuditLogPathError, auditLogPathProblem, openAuditLog, type AuditLog } from '../../src/audit/audit-log.js';
import { AuditMetrics } from '../../src/audit/audit-metrics.js';
import { FileSink } from '../../src/audit/file-sink.js';
import { PipeSink } from '../../src/audit/pipe-sink.js';
import { SinkError } from '../../src/audit/sink.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { freePort, loopbackServerArgs } from '../../kit/launch/kanal-cli.js';
import { makeWorkspace, runCli } from '../helpers/kanal-processes.js';
import { capturedLog, metricValue, recordOfSize } from '../helpers/audit-log.js';
import { waitUntil } from '../helpers/probes.js';
import { skippedBecause } from '../helpers/skipped.js';

const NOBODY = 65534;

/** Runs `command` as the real nobody user (no groups), as an attacker sharing the host would. */
function asNobody(command: string, ...args: string[]): void {
  execFileSync('setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', '--', command, ...args], { stdio: 'pipe' });
}

/** A directory like /tmp: every user may add names (1777), root owns it. */
function sharedDir(t: ExecutionContext): string {
  const dir = scopedTempDir(t, 'kanal-audit-shared-');
  fs.chmodSync(dir, 0o1777);
  return dir;
}

/** A root file outside the shared directory, which the attacker wants Kanal to write. */
function precious(t: ExecutionContext): { file: string; missing: string } {
  const dir = scopedTempDir(t, 'kanal-audit-precious-');
  const file = path.join(dir, 'precious');
  fs.writeFileSync(file, 'precious\n', { mode: 0o600 });
  return { file, missing: path.join(dir, 'created-by-kanal') };
}

const fileOptions = (file: string, o: { maxBytes?: number; maxBackups?: number } = {}) => ({
  path: file,
  maxBytes: o.maxBytes ?? 1000,
  maxBackups: o.maxBackups ?? 0,
  maxAgeDays: 0,
});

/** openAuditLog's refusal, which the start and --dry-run give alike (auditLogPathProblem). */
async function refusedAtStart(t: ExecutionContext, file: string, why: RegExp): Promise<void> {
  const problem = auditLogPathProblem(file);
  t.truthy(problem, `${file} is accepted`);
  t.true(problem?.startsWith(`--audit-log-path ${file}: `), problem);
  t.regex(problem ?? '', why);
  const err = await t.throwsAsync(openAuditLog({ file: fileOptions(file), registry: new Registry(), log: capturedLog().log }), {
    instanceOf: AuditLogPathError,
  });
  t.is(err?.message ?? '(no error)', problem ?? '(no problem)');
}

/** A FileSink opened past the start check, as a reopen after a write error is. */
async function fileSinkRefuses(t: ExecutionContext, file: string, why: RegExp): Promise<void> {
  const sink = new FileSink(fileOptions(file), new AuditMetrics(new Registry(), () => 0), capturedLog().log);
  const err = await t.throwsAsync(sink.open(), { instanceOf: SinkError });
  t.regex(err?.message ?? '', why);
  await sink.close();
}

if (process.geteuid?.() !== 0) {
  skippedBecause('audit file ownership against the nobody user', 'needs root to run commands as nobody');
} else {
  test('a symbolic link nobody planted is refused naming --audit-log-path and the path; neither its target nor a new file is written', async (t) => {
    const dir = sharedDir(t);
    const target = precious(t);
    const toFile = path.join(dir, 'audit.log');
    asNobody('ln', '-s', target.file, toFile);
    await refusedAtStart(t, toFile, /symbolic link owned by uid 65534/);
    await fileSinkRefuses(t, toFile, /symbolic link, which Kanal does not follow/);
    t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n', 'the target is untouched');

    const dangling = path.join(dir, 'dangling.log');
    asNobody('ln', '-s', target.missing, dangling);
    await refusedAtStart(t, dangling, /symbolic link owned by uid 65534/);
    await fileSinkRefuses(t, dangling, /cannot create .*EEXIST|symbolic link/);
    t.false(fs.existsSync(target.missing), 'no file is created where the link points');
  });

  test('a file nobody owns is refused, and nothing is appended to it; a root file others may write is refused too', async (t) => {
    const dir = sharedDir(t);
    const theirs = path.join(dir, 'audit.log');
    asNobody('sh', '-c', `umask 077; : > ${theirs}`);
    t.is(fs.statSync(theirs).uid, NOBODY);
    await refusedAtStart(t, theirs, /owned by uid 65534, not by this process's user \(root\)/);
    await fileSinkRefuses(t, theirs, /refusing .*owned by uid 65534/);
    t.is(fs.statSync(theirs).size, 0, 'nothing appended');

    for (const mode of [0o666, 0o620]) {
      const open = path.join(dir, `open-${mode.toString(8)}.log`);
      fs.writeFileSync(open, '');
      fs.chmodSync(open, mode);
      await refusedAtStart(t, open, /writable by its group or by others/);
      await fileSinkRefuses(t, open, /writable by its group or by others/);
      t.is(fs.statSync(open).size, 0, 'nothing appended');
    }

    // A hard link to a file of ours elsewhere is not our audit file either.
    const target = precious(t);
    const linked = path.join(scopedTempDir(t, 'kanal-audit-'), 'audit.log');
    fs.linkSync(target.file, linked);
    await refusedAtStart(t, linked, /has 2 names/);
    t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n');
  });

  test('a FIFO nobody owns is refused at the start, and by the pipe sink even with a reader on it', async (t) => {
    const dir = sharedDir(t);
    const fifo = path.join(dir, 'audit.fifo');
    asNobody('mkfifo', '-m', '0622', fifo);
    t.is(fs.statSync(fifo).uid, NOBODY);
    await refusedAtStart(t, fifo, /owned by uid 65534/);
    // With a reader the open succeeds; the descriptor's owner is what refuses it.
    const reader = fs.openSync(fifo, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
    t.teardown(() => fs.closeSync(reader));
    const sink = new PipeSink(fifo);
    const err = await t.throwsAsync(sink.open(), { instanceOf: SinkError });
    t.regex(err?.message ?? '', /refusing .*owned by uid 65534/);
    await sink.close();
  });

  test('kanal server refuses the planted link at the start and under --dry-run, naming --audit-log-path and the path', async (t) => {
    t.timeout(60_000);
    const ws = await makeWorkspace(t, 'kanal-audit-start-');
    const dir = sharedDir(t);
    const target = precious(t);
    const planted = path.join(dir, 'audit.log');
    asNobody('ln', '-s', target.file, planted);
    const args = [
      ...loopbackServerArgs({ pki: ws.pki, agentPort: await freePort(), healthPort: await freePort() }),
      '--uds-name',
      path.join(ws.dir, 'server.sock'),
      '--admin-port',
      String(await freePort()),
      '--audit-log-path',
      planted,
    ];
    for (const extra of [['--dry-run'], []]) {
      const r = await runCli([...args, ...extra]);
      t.is(r.code, 1, `${extra.join(' ')}: ${r.stdout}${r.stderr}`);
      t.true(r.stderr.includes(`--audit-log-path ${planted}: is a symbolic link owned by uid 65534`), r.stderr);
    }
    t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n', 'the target is untouched');
  });

  test('a directory every user may write without the sticky bit, or one nobody owns, is refused naming it', (t) => {
    const open = scopedTempDir(t, 'kanal-audit-open-');
    fs.chmodSync(open, 0o777);
    t.regex(auditLogPathProblem(path.join(open, 'audit.log')) ?? '', /writable by every user without the sticky bit \(mode 0777\)/);
    const theirs = path.join(scopedTempDir(t, 'kanal-audit-'), 'theirs');
    fs.mkdirSync(theirs);
    fs.chownSync(theirs, NOBODY, NOBODY);
    t.regex(auditLogPathProblem(path.join(theirs, 'audit.log')) ?? '', /theirs is owned by uid 65534, neither/);
    t.is(auditLogPathProblem(path.join(sharedDir(t), 'audit.log')), undefined, 'a sticky directory like /tmp is accepted');
  });

  const BACKUP = /^audit-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log$/;

  async function writeRotating(t: ExecutionContext, file: string, maxBackups: number, rotations: number): Promise<AuditLog> {
    const registry = new Registry();
    const audit = await openAuditLog({ file: fileOptions(file, { maxBytes: 200, maxBackups }), registry, log: capturedLog().log });
    t.teardown(() => audit.close(100));
    // Two 100-byte lines fill a file: each further line pair rotates once.
    for (let i = 0; i < 2 * (rotations + 1); i++) audit.write(recordOfSize(i, 100));
    await waitUntil(
      async () => (await metricValue(registry, 'kanal_audit_rotations_total')) === rotations,
      `${rotations} rotations`,
      10_000,
    );
    return audit;
  }

  test('backups nobody planted (audit-2099-… files and links) are neither counted nor deleted; ours are kept per --audit-log-maxbackup', async (t) => {
    const dir = sharedDir(t);
    const target = precious(t);
    const file = path.join(dir, 'audit.log');
    const planted = ['audit-2099-01-01T00-00-00.000.log', 'audit-2099-01-02T00-00-00.000.log'];
    asNobody('sh', '-c', `umask 077; : > ${path.join(dir, planted[0])}`);
    asNobody('ln', '-s', target.file, path.join(dir, planted[1]));
    const audit = await writeRotating(t, file, 2, 5);
    await audit.close();
    const left = fs.readdirSync(dir).filter((n) => BACKUP.test(n));
    for (const name of planted) t.true(left.includes(name), `${name} is left alone`);
    const ours = left.filter((n) => !planted.includes(n));
    t.is(ours.length, 2, `our newest two backups are kept: ${left.join(', ')}`);
    for (const name of ours) t.is(fs.lstatSync(path.join(dir, name)).uid, 0);
    t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n', 'the link target is untouched');
    // Only our leftovers: no temporary file of a rotation stays behind.
    t.deepEqual(
      fs.readdirSync(dir).filter((n) => n.startsWith('.')),
      [],
    );
  });

  test.serial(
    'a symbolic link planted in the instant rotation moved the file away is not followed: the new file replaces it',
    async (t) => {
      const dir = sharedDir(t);
      const target = precious(t);
      const file = path.join(dir, 'audit.log');
      // The attacker's best moment: right after the current file is renamed to its backup name, before the next one exists.
      const rename = fs.promises.rename;
      let planted = 0;
      fs.promises.rename = async (from, to) => {
        await rename(from, to);
        if (from === file && planted === 0) {
          planted++;
          asNobody('ln', '-s', target.file, file);
        }
      };
      t.teardown(() => void (fs.promises.rename = rename));
      const audit = await writeRotating(t, file, 0, 1);
      await audit.close();
      t.is(planted, 1, 'the link was planted during the rotation');
      t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n', 'the target is untouched');
      const now = fs.lstatSync(file);
      t.true(now.isFile() && now.uid === 0, 'the path is our new regular file, the link replaced');
      t.is(fs.readFileSync(file, 'utf8').split('\n').length - 1, 2, 'the lines after the rotation are in it');
    },
  );

  test.serial('a symbolic link planted where the file was moved away is not followed at the next rotation', async (t) => {
    const dir = sharedDir(t);
    const target = precious(t);
    const file = path.join(dir, 'audit.log');
    const registry = new Registry();
    const audit = await openAuditLog({ file: fileOptions(file, { maxBytes: 200 }), registry, log: capturedLog().log });
    t.teardown(() => audit.close(100));
    audit.write(recordOfSize(0, 100));
    await waitUntil(async () => (await metricValue(registry, 'kanal_audit_lines_total')) === 1, 'the first line', 10_000);
    // The file moves away (an operator, logrotate), and nobody plants a link in its place.
    const moved = path.join(dir, 'moved.log');
    fs.renameSync(file, moved);
    asNobody('ln', '-s', target.file, file);
    for (let i = 1; i < 4; i++) audit.write(recordOfSize(i, 100));
    await waitUntil(async () => (await metricValue(registry, 'kanal_audit_lines_total')) === 4, 'four lines', 10_000);
    await audit.close();
    t.is(fs.readFileSync(target.file, 'utf8'), 'precious\n', 'the target is untouched');
    const now = fs.lstatSync(file);
    t.true(now.isFile(), 'the path is a regular file again, the link replaced');
    t.is(now.uid, 0);
    t.is(fs.readFileSync(moved, 'utf8').split('\n').length - 1, 2, 'lines up to the size went on into the file we had open');
    t.is(fs.readFileSync(file, 'utf8').split('\n').length - 1, 2, 'the rest into the new file');
    t.is(await metricValue(registry, 'kanal_audit_dropped_lines_total', { reason: 'write_error' }), 0);
  });
}
