/**
 * `kanal agent --check`'s service-names line (src/agent/preflight-dns.ts)
 * against a UDP stand-in for the cluster's DNS Service: a DNS that knows
 * kubernetes.default.svc passes with its address; one that says NXDOMAIN,
 * and one that never answers, fail naming the DNS server and what to check.
 */
import test from 'ava';
import { checkClusterDns, PROBE_SERVICE } from '../../src/agent/preflight-dns.js';
import { startDnsStandIn } from '../helpers/dns-stand-in.js';

test('service-names passes when the DNS answers for kubernetes.default.svc, naming what it answered', async (t) => {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  dns.records.set(`${PROBE_SERVICE}.cluster.local`, { kind: 'records', a: ['10.96.0.1'], ttl: 30 });
  const r = await checkClusterDns({ host: dns.host, port: dns.port }, 'cluster.local');
  t.deepEqual(r, {
    name: 'service-names',
    status: 'pass',
    detail: `cluster DNS 127.0.0.1:${dns.port} answered kubernetes.default.svc.cluster.local: 10.96.0.1`,
  });
});

test('service-names fails for a DNS that does not know the name, or a domain that is not the cluster one', async (t) => {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  dns.records.set(`${PROBE_SERVICE}.cluster.local`, { kind: 'records', a: ['10.96.0.1'], ttl: 30 });
  const r = await checkClusterDns({ host: dns.host, port: dns.port }, 'other.example');
  t.is(r.status, 'fail');
  t.is(
    r.detail,
    `cluster DNS 127.0.0.1:${dns.port}: kubernetes.default.svc.other.example: no such name (NXDOMAIN): names the server asks this agent to resolve in the cluster will fail (check --cluster-dns and --cluster-domain)`,
  );
});

test('service-names fails, naming the timeout, when the DNS never answers', async (t) => {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  dns.records.set(`${PROBE_SERVICE}.cluster.local`, { kind: 'silent' });
  const r = await checkClusterDns({ host: dns.host, port: dns.port }, 'cluster.local', 200);
  t.is(r.status, 'fail');
  t.regex(r.detail, /^cluster DNS 127\.0\.0\.1:\d+: kubernetes\.default\.svc\.cluster\.local: the DNS server did not answer in time/);
});
