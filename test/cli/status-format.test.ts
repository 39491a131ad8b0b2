/** `kanal status` text: ages, byte sizes and tables (src/cli/status-format.ts). */
import test from 'ava';
import { formatAge, formatBytes, table } from '../../src/cli/status-format.js';

test('ages read as 45s, 3m12s, 2h05m, 3d04h', (t) => {
  t.is(formatAge(0), '0s');
  t.is(formatAge(45.9), '45s');
  t.is(formatAge(192), '3m12s');
  t.is(formatAge(2 * 3600 + 5 * 60 + 59), '2h05m');
  t.is(formatAge(3 * 86_400 + 4 * 3600), '3d04h');
  t.is(formatAge(-5), '0s');
});

test('bytes read as B, then KiB, MiB, GiB with one decimal below 10', (t) => {
  t.is(formatBytes(0), '0 B');
  t.is(formatBytes(1023), '1023 B');
  t.is(formatBytes(1024), '1.0 KiB');
  t.is(formatBytes(1.2 * 1024 * 1024), '1.2 MiB');
  t.is(formatBytes(300 * 1024), '300 KiB');
  t.is(formatBytes(5 * 1024 ** 3), '5.0 GiB');
  t.is(formatBytes(2 * 1024 ** 6), '2048 PiB');
});

test('a table pads its columns and cuts a long cell with an ellipsis', (t) => {
  const out = table(
    ['A', 'B', 'C'],
    [
      ['x', 'yy', 'z'],
      ['long'.repeat(20), '', 'end'],
    ],
  ).split('\n');
  t.is(out[0], `A${' '.repeat(63)}  B   C`);
  t.is(out[1].indexOf('yy'), 66);
  t.true(out[2].startsWith(`${'long'.repeat(16).slice(0, 63)}…`));
  t.true(out[2].endsWith('end'));
});
