/**
 * A setting's name is spelt where the compiler checks it: its table entry,
 * reads of its parsed value, and the typed handles of
 * src/settings/flag-names.ts. A free string naming it (a refusal text, a
 * listen error's flag list, a credential check's `flag`) goes stale silently
 * when the setting is renamed. Counted by flag-spellings.ts.
 */
import test from 'ava';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { agentSettings } from '../../src/agent/settings.js';
import { serverSettings } from '../../src/server/config/settings.js';
import { tenantSettings } from '../../src/server/config/tenant-settings.js';
import { flagNames, flagOf, flagsOf, keyOf } from '../../src/settings/flag-names.js';
import { countSpellings, multiWordFlags, sources, spellingsOf } from './flag-spellings.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const TABLES = [serverSettings, agentSettings];

/**
 * Where the server's settings are read and checked: its table is importable
 * there (test/packaging/layering.test.ts puts config/ above the rest of
 * src/server), so every name is spelt through it.
 */
const SERVER_CONFIG_LAYER = /^src\/(server\/config\/|cli\/server-command\.ts$)/;

/** Free spellings the rule lets stand there, each with its reason. */
const ALLOWED: readonly { file: string; flag: string; reason: string }[] = [
  // withExamples() lines: a command line as a user types it, shown by --help; one example spreads over several lines.
  { file: 'src/cli/server-command.ts', flag: 'cluster-cert', reason: '--help example line' },
  { file: 'src/cli/server-command.ts', flag: 'cluster-key', reason: '--help example line' },
  { file: 'src/cli/server-command.ts', flag: 'cluster-ca-cert', reason: '--help example line' },
];

/**
 * Free spellings in the rest of src/, at most: most sit below the tables in
 * the layers (a frontend, the agent's tunnels), where the flag should be
 * named by the caller rather than imported. Lower it when they go; it may not grow.
 */
const FREE_ELSEWHERE_CEILING = 200;

test('the typed handles spell a setting as its command line and its file do', (t) => {
  t.is(flagOf(serverSettings, 'cluster-ca-cert'), '--cluster-ca-cert');
  t.is(keyOf(tenantSettings, 'uds-name'), 'uds-name');
  t.is(flagsOf(serverSettings, 'admin-bind-address', 'admin-port'), '--admin-bind-address, --admin-port');
  const flags = flagNames(serverSettings);
  t.is(flags['server-ca-cert'], '--server-ca-cert');
  t.deepEqual(Object.keys(flags), Object.keys(serverSettings));
  t.true(Object.isFrozen(flags));
});

test('the classifier tells typed spellings from free ones', (t) => {
  const files = [
    { file: 'src/x/settings.ts', text: "  'cluster-ca-cert': optionalText({ describe: 'see --uds-name' }),\n" },
    {
      file: 'src/x/use.ts',
      text: "const a = v['cluster-ca-cert'];\nconst b = flagOf(serverSettings, 'cluster-ca-cert');\nthrow new Error('--cluster-ca-cert is required');\ncheck({ flag: 'cluster-ca-cert' });\n",
    },
  ];
  t.deepEqual(
    spellingsOf('cluster-ca-cert', files).map((s) => `${s.file}:${s.line} ${s.kind}`),
    ['src/x/settings.ts:1 entry', 'src/x/use.ts:1 read', 'src/x/use.ts:2 handle', 'src/x/use.ts:3 free', 'src/x/use.ts:4 free'],
  );
  t.deepEqual(
    spellingsOf('uds-name', files).map((s) => s.kind),
    ['help'],
  );
});

test("the server's config layer spells no multi-word flag as a free string but where a reason is listed", (t) => {
  const files = sources(REPO).filter((f) => SERVER_CONFIG_LAYER.test(f.file));
  t.true(files.length >= 8, 'the layer was found');
  const free: string[] = [];
  for (const [name] of multiWordFlags(TABLES))
    for (const s of spellingsOf(name, files))
      if (s.kind === 'free' && !ALLOWED.some((a) => a.file === s.file && a.flag === name)) free.push(`${s.file}:${s.line} ${name}`);
  t.deepEqual(free, [], 'name these through flag-names.ts (FLAG, flagOf, keyOf, flagsOf)');
  for (const a of ALLOWED)
    t.true(
      spellingsOf(a.flag, files).some((s) => s.kind === 'free' && s.file === a.file),
      `${a.file} ${a.flag}: allowed (${a.reason}) but no longer spelt there; drop it from ALLOWED`,
    );
});

test('free spellings elsewhere in src/ do not grow', (t) => {
  const rows = countSpellings(REPO, TABLES);
  const free = rows.reduce((n, r) => n + r.free, 0);
  const over = rows.filter((r) => r.total > 2 * r.commands);
  t.log(
    `${rows.length} multi-word flags; ${free} free spellings; ${over.length} spelt more than twice per command (${over.reduce((n, r) => n + r.total - 2 * r.commands, 0)} extra spellings)`,
  );
  t.log(
    'most free:',
    [...rows]
      .sort((a, b) => b.free - a.free)
      .slice(0, 5)
      .map((r) => `${r.name} ${r.free}`)
      .join(', '),
  );
  t.true(free <= FREE_ELSEWHERE_CEILING, `${free} free spellings, more than the ${FREE_ELSEWHERE_CEILING} allowed: use flag-names.ts`);
});
