/**
 * The agent's name resolver (src/agent/name-resolver.ts) against a UDP DNS
 * stand-in for the cluster's DNS Service: which names go where, TTLs
 * honoured and clamped (a fake clock, no sleeping), negative answers,
 * floods bounded, one query for concurrent callers; and its cache alone.
 */
import test from 'ava';
import { Cancel } from '../../src/common/cancel.js';
import { NameNotResolved } from '../../src/tunnel/name-resolution.js';
import { NameResolver, SYSTEM_RESOLVER, type SystemLookup } from '../../src/agent/name-resolver.js';
import { CACHE_MAX_ENTRIES, NameResolverCache } from '../../src/agent/name-resolver-cache.js';
import { startDnsStandIn, type DnsStandIn } from '../helpers/dns-stand-in.js';

class Clock {
  ms = 1_000_000;
  now = (): number => this.ms;
  advance(seconds: number): void {
    this.ms += seconds * 1000;
  }
}

async function setup(t: { teardown(fn: () => Promise<void>): void }, systemLookup?: SystemLookup) {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  const clock = new Clock();
  const resolver = new NameResolver({
    clusterDns: { host: dns.host, port: dns.port },
    queryTimeoutMs: 200,
    now: clock.now,
    ...(systemLookup ? { systemLookup } : {}),
  });
  return { dns, clock, resolver, name: `cluster DNS 127.0.0.1:${dns.port}` };
}

async function notResolved(p: Promise<unknown>): Promise<NameNotResolved> {
  try {
    await p;
  } catch (err) {
    if (err instanceof NameNotResolved) return err;
    throw new Error(`expected NameNotResolved, got ${String(err)}`, { cause: err });
  }
  throw new Error('expected a rejection');
}

function queried(dns: DnsStandIn, name: string): number {
  return dns.queries.get(name) ?? 0;
}

test('a .svc name goes to the cluster DNS, expanded with the cluster domain: A and AAAA, the smallest TTL', async (t) => {
  const { dns, resolver, name } = await setup(t);
  dns.records.set('web.shop.svc.cluster.local', { kind: 'records', a: ['10.96.3.4'], aaaa: ['fd00::34'], ttl: 30 });
  const got = await resolver.resolve('Web.Shop.svc.');
  t.deepEqual(got, { addresses: ['10.96.3.4', 'fd00::34'], resolver: name, ttlSeconds: 30 });
  // Both types asked, once each.
  t.is(queried(dns, 'web.shop.svc.cluster.local'), 2);
  // The full name is the same entry.
  t.deepEqual((await resolver.resolve('web.shop.svc.cluster.local')).addresses, ['10.96.3.4', 'fd00::34']);
  t.is(queried(dns, 'web.shop.svc.cluster.local'), 2);
});

test('the TTL is honoured: cached until it runs out, then asked again', async (t) => {
  const { dns, clock, resolver } = await setup(t);
  dns.records.set('api.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.1'], ttl: 30 });
  await resolver.resolve('api.ns.svc');
  clock.advance(20);
  const cached = await resolver.resolve('api.ns.svc');
  t.is(cached.ttlSeconds, 10, 'what is left of the TTL');
  t.is(queried(dns, 'api.ns.svc.cluster.local'), 2);
  dns.records.set('api.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.2'], ttl: 30 });
  clock.advance(11);
  t.deepEqual((await resolver.resolve('api.ns.svc')).addresses, ['10.0.0.2']);
  t.is(queried(dns, 'api.ns.svc.cluster.local'), 4);
});

test('TTLs are clamped to 1-300 s', async (t) => {
  const { dns, clock, resolver } = await setup(t);
  dns.records.set('zero.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.3'], ttl: 0 });
  dns.records.set('long.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.4'], ttl: 86_400 });
  t.is((await resolver.resolve('zero.ns.svc')).ttlSeconds, 1);
  t.is((await resolver.resolve('long.ns.svc')).ttlSeconds, 300);
  clock.advance(0.5);
  await resolver.resolve('zero.ns.svc');
  t.is(queried(dns, 'zero.ns.svc.cluster.local'), 2, 'a TTL of 0 still holds for 1 s');
  clock.advance(299);
  await resolver.resolve('long.ns.svc');
  t.is(queried(dns, 'long.ns.svc.cluster.local'), 2);
  clock.advance(1);
  await resolver.resolve('long.ns.svc');
  t.is(queried(dns, 'long.ns.svc.cluster.local'), 4, 'a day-long TTL is kept 300 s');
});

test('NXDOMAIN names the name and the resolver, and is cached for 2 s', async (t) => {
  const { dns, clock, resolver, name } = await setup(t);
  const err = await notResolved(resolver.resolve('gone.ns.svc'));
  t.is(err.message, 'gone.ns.svc.cluster.local: no such name (NXDOMAIN)');
  t.is(err.resolver, name);
  const asked = queried(dns, 'gone.ns.svc.cluster.local');
  t.true(asked >= 1 && asked <= 2);
  clock.advance(1.5);
  await notResolved(resolver.resolve('gone.ns.svc'));
  t.is(queried(dns, 'gone.ns.svc.cluster.local'), asked, 'the negative answer is cached');
  dns.records.set('gone.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.9'], ttl: 5 });
  clock.advance(0.6);
  t.deepEqual((await resolver.resolve('gone.ns.svc')).addresses, ['10.0.0.9']);
});

test('a name with neither A nor AAAA records is unresolved, naming that', async (t) => {
  const { dns, resolver } = await setup(t);
  dns.records.set('empty.ns.svc.cluster.local', { kind: 'records', ttl: 5 });
  const err = await notResolved(resolver.resolve('empty.ns.svc'));
  t.is(err.message, 'empty.ns.svc.cluster.local: no A or AAAA records');
});

test('a DNS Service that does not answer: unresolved naming the timeout, not cached', async (t) => {
  const { dns, resolver, name } = await setup(t);
  dns.records.set('mute.ns.svc.cluster.local', { kind: 'silent' });
  const err = await notResolved(resolver.resolve('mute.ns.svc'));
  t.regex(err.message, /did not answer in time/);
  t.is(err.resolver, name);
  const asked = queried(dns, 'mute.ns.svc.cluster.local');
  dns.records.set('mute.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.8'], ttl: 5 });
  t.deepEqual((await resolver.resolve('mute.ns.svc')).addresses, ['10.0.0.8']);
  t.true(queried(dns, 'mute.ns.svc.cluster.local') > asked);
});

test('a flood of records keeps 16 addresses; a flood of names keeps the cache at 1024 entries', async (t) => {
  const { dns, resolver } = await setup(t);
  const many = Array.from({ length: 25 }, (_, i) => `10.5.0.${i + 1}`);
  dns.records.set('flood.ns.svc.cluster.local', { kind: 'records', a: many, aaaa: ['fd00::1', 'fd00::2'], ttl: 60 });
  const got = await resolver.resolve('flood.ns.svc');
  t.is(got.addresses.length, 16);
  t.deepEqual(got.addresses, many.slice(0, 16));
  const names = CACHE_MAX_ENTRIES + 80;
  for (let i = 0; i < names; i++) dns.records.set(`n${i}.ns.svc.cluster.local`, { kind: 'records', a: ['10.6.0.1'], ttl: 60 });
  for (let start = 0; start < names; start += 50) {
    const batch = Array.from({ length: Math.min(50, names - start) }, (_, j) => resolver.resolve(`n${start + j}.ns.svc`));
    await Promise.all(batch);
  }
  t.is(resolver.cachedNames, CACHE_MAX_ENTRIES);
});

test('concurrent lookups of one name share one query', async (t) => {
  const { dns, resolver } = await setup(t);
  dns.records.set('busy.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.5'], ttl: 10 });
  const all = await Promise.all(Array.from({ length: 20 }, () => resolver.resolve('busy.ns.svc')));
  t.true(all.every((a) => a.addresses[0] === '10.0.0.5'));
  t.is(queried(dns, 'busy.ns.svc.cluster.local'), 2, 'one A and one AAAA query');
});

test("a caller's cancel stops its own wait; the shared query still answers the others", async (t) => {
  const { dns, resolver } = await setup(t);
  dns.records.set('slow.ns.svc.cluster.local', { kind: 'records', a: ['10.0.0.6'], ttl: 10 });
  const cancel = new Cancel();
  const first = resolver.resolve('slow.ns.svc', cancel);
  const second = resolver.resolve('slow.ns.svc');
  cancel.abort();
  await t.throwsAsync(first, { message: /cancelled/ });
  t.deepEqual((await second).addresses, ['10.0.0.6']);
});

test('other names, and every name without --cluster-dns, go to the system resolver', async (t) => {
  const asked: string[] = [];
  const lookup: SystemLookup = (name) => {
    asked.push(name);
    if (name === 'missing.example') return Promise.reject(Object.assign(new Error('getaddrinfo ENOTFOUND'), { code: 'ENOTFOUND' }));
    return Promise.resolve([
      { address: '192.0.2.1', family: 4 },
      { address: '192.0.2.1', family: 4 },
      { address: '2001:db8::1', family: 6 },
    ]);
  };
  const { dns, resolver } = await setup(t, lookup);
  t.deepEqual(await resolver.resolve('www.example.com'), { addresses: ['192.0.2.1', '2001:db8::1'], resolver: SYSTEM_RESOLVER });
  const err = await notResolved(resolver.resolve('missing.example'));
  t.is(err.message, 'missing.example: no such name (NXDOMAIN)');
  t.is(err.resolver, SYSTEM_RESOLVER);
  t.is(dns.totalQueries(), 0);
  const plain = new NameResolver({ systemLookup: lookup });
  await plain.resolve('web.shop.svc');
  t.deepEqual(asked, ['www.example.com', 'missing.example', 'web.shop.svc']);
  // IP literals are answered as they are, by no resolver.
  t.deepEqual(await plain.resolve('10.1.2.3'), { addresses: ['10.1.2.3'], resolver: 'IP literal' });
  t.is((await notResolved(plain.resolve('bad name!'))).message, 'not a host name');
});

test('a custom cluster domain; names in it (not only .svc) go to the cluster DNS', async (t) => {
  const dns = await startDnsStandIn();
  t.teardown(() => dns.close());
  const resolver = new NameResolver({
    clusterDns: { host: dns.host, port: dns.port },
    clusterDomain: 'corp.internal',
    queryTimeoutMs: 200,
  });
  dns.records.set('db.data.svc.corp.internal', { kind: 'records', a: ['10.7.0.1'], ttl: 5 });
  dns.records.set('10-7-0-2.data.pod.corp.internal', { kind: 'records', a: ['10.7.0.2'], ttl: 5 });
  t.deepEqual((await resolver.resolve('db.data.svc')).addresses, ['10.7.0.1']);
  t.deepEqual((await resolver.resolve('10-7-0-2.data.pod.corp.internal')).addresses, ['10.7.0.2']);
});

test('the real system resolver answers localhost', async (t) => {
  const got = await new NameResolver().resolve('localhost');
  t.is(got.resolver, SYSTEM_RESOLVER);
  t.true(
    got.addresses.some((a) => a === '127.0.0.1' || a === '::1'),
    got.addresses.join(', '),
  );
});

// ---------- the cache alone ----------

test('cache: at most 1024 entries, the least recently used out first', (t) => {
  const clock = new Clock();
  const cache = new NameResolverCache({ now: clock.now });
  for (let i = 0; i < CACHE_MAX_ENTRIES; i++) cache.putAddresses(`n${i}`, ['10.0.0.1'], 'r', 60);
  t.truthy(cache.get('n0'), 'n0 used: now the most recent');
  for (let i = CACHE_MAX_ENTRIES; i < CACHE_MAX_ENTRIES + 100; i++) cache.putAddresses(`n${i}`, ['10.0.0.1'], 'r', 60);
  t.is(cache.size, CACHE_MAX_ENTRIES);
  t.truthy(cache.get('n0'));
  t.is(cache.get('n1'), undefined);
  t.truthy(cache.get(`n${CACHE_MAX_ENTRIES + 99}`));
});

test('cache: 16 addresses per name, TTL clamped, negative answers kept 2 s', (t) => {
  const clock = new Clock();
  const cache = new NameResolverCache({ now: clock.now });
  const kept = cache.putAddresses(
    'many',
    Array.from({ length: 40 }, (_, i) => `10.0.1.${i}`),
    'r',
    10,
  );
  t.is(kept.kind === 'addresses' ? kept.addresses.length : 0, 16);
  t.like(cache.putAddresses('nan', ['10.0.0.1'], 'r', Number.NaN), { ttlSeconds: 1 });
  t.like(cache.putAddresses('big', ['10.0.0.1'], 'r', 2 ** 31), { ttlSeconds: 300 });
  cache.putMissing('none', 'none: NXDOMAIN', 'r');
  clock.advance(1.9);
  t.like(cache.get('none'), { kind: 'missing', message: 'none: NXDOMAIN' });
  clock.advance(0.2);
  t.is(cache.get('none'), undefined);
  t.is(cache.get('nan'), undefined);
  t.truthy(cache.get('many'));
});
