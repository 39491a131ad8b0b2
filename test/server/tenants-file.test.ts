/**
 * The tenants file's checks (src/server/config/tenants-file.ts): what
 * docs/multi-tenant.md shows is accepted as written, and a file with
 * mistakes is refused with every one of them, each naming its tenant and
 * setting, its unusable credential files among them; a text that does not
 * parse is refused with that one error, where it is.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import os from 'node:os';
import { parseTenants, TenantsFileError } from '../../src/server/config/tenants-file.js';
import { loadTenants } from '../../src/server/config/tenants-loader.js';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';

const DOC = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../docs/multi-tenant.md');

/** The YAML blocks of the page that are tenants files. */
function docTenantsFiles(): string[] {
  const text = fs.readFileSync(DOC, 'utf8');
  return [...text.matchAll(/```yaml\n([\s\S]*?)```/g)].map((m) => m[1]).filter((y) => y.includes('kind: TenantsConfig'));
}

function mistakesOf(yaml: string): readonly string[] {
  try {
    parseTenants(yaml, 'tenants.yaml');
    return [];
  } catch (err) {
    if (err instanceof TenantsFileError) return err.mistakes;
    throw err;
  }
}

test('every tenants file docs/multi-tenant.md shows is accepted as written', (t) => {
  const files = docTenantsFiles();
  t.true(files.length >= 2, 'the schema and the worked example');
  for (const yaml of files) t.deepEqual(mistakesOf(yaml), [], yaml.slice(0, 200));
});

test('a file with mistakes: every one reported, each with its tenant and setting; a tenant with none is not mentioned', (t) => {
  const mistakes = mistakesOf(`apiVersion: kanal.dev/v1alpha1
kind: TenantsConfig
extra: 1
tenants:
  - name: good
    cluster-ca-cert: /ca.crt
    uds-name: /run/good.sock
  - name: bad
    cluster-ca-cert: /ca.crt
    server-ca-cert: /kas-ca.crt
    server-count: 0
    max-agents: -1
    tenant-workers: 0
    allowed-destination: nope
    --uds-name: /x
  - cluster-ca-cert: /ca.crt
  - name: good
    cluster-ca-cert: /ca.crt
    uds-name: /run/other.sock
  - name: tokens-only
    agent-namespace: kube-system
    agent-service-account: konnectivity-agent
    authentication-audience: system:konnectivity-server
    uds-name: /run/t.sock
`);
  t.deepEqual(mistakes, [
    'unknown key "extra" (want apiVersion, kind, tenants)',
    'tenant "bad": unknown setting "--uds-name": write the setting without dashes',
    'tenant "bad": tenant-workers must be a whole number of at least 1, got 0',
    'tenant "bad": max-agents must be a whole number of at least 1, got -1',
    'tenant "bad": server-count must be a positive integer, got 0',
    'tenant "bad": allowed-destination: address "nope": expected host:port',
    'tenants[2]: name is required',
    "tenants[2]: its kube-apiserver needs a way in: uds-name (its own Unix socket), or server-ca-cert (its client certificate's CA on the shared TCP frontend)",
    'tenant "tokens-only": agents with tokens alone are told apart by server-name or token-issuer: give one',
    'tenant "good" is declared more than once',
  ]);
});

test('the document must say which version it is, and a list of tenants', (t) => {
  t.deepEqual(mistakesOf('kind: TenantsConfig\ntenants: {}\n'), [
    'apiVersion undefined: this Kanal reads kanal.dev/v1alpha1',
    'tenants: want a list of tenants',
  ]);
  t.deepEqual(mistakesOf('just text'), ['want a mapping with apiVersion: kanal.dev/v1alpha1, kind: TenantsConfig and tenants']);
  t.regex(mistakesOf('a: [\n')[0] ?? '', /^not YAML at line 2, column 1: /);
});

test('a file that does not parse is reported alone, with where: one missing ] is one mistake, not one per error it causes', (t) => {
  const yaml = `apiVersion: kanal.dev/v1alpha1
kind: TenantsConfig
tenants:
  - name: alpha
    server-name: [a.example.com, b.example.com
    cluster-ca-cert: /ca.crt
`;
  const err = t.throws(() => parseTenants(yaml, 'tenants.yaml'), { instanceOf: TenantsFileError });
  t.is(err?.mistakes.length, 1);
  const [first, ...excerpt] = err?.message.split('\n') ?? [];
  t.is(
    first,
    '--tenants-config tenants.yaml: not YAML at line 6, column 5: Flow sequence in block collection must be sufficiently indented and end with a ]',
  );
  t.deepEqual(excerpt, ['        server-name: [a.example.com, b.example.com', '        cluster-ca-cert: /ca.crt', '        ^']);
  t.notRegex(err?.message ?? '', /mistakes:|:\n\s*\n/, 'no count of mistakes, no colon left dangling');
  // JSON is YAML too: its mistakes are told the same way.
  t.deepEqual(
    mistakesOf('{"apiVersion": "kanal.dev/v1alpha1", "kind": "TenantsConfig", "tenants": [{"name": "a"}\n').map((m) => m.split('\n')[0]),
    ['not YAML at line 2, column 1: Flow sequence in block collection must be sufficiently indented and end with a ]'],
  );
});

test("unusable credential files are reported with the entries' other mistakes, in one report", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-tenants-files-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const pki = await writeThrowawayPki(dir, { serverIps: ['127.0.0.1'] });
  const file = path.join(dir, 'tenants.yaml');
  const missing = path.join(dir, 'missing.key');
  fs.writeFileSync(
    file,
    `apiVersion: kanal.dev/v1alpha1
kind: TenantsConfig
tenants:
  - name: alpha
    server-name: [alpha.example.com]
    cluster-cert: ${pki.serverCert}
    cluster-key: ${missing}
    cluster-ca-cert: ${pki.caCert}
    uds-name: ${path.join(dir, 'alpha.sock')}
  - name: beta
    cluster-ca-cert: ${path.join(dir, 'missing-ca.crt')}
    uds-name: ${path.join(dir, 'beta.sock')}
    max-agnets: 3
`,
  );
  const err = t.throws(() => loadTenants(file, { tcpFrontend: false }), { instanceOf: TenantsFileError });
  t.deepEqual(err?.mistakes, [
    `tenant "beta": unknown setting "max-agnets" (a tenant takes the settings listed in docs/multi-tenant.md; ports, listeners and logging are the command line's)`,
    `tenant "alpha": cluster-key ${missing}: cannot read (ENOENT: no such file)`,
    `tenant "beta": cluster-ca-cert ${path.join(dir, 'missing-ca.crt')}: cannot read (ENOENT: no such file)`,
  ]);
});
