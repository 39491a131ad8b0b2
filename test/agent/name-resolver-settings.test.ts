/** `--cluster-dns` and `--cluster-domain` (src/agent/settings.ts): what they take and what they refuse. */
import test from 'ava';
import { agentSettings } from '../../src/agent/settings.js';
import { UsageError } from '../../src/common/usage-error.js';

const dns = (v: string | undefined): unknown => agentSettings['cluster-dns'].parse(v, 'cluster-dns');

test('--cluster-dns takes an IP address with an optional port (53 by default); absent or empty: none', (t) => {
  t.deepEqual(dns('10.96.0.10'), { host: '10.96.0.10', port: 53 });
  t.deepEqual(dns('10.96.0.10:5353'), { host: '10.96.0.10', port: 5353 });
  t.deepEqual(dns('fd00::a'), { host: 'fd00::a', port: 53 });
  t.deepEqual(dns('[fd00::a]:1053'), { host: 'fd00::a', port: 1053 });
  t.deepEqual(dns('[fd00::a]'), { host: 'fd00::a', port: 53 });
  t.is(dns(undefined), undefined);
  t.is(dns(''), undefined);
});

test('--cluster-dns refuses names and bad ports, saying what it wants', (t) => {
  for (const bad of ['kube-dns.kube-system.svc', '10.96.0.10:0', '10.96.0.10:99999', '10.96.0.10:53:1', '[nope]:53']) {
    const err = t.throws(() => dns(bad), { instanceOf: UsageError }, bad);
    t.regex(err?.message ?? '', /cluster-dns/, bad);
  }
});

test('--cluster-domain defaults to cluster.local and must be a DNS domain', (t) => {
  const domain = agentSettings['cluster-domain'];
  t.is(domain.default, 'cluster.local');
  t.is(domain.parse('corp.internal', 'cluster-domain'), 'corp.internal');
  t.throws(() => domain.parse('not a domain', 'cluster-domain'), { instanceOf: UsageError });
  t.throws(() => domain.parse('10.0.0.1', 'cluster-domain'), { instanceOf: UsageError });
});
