/**
 * A tenant's clients (src/server/clients/client-admission.ts, client-policy.ts):
 * who a client is by subject, uid or token (407 without one when a token
 * could help, 403 for a wrong one), and what it may reach, the rules applied
 * after a name is resolved; each refusal counted, logged and audited with the
 * client's name.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import test from 'ava';
import { KanalMetrics } from '../../../src/domain/metrics.js';
import { Refusals } from '../../../src/domain/refusal-log.js';
import { ConnectionAuditor } from '../../../src/audit/connection-auditor.js';
import type { AuditRecord } from '../../../src/audit/audit-record.js';
import { DialError } from '../../../src/tunnel/errors.js';
import type { ClientIdentity, TunnelConnection } from '../../../src/tunnel/connection.js';
import type { ResolvedName } from '../../../src/tunnel/name-resolution.js';
import { checkClients, loadClients } from '../../../src/server/config/clients-config.js';
import { ClientMetrics } from '../../../src/server/clients/client-metrics.js';
import { ClientPolicy } from '../../../src/server/clients/client-policy.js';
import { ClientRefused, type AgentDialer } from '../../../src/server/clients/frontend-client.js';
import type { ClientEntry } from '../../../src/server/clients/client-entry.js';
import type { TokenReviewer } from '../../../src/server/clients/client-admission.js';
import { captureLogger } from '../../helpers/memory-stream.js';
import { metricValue } from '../../helpers/audit-log.js';

/** An agent dialer that records its dials and answers names from `names`. */
class FakeDialer implements AgentDialer {
  readonly dials: { address: string; client: ClientIdentity; routeHost?: string }[] = [];
  readonly resolved: string[] = [];
  constructor(private readonly names: Record<string, readonly string[]> = {}) {}
  dial(address: string, _signal: unknown, client: ClientIdentity, routeHost?: string): Promise<TunnelConnection> {
    this.dials.push({ address, client, ...(routeHost === undefined ? {} : { routeHost }) });
    return Promise.resolve({ state: 'open', address } as unknown as TunnelConnection);
  }
  resolve(name: string): Promise<ResolvedName> {
    this.resolved.push(name);
    const addresses = this.names[name];
    if (!addresses) return Promise.reject(new DialError('unresolved', `cannot resolve ${name}: no such host (system)`));
    return Promise.resolve({ addresses, resolver: 'system' });
  }
}

function entries(list: unknown[], t: { teardown: (f: () => void) => void }): ClientEntry[] {
  const { specs, mistakes } = checkClients(list, { tokenReview: true, tokenReviewHint: '' });
  if (mistakes.length > 0) throw new Error(mistakes.join('\n'));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-policy-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const withFiles = specs.map((s) =>
    s.tokenFile === undefined ? s : (fs.writeFileSync(path.join(dir, s.name), s.tokenFile), { ...s, tokenFile: path.join(dir, s.name) }),
  );
  const loaded = loadClients(withFiles);
  if (loaded.mistakes.length > 0) throw new Error(loaded.mistakes.join('\n'));
  return loaded.entries;
}

const LIST = [
  {
    name: 'prometheus',
    subject: 'CN=prometheus, O=monitoring',
    allow: [
      { cidr: '10.0.0.0/8', port: 9100 },
      { name: '*.svc.cluster.local', port: 443 },
    ],
  },
  { name: 'operator', uid: 1000, allow: [{ service: 'ldap/openldap', port: 636 }] },
  // The token file's contents are the token (entries() writes them).
  { name: 'scraper', 'token-file': 'static-secret', allow: [{ cidr: 'fd00::/8' }] },
  { name: 'olm', 'service-account': 'olm/operator', allow: [{ cidr: '10.96.0.0/12', port: 443 }] },
  { name: 'kube-apiserver', uid: 0 },
];

function policy(t: { teardown: (f: () => void) => void }, dialer = new FakeDialer(), reviewer?: TokenReviewer) {
  const logs = captureLogger('info');
  const metrics = new KanalMetrics('server');
  const records: AuditRecord[] = [];
  const auditor = new ConnectionAuditor({ side: 'server', log: logs.log, sink: { write: (r) => void records.push(r) } });
  const p = new ClientPolicy({
    entries: entries(LIST, t),
    dialer,
    metrics: new ClientMetrics(metrics.registry),
    refusals: new Refusals(logs.log, metrics, undefined, auditor),
    dialRefusals: new Refusals(logs.log, metrics),
    auditor,
    reviewer: reviewer ?? { review: () => Promise.resolve({ ok: true, username: 'system:serviceaccount:olm:operator' }) },
  });
  return { p, dialer, metrics, records, logs };
}

const unix = (uid: number): ClientIdentity => ({ address: 'unix:/run/kanal.sock', uid, pid: 42 });

test('admission: certificate subject exactly, Unix uid, static token, service account', async (t) => {
  const { p } = policy(t);
  t.is(
    (await p.admit({ identity: { address: '10.0.0.1:5000', subject: 'CN=prometheus, O=monitoring' }, door: 'http-connect' })).name,
    'prometheus',
  );
  t.is((await p.admit({ identity: unix(1000), door: 'http-connect' })).name, 'operator');
  t.is((await p.admit({ identity: unix(0), door: 'grpc' })).name, 'kube-apiserver');
  const scraper = await p.admit({ identity: { address: '127.0.0.1:1' }, token: 'static-secret', door: 'http-connect' });
  t.is(scraper.name, 'scraper');
  t.is(scraper.identity.name, 'scraper', 'the identity carries the name into audit records');
  t.is((await p.admit({ identity: { address: '127.0.0.1:1' }, token: 'a-service-account-jwt', door: 'http-connect' })).name, 'olm');
});

test('admission: no credential that matches is 407 when a token could help; a wrong token is 403', async (t) => {
  const { p, metrics, records } = policy(t, new FakeDialer(), {
    review: () => Promise.resolve({ ok: false, reason: 'the Kubernetes API did not authenticate it' }),
  });
  const none = await t.throwsAsync(p.admit({ identity: unix(4242), door: 'http-connect' }), { instanceOf: ClientRefused });
  t.is(none?.status, 407);
  t.regex(none?.message ?? '', /no client entry matches uid 4242 \(unix:\/run\/kanal\.sock\): present a bearer token/);
  const wrongSubject = await t.throwsAsync(
    p.admit({ identity: { address: '10.0.0.1:1', subject: 'CN=Prometheus' }, door: 'http-connect' }),
    {
      instanceOf: ClientRefused,
    },
  );
  t.is(wrongSubject?.status, 407, 'the subject is compared exactly');
  const wrong = await t.throwsAsync(p.admit({ identity: unix(4242), token: 'static-secreT', door: 'http-connect' }), {
    instanceOf: ClientRefused,
  });
  t.is(wrong?.status, 403);
  t.regex(wrong?.message ?? '', /was not accepted: the Kubernetes API did not authenticate it/);
  t.is(await metricValue(metrics.registry, 'kanal_refusals_total', { reason: 'client_unknown' }), 3);
  t.is(records.filter((r) => r.event === 'refused' && r.refusal === 'client_unknown').length, 3);
});

test('admission without token-taking entries: 403 naming the identity', async (t) => {
  const logs = captureLogger('info');
  const metrics = new KanalMetrics('server');
  const p = new ClientPolicy({
    entries: entries([{ name: 'op', uid: 1000, allow: [] }], t),
    dialer: new FakeDialer(),
    metrics: new ClientMetrics(metrics.registry),
    refusals: new Refusals(logs.log, metrics),
    dialRefusals: new Refusals(logs.log, metrics),
  });
  const err = await t.throwsAsync(p.admit({ identity: unix(7), door: 'http-connect' }), { instanceOf: ClientRefused });
  t.is(err?.status, 403);
  t.regex(err?.message ?? '', /no client entry matches uid 7 .*: add an entry with its subject or uid to clients:/);
  const token = await t.throwsAsync(p.admit({ identity: unix(7), token: 'x', door: 'http-connect' }), { instanceOf: ClientRefused });
  t.regex(token?.message ?? '', /is no client entry's token/);
});

test('dials: a CIDR rule allows an IP literal on its port; another port is forbidden, naming the client and the rules', async (t) => {
  const { p, dialer, metrics, records } = policy(t);
  const prom = await p.admit({ identity: { address: '10.0.0.1:5000', subject: 'CN=prometheus, O=monitoring' }, door: 'http-connect' });
  const ok = await p.dial(prom, '10.1.2.3:9100');
  t.is(ok.via, 'tunnel');
  t.is(dialer.dials[0].address, '10.1.2.3:9100');
  t.is(dialer.dials[0].client.name, 'prometheus');
  const err = await t.throwsAsync(p.dial(prom, '10.1.2.3:22'), { instanceOf: DialError });
  t.is(err?.failure, 'forbidden');
  t.is(err?.refusal, 'client_forbidden');
  t.is(
    err?.message,
    'client "prometheus" may not reach 10.1.2.3:22: no rule allows it (the rules of prometheus: cidr 10.0.0.0/8 port 9100, name *.svc.cluster.local port 443)',
  );
  t.is(dialer.dials.length, 1, 'nothing was dialled for the refused one');
  t.is(await metricValue(metrics.registry, 'kanal_refusals_total', { reason: 'client_forbidden' }), 1);
  t.is(await metricValue(metrics.registry, 'kanal_frontend_client_dials_total', { client: 'prometheus', result: 'forbidden' }), 1);
  t.is(await metricValue(metrics.registry, 'kanal_frontend_client_dials_total', { client: 'prometheus', result: 'ok' }), 1);
  t.is(await metricValue(metrics.registry, 'kanal_frontend_client_connections', { client: 'prometheus' }), 1);
  if (ok.via === 'tunnel') p.connectionClosed(ok.conn);
  t.is(await metricValue(metrics.registry, 'kanal_frontend_client_connections', { client: 'prometheus' }), undefined);
  const dial = records.find((r) => r.event === 'dial');
  t.like(dial, {
    event: 'dial',
    destination: '10.1.2.3:22',
    refusal: 'client_forbidden',
    client: { name: 'prometheus' },
    dial: { result: 'forbidden' },
  });
  t.false(
    records.some((r) => r.event === 'refused'),
    'the dial record is the audit of a forbidden dial',
  );
});

test('dials: a name a name rule allows is dialled by name, unresolved', async (t) => {
  const { p, dialer } = policy(t);
  const prom = await p.admit({ identity: { address: '10.0.0.1:5000', subject: 'CN=prometheus, O=monitoring' }, door: 'http-connect' });
  await p.dial(prom, 'kube-state-metrics.kube-system.svc.cluster.local:443');
  t.deepEqual(dialer.resolved, []);
  t.is(dialer.dials[0].address, 'kube-state-metrics.kube-system.svc.cluster.local:443');
  const op = await p.admit({ identity: unix(1000), door: 'http-connect' });
  await p.dial(op, 'openldap.ldap.svc:636');
  await t.throwsAsync(p.dial(op, 'openldap.ldap.svc:389'), {
    message: /may not reach openldap\.ldap\.svc:389: no rule allows it \(the rules of operator: service ldap\/openldap port 636\)/,
  });
});

test('dials: a name no name rule allows is resolved, and refused when it resolves to a denied address', async (t) => {
  const dialer = new FakeDialer({ 'node-1.example': ['10.0.0.5'], 'sneaky.example': ['10.0.0.6', '169.254.169.254'] });
  const { p, records } = policy(t, dialer);
  const prom = await p.admit({ identity: { address: '10.0.0.1:5000', subject: 'CN=prometheus, O=monitoring' }, door: 'http-connect' });
  await p.dial(prom, 'node-1.example:9100');
  t.deepEqual(
    dialer.dials[0],
    { address: '10.0.0.5:9100', client: prom.identity, routeHost: 'node-1.example' },
    'the address checked is the one dialled',
  );
  const err = await t.throwsAsync(p.dial(prom, 'sneaky.example:9100'), { instanceOf: DialError });
  t.is(err?.failure, 'forbidden');
  t.regex(
    err?.message ?? '',
    /may not reach sneaky\.example:9100: sneaky\.example resolved \(system\) to 169\.254\.169\.254, which no rule allows/,
  );
  t.is(dialer.dials.length, 1);
  const unresolved = await t.throwsAsync(p.dial(prom, 'nowhere.example:9100'), { instanceOf: DialError });
  t.is(unresolved?.failure, 'unresolved');
  t.like(records.at(-1), {
    event: 'dial',
    destination: 'nowhere.example:9100',
    client: { name: 'prometheus' },
    dial: { result: 'unresolved' },
  });
  // No CIDR rule takes port 22: not worth resolving.
  await t.throwsAsync(p.dial(prom, 'node-1.example:22'), { message: /no rule allows it/ });
  t.deepEqual(dialer.resolved, ['node-1.example', 'sneaky.example', 'nowhere.example']);
});

test('dials: the kube-apiserver (allow: all) dials anything, as upstream', async (t) => {
  const { p, dialer } = policy(t);
  const kas = await p.admit({ identity: unix(0), door: 'grpc' });
  await p.dial(kas, '192.168.7.7:10250');
  await p.dial(kas, 'anything.example:1');
  t.deepEqual(
    dialer.dials.map((d) => d.address),
    ['192.168.7.7:10250', 'anything.example:1'],
  );
  t.deepEqual(dialer.resolved, []);
});

test('a reload removes a client: its next dial is forbidden, naming why', async (t) => {
  const { p } = policy(t);
  const op = await p.admit({ identity: unix(1000), door: 'http-connect' });
  p.configure(entries([{ name: 'kube-apiserver', uid: 0 }], t));
  await t.throwsAsync(p.dial(op, 'openldap.ldap.svc:636'), { message: /no client entry is named "operator" any more/ });
  await t.throwsAsync(p.admit({ identity: unix(1000), door: 'http-connect' }), { instanceOf: ClientRefused });
});
