/** A client's destination rules (src/server/clients/client-rules.ts): names with wildcards, CIDRs of both families, ports, Services. */
import test from 'ava';
import { checkClients } from '../../../src/server/config/clients-config.js';
import { ClientRules } from '../../../src/server/clients/client-rules.js';

function rules(allow: unknown[]): ClientRules {
  const { specs, mistakes } = checkClients([{ name: 'c', uid: 1, allow }], { tokenReview: false, tokenReviewHint: '' });
  if (mistakes.length > 0 || specs[0].allow === 'all') throw new Error(mistakes.join('\n'));
  return new ClientRules(specs[0].allow);
}

test('a wildcard matches one or more labels on the left, any case, trailing dot or not', (t) => {
  const r = rules([{ name: '*.svc.cluster.local', port: 443 }]);
  t.truthy(r.nameRule('api.default.svc.cluster.local', 443));
  t.truthy(r.nameRule('API.Default.SVC.cluster.local.', 443));
  t.truthy(r.nameRule('a.svc.cluster.local', 443));
  t.falsy(r.nameRule('svc.cluster.local', 443), 'the wildcard needs at least one label');
  t.falsy(r.nameRule('evilsvc.cluster.local', 443), 'a label boundary, not a suffix of characters');
  t.falsy(r.nameRule('a.svc.cluster.local.evil.com', 443));
  t.falsy(r.nameRule('a.svc.cluster.local', 80), 'the port counts');
});

test('an exact name matches itself only', (t) => {
  const r = rules([{ name: 'metrics.example.com' }]);
  t.truthy(r.nameRule('metrics.example.com', 1));
  t.truthy(r.nameRule('METRICS.example.com.', 65535));
  t.falsy(r.nameRule('x.metrics.example.com', 1));
});

test('a Service is its .svc and .svc.cluster.local names', (t) => {
  const r = rules([{ service: 'monitoring/node-exporter', port: '9100-9101' }]);
  t.truthy(r.nameRule('node-exporter.monitoring.svc', 9100));
  t.truthy(r.nameRule('node-exporter.monitoring.svc.cluster.local', 9101));
  t.falsy(r.nameRule('node-exporter.monitoring', 9100));
  t.falsy(r.nameRule('node-exporter.other.svc', 9100));
  t.falsy(r.nameRule('node-exporter.monitoring.svc', 9102));
});

test('CIDR rules: IPv4, IPv6, IPv4-mapped IPv6, one address, ports and ranges', (t) => {
  const r = rules([{ cidr: '10.0.0.0/8', port: 9100 }, { cidr: 'fd00::/8', port: '8000-8080' }, { cidr: '192.168.1.5' }]);
  t.truthy(r.addressRule('10.1.2.3', 9100));
  t.falsy(r.addressRule('10.1.2.3', 9101));
  t.falsy(r.addressRule('11.0.0.1', 9100));
  t.truthy(r.addressRule('::ffff:10.1.2.3', 9100), 'an IPv4-mapped address is its IPv4 address');
  t.truthy(r.addressRule('fd12::1', 8000));
  t.truthy(r.addressRule('fd12::1', 8080));
  t.falsy(r.addressRule('fd12::1', 8081));
  t.falsy(r.addressRule('fe80::1', 8000));
  t.truthy(r.addressRule('192.168.1.5', 22));
  t.falsy(r.addressRule('192.168.1.6', 22));
  t.falsy(r.addressRule('not-an-ip', 22));
  t.true(r.addressesCanAllow(22), 'the one-address rule takes any port');
  t.false(rules([{ cidr: '10.0.0.0/8', port: 9100 }]).addressesCanAllow(22));
});

test('describe() lists the rules as written, bounded', (t) => {
  t.is(rules([{ cidr: '10.0.0.0/8', port: 9100 }, { name: '*.svc' }]).describe(), 'cidr 10.0.0.0/8 port 9100, name *.svc');
  t.is(rules([]).describe(), 'none: the entry allows nothing');
  const many = rules(Array.from({ length: 12 }, (_, i) => ({ cidr: `10.0.${i}.0/24` })));
  t.regex(many.describe(), /cidr 10\.0\.7\.0\/24 and 4 more$/);
});
