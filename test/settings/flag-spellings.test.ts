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

/** Why a free spelling may stand where it is: the reasons the rule admits. */
const HELP_EXAMPLE = '--help example line: a command line as a user types it, one example spread over several lines (withExamples)';
const OWN_TABLE = "install-node's own option table declares its --dry-run";
const GENERATED = 'generated from systemd/ by scripts/unit-templates.mjs: the unit files name the flags they pass';
const VALUE_TYPE = "a parameter's type naming the parsed values it reads (checked where the table's values are passed in)";
const SHARED_LOWER =
  "a module below both commands' tables (common/, settings/, audit/, kube/) that both use: it may import neither table, so it spells the flag once";
const BELOW_SERVER_TABLE =
  "below the server's table in the rooms (test/packaging/layers.ts: config/ sits above the rest of src/server): spelt once in the module";
const AGENT_TABLE_IMPORTS_IT = "imported by the agent's table (src/agent/settings.ts): importing FLAG back would make an import circle";
const OTHER_COMMAND = "the other command's flag, named in a hint: the agent and the server may not import each other's table";

/**
 * Every free spelling the rule lets stand in src/: by reason, then file, the
 * flags spelt free there, each at most once in that file. Anything else is
 * named through src/settings/flag-names.ts (FLAG, flagOf, keyOf, flagsOf).
 */
const ALLOWED: readonly { reason: string; files: Readonly<Record<string, readonly string[]>> }[] = [
  {
    reason: HELP_EXAMPLE,
    files: {
      'src/cli/server-command.ts': ['cluster-cert', 'cluster-key', 'cluster-ca-cert'],
      'src/cli/install-node-command.ts': ['ca-cert', 'agent-cert', 'agent-key', 'bind-address'],
    },
  },
  { reason: OWN_TABLE, files: { 'src/cli/install-node-command.ts': ['dry-run'] } },
  { reason: GENERATED, files: { 'src/cli/install/unit-templates.ts': ['bind-address', 'connect-timeout', 'shutdown-grace-period'] } },
  {
    reason: VALUE_TYPE,
    files: {
      'src/kube/settings.ts': ['kubeconfig-qps', 'kubeconfig-burst'],
      'src/settings/http-port-settings.ts': ['http-max-connections', 'http-idle-timeout'],
    },
  },
  {
    reason: SHARED_LOWER,
    files: {
      'src/settings/process-settings.ts': ['log-level'],
      'src/audit/audit-log.ts': ['audit-log-path'],
      'src/audit/drop-report.ts': ['audit-log-maxsize'],
      'src/common/admin-server.ts': ['enable-profiling'],
      'src/common/http-listener.ts': ['http-max-connections', 'http-idle-timeout'],
      'src/kube/kube-api.ts': ['kube-api-content-type', 'kubeconfig-qps', 'kubeconfig-burst'],
      'src/kube/lease.ts': ['server-id'],
    },
  },
  {
    reason: BELOW_SERVER_TABLE,
    files: {
      'src/server/agents/agent-registry.ts': ['max-agents-per-credential'],
      'src/server/agents/agent-service.ts': [
        'max-pending-dials-per-agent',
        'max-node-to-cp-connections-per-agent',
        'max-cp-to-node-connections-per-agent',
        'dial-rate-per-agent',
        'peer-read-timeout',
      ],
      'src/server/destinations/destination-dialer.ts': ['allowed-destination', 'max-node-to-cp-connections'],
      'src/server/frontends/backend-dialer.ts': ['proxy-strategies'],
      'src/server/frontends/unix-socket.ts': ['uds-name', 'delete-existing-uds-file', 'uds-group'],
      'src/server/identity/client-roles.ts': [
        'agent-client-subject',
        'agent-client-eku',
        'frontend-client-subject',
        'frontend-client-eku',
        'cluster-ca-cert',
        'server-ca-cert',
      ],
      'src/server/identity/token-authenticator.ts': ['agent-namespace', 'agent-service-account', 'authentication-audience'],
      'src/server/leases/lease-controller.ts': ['lease-label', 'server-id'],
      'src/server/listeners.ts': [
        'allow-unauthenticated-agents',
        'agent-bind-address',
        'agent-port',
        'uds-name',
        'server-port',
        'server-bind-address',
      ],
      'src/server/tenants/tenant-definition.ts': ['tenants-config'],
      'src/server/tenants/tenant.ts': ['memory-budget'],
    },
  },
  {
    reason: AGENT_TABLE_IMPORTS_IT,
    files: {
      'src/agent/bind-probe.ts': ['bind-address', 'bind-interface-type'],
      'src/agent/host-interface-manager.ts': ['bind-interface'],
      'src/agent/server-count.ts': ['server-count-source'],
    },
  },
  {
    reason: OTHER_COMMAND,
    files: {
      'src/agent/connect-diagnosis.ts': [
        'cluster-ca-cert',
        'agent-port',
        'agent-client-subject',
        'allow-unauthenticated-agents',
        'agent-namespace',
        'agent-service-account',
        'authentication-audience',
        'cluster-cert',
      ],
      // target.ts is also imported by the agent's table.
      'src/agent/target.ts': ['allowed-destination', 'tenants-config'],
      'src/server/identity/token-authenticator.ts': ['service-account-token-path'],
    },
  },
];

/** The reasons `flag` may be spelt free in `file`. */
function reasonsFor(file: string, flag: string): string[] {
  return ALLOWED.filter((a) => a.files[file]?.includes(flag)).map((a) => a.reason);
}

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

test('src/ spells no multi-word flag as a free string but where a reason is listed, and there once', (t) => {
  const files = sources(REPO);
  t.true(files.length >= 100, 'src/ was found');
  const flags = multiWordFlags(TABLES);
  const free = new Map<string, number[]>();
  for (const [name] of flags)
    for (const s of spellingsOf(name, files))
      if (s.kind === 'free') free.set(`${s.file} ${name}`, [...(free.get(`${s.file} ${name}`) ?? []), s.line]);
  const unlisted = [...free].filter(([at]) => reasonsFor(...(at.split(' ') as [string, string])).length === 0);
  t.deepEqual(
    unlisted.map(([at, lines]) => `${at} (line ${lines.join(', ')})`),
    [],
    'name these through flag-names.ts (FLAG, flagOf, keyOf, flagsOf), or have the caller that owns the setting pass the name in',
  );
  const repeated = [...free].filter(([, lines]) => lines.length > 1);
  t.deepEqual(
    repeated.map(([at, lines]) => `${at} (lines ${lines.join(', ')})`),
    [],
    'spell a flag a module may not import once there, in a constant',
  );
  for (const { reason, files: listed } of ALLOWED)
    for (const [file, names] of Object.entries(listed))
      for (const name of names) {
        t.true(flags.has(name), `${file} ${name}: no such multi-word flag`);
        t.true(free.has(`${file} ${name}`), `${file} ${name}: allowed (${reason}) but no longer spelt there; drop it from ALLOWED`);
      }
  const keys = ALLOWED.flatMap((a) => Object.entries(a.files).flatMap(([file, names]) => names.map((n) => `${file} ${n}`)));
  t.is(new Set(keys).size, keys.length, 'each file and flag is listed under one reason');
});

test('how often each multi-word flag is spelt', (t) => {
  const rows = countSpellings(REPO, TABLES);
  const free = rows.reduce((n, r) => n + r.free, 0);
  const over = rows.filter((r) => r.total > 2 * r.commands);
  const overFree = rows.filter((r) => r.free > 2 * r.commands);
  t.log(
    `${rows.length} multi-word flags; ${free} free spellings; ${over.length} spelt more than twice per command in all (typed spellings included; ${over.reduce((n, r) => n + r.total - 2 * r.commands, 0)} extra spellings); ${overFree.length} spelt free more than twice per command`,
  );
  t.log(
    'most free:',
    [...rows]
      .sort((a, b) => b.free - a.free)
      .slice(0, 5)
      .map((r) => `${r.name} ${r.free}`)
      .join(', '),
  );
  const listed = ALLOWED.reduce((n, a) => n + Object.values(a.files).reduce((m, names) => m + names.length, 0), 0);
  t.is(free, listed, 'every free spelling is one ALLOWED lists');
});
