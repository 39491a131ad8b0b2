/**
 * The settings tables: what yargs, --help, validation and docs/flags.md are
 * derived from. Each derived view must follow the table, and a value of the
 * wrong shape (a caller that bypasses yargs) is refused naming the flag.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { UsageError } from '../../src/common/usage-error.js';
import { count, duration, list, optionalText, port, toggle } from '../../src/settings/kinds.js';
import { helpGroups, readSettings, upstreamNotices, yargsOptions } from '../../src/settings/table.js';
import { renderReference } from '../../src/settings/reference.js';
import type { SettingTable } from '../../src/settings/setting.js';
import { agentSettings } from '../../src/agent/settings.js';
import { serverSettings } from '../../src/server/config/settings.js';
import { flagsPage } from '../../src/cli/flags-page.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const table = {
  'listen-port': port({ default: 8080, allowZero: false, describe: 'a port', group: 'Ports' }),
  'dial-timeout': duration({ default: '5s', describe: 'a wait', group: 'Dials' }),
  'max-dials': count({ default: 3, describe: 'a count', group: 'Dials' }),
  name: optionalText({ describe: 'a name', group: 'Ports' }),
  tag: list({ describe: 'tags', group: 'Ports' }),
  quiet: { ...toggle({ describe: 'hidden toggle', group: 'Secret' }), hidden: true, notice: 'upstream only' },
} as const;

test('readSettings parses every entry with its own parser, defaults applied by the caller (yargs)', (t) => {
  const v = readSettings(table, { 'listen-port': 9000, 'dial-timeout': '1m30s', 'max-dials': 7, tag: ['a', 'b'], quiet: false });
  t.deepEqual(v, { 'listen-port': 9000, 'dial-timeout': 90_000, 'max-dials': 7, name: undefined, tag: ['a', 'b'], quiet: false });
});

test('readSettings: the first bad value, in table order, is a UsageError naming its flag', (t) => {
  const given = { 'listen-port': 0, 'dial-timeout': '5', 'max-dials': 3, tag: [], quiet: false };
  t.throws(() => readSettings(table, given), { instanceOf: UsageError, message: '--listen-port must be a port number 1-65535, got 0' });
  t.throws(() => readSettings(table, { ...given, 'listen-port': 1 }), {
    instanceOf: UsageError,
    message: /^--dial-timeout: duration "5" needs a unit/,
  });
});

test('readSettings refuses a value of the wrong shape instead of passing it on', (t) => {
  const given = { 'listen-port': '8080', 'dial-timeout': '5s', 'max-dials': 3, tag: [], quiet: false };
  t.throws(() => readSettings(table, given), { instanceOf: UsageError, message: '--listen-port takes number values' });
  t.throws(() => readSettings(table, { ...given, 'listen-port': 1, tag: 'a' }), {
    instanceOf: UsageError,
    message: '--tag takes a list of string values',
  });
});

test('yargs options, help groups and notices are derived from the table', (t) => {
  const o = yargsOptions(table);
  t.deepEqual(o['listen-port'], { type: 'number', describe: 'a port', default: 8080 });
  t.deepEqual(o.tag, { type: 'string', describe: 'tags', array: true, default: [] });
  t.deepEqual(o.name, { type: 'string', describe: 'a name' });
  t.is(o.quiet?.hidden, true);
  // Groups in the order the table first names them; hidden settings in none.
  t.deepEqual(
    [...helpGroups(table)],
    [
      ['Ports', ['listen-port', 'name', 'tag']],
      ['Dials', ['dial-timeout', 'max-dials']],
    ],
  );
  t.deepEqual(upstreamNotices({ quiet: true }, table), ['--quiet ignored: upstream only']);
  t.deepEqual(upstreamNotices({}, table), []);
});

test('the reference lists every visible setting of a group with its default, and the ignored ones by name', (t) => {
  const md = renderReference('demo', table);
  t.regex(
    md,
    /### Ports\n\n\| flag \| type \| default \| what it does \|\n\|---\|---\|---\|---\|\n\| `--listen-port` \| number \| `8080` \| a port \|/,
  );
  t.regex(md, /\| `--tag` \| string, repeatable \| {2}\| tags \|/);
  t.false(md.includes('| `--quiet`'));
  t.regex(md, /accepted and ignored[\s\S]*`--quiet`/);
});

test('docs/flags.md is the page the tables render (run `npm run docs:flags` after changing a setting)', (t) => {
  const committed = fs.readFileSync(path.join(REPO, 'docs', 'flags.md'), 'utf8');
  t.is(committed, flagsPage(), 'docs/flags.md is stale: run `npm run docs:flags`');
});

test('every setting of both commands is in a group, described, and has a parser that accepts its own default', (t) => {
  const tables: Array<[command: string, table: SettingTable]> = [
    ['server', serverSettings],
    ['agent', agentSettings],
  ];
  for (const [command, tbl] of tables) {
    for (const [name, s] of Object.entries(tbl)) {
      t.true(s.describe.length > 0 && s.group.length > 0, `${command} --${name}`);
      // Defaults must pass their own checks (required settings have none and are checked by the command's tests).
      if (s.default !== undefined) t.notThrows(() => s.parse(s.default, name), `${command} --${name} default`);
    }
  }
});
