/**
 * The clients: list checked (src/server/config/clients-config.ts): each
 * mistake names its entry, its key and what to write; a valid list becomes
 * entries whose token files are read at load.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'ava';
import { checkClients, ClientsFileError, loadClients, readClientsFile } from '../../../src/server/config/clients-config.js';

const CTX = { tokenReview: true, tokenReviewHint: '--agent-namespace, --agent-service-account and --authentication-audience' };

/** The mistakes of `list` (one entry's mistakes when given a single entry). */
function mistakes(list: unknown, ctx = CTX): string[] {
  return checkClients(list, ctx).mistakes;
}

function tmpdir(t: { teardown: (f: () => void) => void }): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-clients-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

test('a valid list: rules parsed, a service held as its two names, the kube-apiserver allowed all by default', (t) => {
  const { specs, mistakes: found } = checkClients(
    [
      {
        name: 'prometheus',
        subject: 'CN=prometheus',
        allow: [
          { cidr: '10.0.0.0/8', port: 9100 },
          { cidr: 'fd00::/8', port: '9100-9110' },
          { cidr: '192.168.1.5' },
          { name: '*.svc.cluster.local.', port: 443 },
          { service: 'monitoring/node-exporter' },
        ],
        limits: { connections: 100, 'dial-rate': 0 },
      },
      { name: 'kube-apiserver', uid: 0 },
    ],
    CTX,
  );
  t.deepEqual(found, []);
  const [prom, kas] = specs;
  t.is(kas.allow, 'all');
  t.not(prom.allow, 'all');
  if (prom.allow === 'all') return;
  t.deepEqual(
    prom.allow.map((r) => r.text),
    [
      'cidr 10.0.0.0/8 port 9100',
      'cidr fd00::/8 ports 9100-9110',
      'cidr 192.168.1.5/32',
      'name *.svc.cluster.local port 443',
      'service monitoring/node-exporter',
    ],
  );
  const svc = prom.allow[4];
  t.deepEqual(svc.kind === 'names' ? svc.names : [], ['node-exporter.monitoring.svc', 'node-exporter.monitoring.svc.cluster.local']);
  t.deepEqual(prom.limits, { connections: 100, dialRate: 0 });
});

test('each mistake names the entry, the key and what to write', (t) => {
  const cases: [unknown, RegExp][] = [
    [{ name: 'Bad_Name', uid: 1 }, /^clients\[0\] "Bad_Name": name "Bad_Name": want a lowercase DNS label/],
    [{ uid: 1 }, /^clients\[0\]: name undefined: want a lowercase DNS label/],
    [{ name: 'a' }, /clients\[0\] "a": nothing recognises this client: give subject, service-account, token-file or uid/],
    [{ name: 'a', uid: -1 }, /"a": uid -1: want the numeric user ID/],
    [{ name: 'a', subject: '' }, /"a": subject "": want the client certificate's subject/],
    [{ name: 'a', 'service-account': 'prometheus' }, /"a": service-account "prometheus": want namespace\/name/],
    [{ name: 'a', 'token-file': 3 }, /"a": token-file 3: want the path of a file/],
    [{ name: 'a', uid: 1, colour: 'red' }, /"a": unknown key "colour" \(an entry takes name, subject/],
    [{ name: 'a', uid: 1, allow: 'some' }, /"a": allow "some": want "all" or a list of rules/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/33' }] }, /"a": allow\[0\]: cidr "10.0.0.0\/33": an IPv4 prefix is at most \/32/],
    [{ name: 'a', uid: 1, allow: [{ cidr: 'fd00::/129' }] }, /allow\[0\]: cidr "fd00::\/129": an IPv6 prefix is at most \/128/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0/8' }] }, /allow\[0\]: cidr "10.0.0\/8": want an IPv4 or IPv6 network/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/8', port: 0 }] }, /allow\[0\]: port 0: want a port 1-65535, or a range/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/8', port: 70000 }] }, /allow\[0\]: port 70000: want a port 1-65535/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/8', port: '9110-9100' }] }, /allow\[0\]: port "9110-9100": want a port/],
    [{ name: 'a', uid: 1, allow: [{ name: 'a..b' }] }, /allow\[0\]: name "a..b": want a DNS name/],
    [{ name: 'a', uid: 1, allow: [{ name: '*' }] }, /allow\[0\]: name "\*": want a DNS name/],
    [{ name: 'a', uid: 1, allow: [{ name: 'x.*.com' }] }, /allow\[0\]: name "x.\*.com": want a DNS name/],
    [{ name: 'a', uid: 1, allow: [{ name: '10.0.0.1' }] }, /allow\[0\]: name "10.0.0.1" is an IP address: write it as cidr: 10.0.0.1/],
    [
      { name: 'a', uid: 1, allow: [{ service: 'node-exporter' }] },
      /allow\[0\]: service "node-exporter": want namespace\/name of a Service/,
    ],
    [
      { name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/8', name: 'x.com' }] },
      /allow\[0\]: a rule has one of cidr, name or service, not cidr and name/,
    ],
    [{ name: 'a', uid: 1, allow: [{ port: 80 }] }, /allow\[0\]: a rule needs one of cidr, name or service/],
    [{ name: 'a', uid: 1, allow: [{ cidr: '10.0.0.0/8', ports: 80 }] }, /allow\[0\]: unknown key "ports"/],
    [{ name: 'a', uid: 1, allow: ['10.0.0.0/8'] }, /allow\[0\]: want a mapping with one of cidr, name or service/],
    [{ name: 'a', uid: 1, limits: { connections: 0 } }, /"a": limits: connections 0: want a whole number, at least 1/],
    [{ name: 'a', uid: 1, limits: { conns: 5 } }, /"a": limits: unknown key "conns"/],
    ['prometheus', /^clients\[0\]: want a mapping with name/],
  ];
  for (const [entry, want] of cases) {
    const found = mistakes([entry]);
    t.is(found.length, 1, `${JSON.stringify(entry)}: ${found.join(' | ')}`);
    t.regex(found[0] ?? '', want, JSON.stringify(entry));
  }
});

test('a service-account entry without token review names what to configure', (t) => {
  const [m] = mistakes([{ name: 'prom', 'service-account': 'monitoring/prometheus' }], { ...CTX, tokenReview: false });
  t.regex(m, /"prom": service-account "monitoring\/prometheus": its tokens are checked by TokenReview, which needs --agent-namespace/);
});

test("names, subjects, uids, service accounts and token files are each one entry's", (t) => {
  const found = mistakes([
    { name: 'a', uid: 5, subject: 'CN=x' },
    { name: 'a', uid: 6 },
    { name: 'b', uid: 5 },
    { name: 'c', subject: 'CN=x' },
    { name: 'd', 'service-account': 'ns/sa' },
    { name: 'e', 'service-account': 'ns/sa' },
    { name: 'f', 'token-file': '/t' },
    { name: 'g', 'token-file': '/t' },
  ]);
  t.deepEqual(found, [
    'client "a" is declared more than once: names are unique',
    'client "b": uid "5" is already client "a"\'s',
    'client "c": subject "CN=x" is already client "a"\'s',
    'client "e": service-account "ns/sa" is already client "d"\'s',
    'client "g": token-file "/t" is already client "f"\'s',
  ]);
});

test('not a list', (t) => {
  t.deepEqual(mistakes({ name: 'a' }), ['clients: want a list of client entries (name, subject/uid/token-file/service-account, allow)']);
  t.deepEqual(mistakes(undefined), []);
});

test('token files are read at load: a missing or empty one, or one token for two clients, is named', (t) => {
  const dir = tmpdir(t);
  fs.writeFileSync(path.join(dir, 'a.token'), 'secret-a\n');
  fs.writeFileSync(path.join(dir, 'b.token'), 'secret-a');
  fs.writeFileSync(path.join(dir, 'empty.token'), '\n');
  const { specs } = checkClients(
    [
      { name: 'a', 'token-file': path.join(dir, 'a.token') },
      { name: 'b', 'token-file': path.join(dir, 'b.token') },
      { name: 'c', 'token-file': path.join(dir, 'empty.token') },
      { name: 'd', 'token-file': path.join(dir, 'missing.token') },
    ],
    CTX,
  );
  const { entries, mistakes: found } = loadClients(specs, 'tenant "t": ');
  t.is(found.length, 3, found.join('\n'));
  t.regex(found[0], /^tenant "t": client "b": token-file .*b\.token holds the same token as client "a"'s/);
  t.regex(found[1], /client "c": token-file .*empty\.token: the file is empty/);
  t.regex(found[2], /client "d": token-file .*missing\.token: cannot read \(ENOENT/);
  t.is(entries[0].token?.digest.length, 32);
  t.false(JSON.stringify(entries).includes('secret-a'), 'the token itself is not kept');
});

test('--frontend-clients-config: a YAML file with clients:, every mistake listed with the flag and file', async (t) => {
  const dir = tmpdir(t);
  const good = path.join(dir, 'clients.yaml');
  fs.writeFileSync(good, 'clients:\n- name: prom\n  uid: 1000\n  allow:\n  - cidr: 127.0.0.0/8\n    port: 9100\n');
  const entries = await readClientsFile('--frontend-clients-config', good, CTX);
  t.is(entries[0].name, 'prom');
  const bad = path.join(dir, 'bad.yaml');
  fs.writeFileSync(bad, 'client:\n- name: prom\n');
  const err = await t.throwsAsync(readClientsFile('--frontend-clients-config', bad, CTX), { instanceOf: ClientsFileError });
  t.regex(
    err?.message ?? '',
    /^--frontend-clients-config .*bad\.yaml: 2 mistakes:\n {2}unknown key "client" \(the file holds clients:\)\n {2}no clients: list/,
  );
  fs.writeFileSync(bad, 'clients: [\n');
  await t.throwsAsync(readClientsFile('--frontend-clients-config', bad, CTX), { message: /not YAML/ });
  await t.throwsAsync(readClientsFile('--frontend-clients-config', path.join(dir, 'none.yaml'), CTX), { message: /cannot read/ });
});
