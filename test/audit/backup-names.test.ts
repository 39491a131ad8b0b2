/** Rotated audit files are named, and chosen for deletion, as lumberjack does (src/audit/backup-names.ts). */
import test from 'ava';
import { backupPath, backupTime, expiredBackups } from '../../src/audit/backup-names.js';

const AT = Date.UTC(2026, 10, 27, 5, 40, 7, 9);

test('a backup is <name>-<UTC time as 2006-01-02T15-04-05.000><ext>, in the same directory', (t) => {
  t.is(backupPath('/var/log/kanal/audit.log', AT), '/var/log/kanal/audit-2026-11-27T05-40-07.009.log');
  t.is(backupPath('/var/log/audit', AT), '/var/log/audit-2026-11-27T05-40-07.009');
  t.is(backupPath('/var/log/kanal/audit.json.log', AT), '/var/log/kanal/audit.json-2026-11-27T05-40-07.009.log');
});

test('the time is read back from a backup name, and only from one', (t) => {
  const file = '/var/log/kanal/audit.log';
  t.is(backupTime(file, 'audit-2026-11-27T05-40-07.009.log'), AT);
  for (const name of [
    'audit.log',
    'audit-.log',
    'audit-notes.log',
    'audit-2026-11-27T05-40-07.009.log.gz',
    'audit-2026-13-27T05-40-07.009.log',
    'audit-2026-11-27T05-40-61.009.log',
    'other-2026-11-27T05-40-07.009.log',
    'audit-2026-11-27T05:40:07.009.log',
  ]) {
    t.is(backupTime(file, name), undefined, name);
  }
});

test('expired: beyond the newest maxBackups, or older than maxAgeDays; other names never', (t) => {
  const file = '/d/audit.log';
  const hour = 3600_000;
  const names = [
    backupPath(file, AT - 1 * hour),
    backupPath(file, AT - 30 * hour),
    backupPath(file, AT - 2 * hour),
    backupPath(file, AT - 50 * hour),
    'audit.log',
    'audit-notes.log',
  ].map((p) => p.slice('/d/'.length));
  const name = (hoursAgo: number): string => backupPath(file, AT - hoursAgo * hour).slice(3);
  t.deepEqual(expiredBackups(file, names, { maxBackups: 0, maxAgeDays: 0 }, AT), []);
  t.deepEqual(expiredBackups(file, names, { maxBackups: 2, maxAgeDays: 0 }, AT), [name(30), name(50)]);
  t.deepEqual(expiredBackups(file, names, { maxBackups: 0, maxAgeDays: 1 }, AT), [name(30), name(50)]);
  t.deepEqual(expiredBackups(file, names, { maxBackups: 3, maxAgeDays: 2 }, AT), [name(50)]);
  t.deepEqual(expiredBackups(file, names, { maxBackups: 1, maxAgeDays: 2 }, AT), [name(2), name(30), name(50)]);
});
