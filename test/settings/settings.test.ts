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
import { HELP_GROUPS } from '../../src/settings/groups.js';
import { EXAMPLE_WIDTH } from '../../src/cli/help-examples.js';
import { tenantSettings } from '../../src/server/config/tenant-settings.js';
import { runCli } from '../helpers/kanal-processes.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

const table = {
  'listen-port': port({ default: 8080, allowZero: false, describe: 'a port', group: 'Health and admin ports' }),
  'dial-timeout': duration({ default: '5s', describe: 'a wait', group: 'Dials and reconnects' }),
  'max-dials': count({ default: 3, describe: 'a count', group: 'Dials and reconnects' }),
  name: optionalText({ describe: 'a name', group: 'Health and admin ports' }),
  tag: list({ describe: 'tags', group: 'Health and admin ports' }),
  quiet: { ...toggle({ describe: 'hidden toggle', group: 'Upstream flags Kanal ignores' }), hidden: true, notice: 'upstream only' },
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
  // Groups in the order groups.ts declares them, whatever the table's; hidden settings in none.
  t.deepEqual(
    [...helpGroups(table)],
    [
      ['Dials and reconnects', ['dial-timeout', 'max-dials']],
      ['Health and admin ports', ['listen-port', 'name', 'tag']],
    ],
  );
  t.deepEqual(upstreamNotices({ quiet: true }, table), ['--quiet ignored: upstream only']);
  t.deepEqual(upstreamNotices({}, table), []);
});

test('the reference lists every visible setting of a group with its default, and the ignored ones by name', (t) => {
  const md = renderReference('demo', table);
  t.regex(
    md,
    /### Health and admin ports\n\n\| flag \| type \| default \| what it does \|\n\|---\|---\|---\|---\|\n\| `--listen-port` \| number \| `8080` \| a port \|/,
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

test('every setting is in a group of src/settings/groups.ts, each group declared there is used, and --help shows them in its order', async (t) => {
  t.is(new Set(HELP_GROUPS).size, HELP_GROUPS.length, 'each group declared once');
  const tables: Array<[where: string, table: SettingTable]> = [
    ['kanal server', serverSettings],
    ['kanal agent', agentSettings],
    ['the tenants file', tenantSettings],
  ];
  const declared: readonly string[] = HELP_GROUPS;
  const used = new Set<string>();
  for (const [where, tbl] of tables) {
    for (const [name, s] of Object.entries(tbl)) {
      t.true(declared.includes(s.group), `${where} ${name}: group ${JSON.stringify(s.group)} is not declared in src/settings/groups.ts`);
      used.add(s.group);
    }
  }
  t.deepEqual(
    declared.filter((g) => !used.has(g)),
    [],
    'groups declared but used by no setting',
  );
  const commands: Array<[command: string, table: SettingTable]> = [
    ['server', serverSettings],
    ['agent', agentSettings],
  ];
  for (const [command, tbl] of commands) {
    const help = await runCli([command, '--help']);
    t.is(help.code, 0, help.stderr);
    const headings = help.stdout
      .split('\n')
      .filter((l) => /^\S.*:$/.test(l))
      .map((l) => l.slice(0, -1));
    const shown = HELP_GROUPS.filter((g) => Object.values(tbl).some((s) => s.group === g && !s.hidden));
    t.deepEqual(headings, [...shown, 'Options', 'Examples'], `kanal ${command} --help: the groups in the order of groups.ts`);
    // Examples are typed as shown: no line wrapped by the terminal (help-examples.ts).
    const examples = help.stdout.slice(help.stdout.indexOf('\nExamples:\n')).split('\n');
    t.deepEqual(
      examples.filter((l) => l.length > EXAMPLE_WIDTH),
      [],
      `kanal ${command} --help: example lines within ${EXAMPLE_WIDTH} columns`,
    );
    t.true(
      examples.some((l) => l.startsWith(`    kanal ${command} `)),
      `kanal ${command} --help shows an example`,
    );
  }
});
