/**
 * Lease-based server counting against the API stand-in with the RBAC
 * Kanal ships: servers' lease controllers create, renew, collect and delete
 * their Leases as upstream v0.36 does; an agent's lease counter follows them
 * through conflicts, watch drops and stalls and an API outage. Durations are
 * scaled down (4 s leases renewed every 0.8 s) so expiry happens within a test.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import path from 'node:path';
import { KubeApi } from '../../src/kube/kube-api.js';
import { loadKubeConfig } from '../../src/kube/kube-config.js';
import { LabelSelector, parseLabels } from '../../src/kube/labels.js';
import { ServerLeaseController, type ServerLeaseControllerOptions } from '../../src/server/leases/lease-controller.js';
import { ServerLeaseCounter, type ServerLeaseCounterOptions } from '../../src/agent/server-lease-counter.js';
import { parseServerCountSource, serverCount } from '../../src/agent/server-count.js';
import { memoryLogger, shippedRbac, startKubeApi, waitUntil, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';

const NS = 'kube-system';
const LABELS = parseLabels('k8s-app=konnectivity-server');
const EVERYTHING = LabelSelector.parse('');
const FAST = { leaseDurationSeconds: 4, renewIntervalMs: 800, gcIntervalMs: 500 };
const micro = (ms: number): string => new Date(ms).toISOString().replace('Z', '000Z');

interface Cluster {
  k: KubeFixture;
  server(id: string, options?: Partial<ServerLeaseControllerOptions>): Promise<ServerLeaseController>;
  counter(options?: Partial<ServerLeaseCounterOptions>): Promise<ServerLeaseCounter>;
  leaseNames(): string[];
}

async function cluster(t: ExecutionContext): Promise<Cluster> {
  const k = await startKubeApi(t, { rbac: await shippedRbac(), bookmarkIntervalMs: 200 });
  const stops: Array<() => Promise<void>> = [];
  t.teardown(async () => {
    await Promise.all(stops.map((s) => s()));
  });
  let agents = 0;
  return {
    k,
    async server(id, options = {}) {
      // Every server talks to the API as system:konnectivity-server, as in Kubernetes' setup guide.
      const api = await k.client({ user: 'system:konnectivity-server', auth: 'certificate' });
      const controller = new ServerLeaseController({ api, serverId: id, labels: LABELS, log: memoryLogger().log, ...FAST, ...options });
      stops.push(() => controller.stop());
      controller.start();
      return controller;
    },
    async counter(options = {}) {
      // The agent's in-cluster service account, bound by deploy/rbac/konnectivity-agent.yaml.
      const { serviceAccountDir, env } = await k.api.writeInClusterFiles(path.join(k.dir, `agent-${++agents}`), {
        namespace: NS,
        serviceAccount: 'konnectivity-agent',
      });
      const api = new KubeApi({ kubeConfig: loadKubeConfig({ env, serviceAccountDir }) });
      stops.push(() => {
        api.close();
        return Promise.resolve();
      });
      const counter = new ServerLeaseCounter({
        api,
        log: memoryLogger().log,
        watchIdleTimeoutMs: 3000,
        retryInitialMs: 100,
        retryMaxMs: 500,
        ...options,
      });
      stops.push(() => counter.stop());
      counter.start();
      return counter;
    },
    leaseNames: () => k.api.leases.list(NS, EVERYTHING).items.map((l) => l.metadata.name),
  };
}

test('three servers → the counter sees three; one stops renewing → its lease expires and is collected, two; a new server → three; a stopped server deletes its lease', async (t) => {
  const c = await cluster(t);
  const counter = await c.counter();
  const servers = await Promise.all(['server-1', 'server-2', 'server-3'].map((id) => c.server(id)));
  await waitUntil(() => counter.count() === 3, 'the counter sees three servers');
  const stored = c.k.api.leases.get(NS, 'konnectivity-proxy-server-server-1');
  t.like(stored, {
    metadata: { labels: { 'k8s-app': 'konnectivity-server' } },
    spec: { holderIdentity: 'server-1', leaseDurationSeconds: 4 },
  });
  t.regex(stored.spec.renewTime ?? '', /\.\d{6}Z$/);

  // server-3 loses the API (its own requests only; the others still list and delete).
  const collected: string[] = [];
  for (const s of servers) s.on('collected', (name) => collected.push(name));
  let expiredReported = false;
  servers[2].on('renew-failed', (_err, _n, expired) => (expiredReported ||= expired));
  c.k.api.injectFault({ name: servers[2].leaseName, verb: ['get', 'update', 'create'] }, { status: 503 });
  const lostAt = Date.now();
  await waitUntil(() => counter.count() === 2, 'the counter drops to two', 20_000);
  t.log(`server-3's lease stopped counting ${Date.now() - lostAt} ms after its renewals began failing (lease 4 s)`);
  await waitUntil(() => !c.leaseNames().includes('konnectivity-proxy-server-server-3'), 'the expired lease is collected', 20_000);
  // Collected once, by any server (upstream's GC deletes every expired lease, its own included);
  // a delete whose answer came after its deadline is done but not reported.
  t.true(collected.every((n) => n === 'konnectivity-proxy-server-server-3') && collected.length <= 1, collected.join());
  await waitUntil(() => expiredReported, 'server-3 reports its lease expired', 20_000);

  await c.server('server-4');
  await waitUntil(() => counter.count() === 3, 'a new server brings the count back to three');

  const stoppedAt = Date.now();
  await servers[0].stop();
  t.false(c.leaseNames().includes('konnectivity-proxy-server-server-1'), 'stop() deleted the lease');
  await waitUntil(() => counter.count() === 2, 'the counter drops to two at once');
  t.log(`a stopped server stopped counting after ${Date.now() - stoppedAt} ms (expiry would take 4000 ms)`);
  t.true(counter.synced);
});

test('conflicts: a lease rewritten behind the controller is re-read and renewed, and reported as contended; deleted behind it, re-created; two servers with one ID are reported', async (t) => {
  const c = await cluster(t);
  const s1 = await c.server('server-1', { renewIntervalMs: 600 });
  const renewed: string[] = [];
  s1.on('renewed', (l) => renewed.push(l.metadata?.resourceVersion ?? ''));
  const contended: string[] = [];
  s1.on('contended', (holder) => contended.push(holder));
  await waitUntil(() => renewed.length >= 1, 'first renewal');

  const name = s1.leaseName;
  const current = c.k.api.leases.get(NS, name);
  c.k.api.leases.update(NS, name, { ...current, spec: { ...current.spec, holderIdentity: 'intruder', renewTime: micro(Date.now()) } });
  const before = renewed.length;
  await waitUntil(() => renewed.length >= before + 1, 'renewed after the conflict');
  t.deepEqual(contended, ['intruder']);
  t.is(c.k.api.leases.get(NS, name).spec.holderIdentity, 'server-1', 'the holder is this server again');
  t.is(s1.stats().renewFailures, 0, 'a conflict is resolved within one renewal');
  const statuses = c.k.api.requests.filter((r) => r.name === name && r.verb !== 'list').map((r) => `${r.verb} ${r.status}`);
  t.true(statuses.join(',').includes('update 409,get 200,update 200'), statuses.join(','));

  c.k.api.leases.delete(NS, name);
  const beforeDelete = renewed.length;
  await waitUntil(() => renewed.length >= beforeDelete + 1, 'renewed after the deletion');
  t.true(c.leaseNames().includes(name), 're-created');
  t.is(s1.stats().renewFailures, 0);

  const twin = await c.server('server-1', { renewIntervalMs: 600 });
  const twinContended: string[] = [];
  twin.on('contended', (holder) => twinContended.push(holder));
  await waitUntil(() => twinContended.length + contended.length >= 2, 'two servers sharing one ID notice each other', 20_000);
  t.true([...contended.slice(1), ...twinContended].every((h) => h === 'server-1'));
});

test('collection: only expired leases with our labels in our namespace, each deleted with a resourceVersion precondition', async (t) => {
  const c = await cluster(t);
  const store = c.k.api.leases;
  const mk = (name: string, labels: Record<string, string>, renewedAgoMs: number, ns = NS) =>
    store.create(ns, {
      metadata: { name, labels },
      spec: { holderIdentity: name, leaseDurationSeconds: 30, renewTime: micro(Date.now() - renewedAgoMs) },
    });
  mk('old', LABELS, 60_000);
  mk('fresh', LABELS, 0);
  mk('foreign', { app: 'other' }, 60_000);
  mk('elsewhere', LABELS, 60_000, 'default');
  store.create(NS, { metadata: { name: 'no-times', labels: LABELS }, spec: { leaseDurationSeconds: 2 } });
  mk('renewed-meanwhile', LABELS, 60_000);
  // The delete of renewed-meanwhile is held while its holder renews it: the precondition must save it.
  const held = c.k.api.injectFault({ verb: 'delete', name: 'renewed-meanwhile' }, { delayMs: 300 }, 1);
  const collected: string[] = [];
  const s = await c.server('gc', { renewIntervalMs: 1500, leaseDurationSeconds: 60, gcIntervalMs: 1000 });
  s.on('collected', (n) => collected.push(n));
  const gcFailures: string[] = [];
  s.on('gc-failed', (e) => gcFailures.push(e.kind));
  await waitUntil(() => held.hits === 1, 'the delete arrives and is held');
  const listed = store.get(NS, 'renewed-meanwhile');
  store.update(NS, 'renewed-meanwhile', { ...listed, spec: { ...listed.spec, leaseDurationSeconds: 3600, renewTime: micro(Date.now()) } });
  await waitUntil(
    () => c.k.api.requests.some((r) => r.verb === 'delete' && r.name === 'renewed-meanwhile' && r.status !== 0),
    'the held delete answered',
  );
  await waitUntil(() => collected.length === 2, 'the other two collected', 20_000);
  t.deepEqual(collected.sort(), ['no-times', 'old']);
  t.deepEqual(c.leaseNames().sort(), ['foreign', 'fresh', 'konnectivity-proxy-server-gc', 'renewed-meanwhile']);
  t.is(store.get('default', 'elsewhere').metadata.name, 'elsewhere', 'another namespace is not ours');
  t.is(c.k.api.requests.find((r) => r.verb === 'delete' && r.name === 'renewed-meanwhile')?.status, 409);
  t.false(gcFailures.includes('conflict'), 'a lease renewed meanwhile is no failure');
});

test('the counter: none valid counts 1; watch drops, stalls and 410s are recovered; with the API down it keeps the last count instead of decaying to 1', async (t) => {
  const c = await cluster(t);
  const store = c.k.api.leases;
  const counter = await c.counter();
  const lost: string[] = [];
  counter.on('sync-lost', (e) => lost.push(e.kind));
  await waitUntil(() => counter.synced, 'in sync');
  t.is(counter.count(), 1, 'no lease: 1, as upstream');
  t.is(counter.validLeases(), 0);
  const add = (name: string, durationSeconds = 3600) =>
    store.create(NS, {
      metadata: { name, labels: LABELS },
      spec: { holderIdentity: name, leaseDurationSeconds: durationSeconds, renewTime: micro(Date.now()) },
    });
  add('a');
  add('b');
  store.create(NS, { metadata: { name: 'unlabelled' }, spec: { leaseDurationSeconds: 3600, renewTime: micro(Date.now()) } });
  await waitUntil(() => counter.count() === 2, 'two leases counted');

  c.k.api.dropWatches('end');
  add('c');
  await waitUntil(() => counter.count() === 3, 'a cleanly ended watch is resumed from its resourceVersion');
  t.deepEqual(lost, []);

  c.k.api.dropWatches('reset');
  await waitUntil(() => lost.length === 1, 'a cut watch loses sync');
  add('d');
  await waitUntil(() => counter.synced && counter.count() === 4 && c.k.api.openWatches === 1, 'listed again and watching');

  c.k.api.stallWatches();
  add('e');
  await waitUntil(() => counter.count() === 5, 'a silent watch is replaced after the idle timeout', 15_000);
  t.is(lost.at(-1), 'timeout');

  store.compact();
  c.k.api.dropWatches('end');
  add('f');
  await waitUntil(() => counter.count() === 6, '410 Expired: listed again');
  t.true(counter.synced);

  for (const n of ['a', 'b', 'c', 'd', 'e', 'f']) store.delete(NS, n);
  add('x', 4);
  add('y', 4);
  await waitUntil(() => counter.count() === 2, 'two short leases');
  await c.k.api.goDown();
  await waitUntil(() => !counter.synced, 'the counter notices the API is gone');
  await waitUntil(
    () =>
      Date.now() >
      (store
        .list(NS, EVERYTHING)
        .items.map((l) => Date.parse(l.spec.renewTime!) + 4000)
        .sort()
        .at(-1) ?? 0),
    'both leases expired',
    8000,
  );
  t.is(counter.count(), 2, 'the leases expired meanwhile, but with no view the last count stands (upstream would answer 1)');
  await c.k.api.comeBack();
  await waitUntil(() => counter.synced, 'in sync again', 10_000);
  t.is(counter.count(), 1, 'in sync: expired leases do not count');
});

test("a lease controller or counter without the RBAC it needs reports the API's 403 with the fix", async (t) => {
  const c = await cluster(t);
  const api = await c.k.client({ user: 'not-bound', auth: 'certificate' });
  const { log, lines } = memoryLogger();
  const controller = new ServerLeaseController({ api, serverId: 'x', labels: LABELS, log, ...FAST });
  const failures: string[] = [];
  controller.on('renew-failed', (e) => failures.push(e.kind));
  controller.start();
  t.teardown(() => controller.stop());
  await waitUntil(() => failures.length >= 1 && lines.some((l) => l.msg.includes('collect')), 'renewal and collection failed');
  t.is(failures[0], 'forbidden');
  const line = lines.find((l) => l.msg.startsWith('cannot renew'));
  t.regex(String(line?.err), /User "not-bound" cannot get resource "leases" .* grant it with the RBAC in deploy\/rbac\//);
  t.is(line?.level, 50, 'never renewed: an error, agents do not count this server');

  const counter = new ServerLeaseCounter({ api, log, retryInitialMs: 100, retryMaxMs: 200 });
  const lost: string[] = [];
  counter.on('sync-lost', (e) => lost.push(e.message));
  counter.start();
  t.teardown(() => counter.stop());
  await waitUntil(() => lost.length >= 1, 'the counter reports why');
  t.regex(lost[0], /cannot list resource "leases"/);
  t.is(counter.count(), 1);
});

test('serverCount: upstream v0.36 rule for --server-count-source default|max with and without lease counting', (t) => {
  // pkg/agent/clientset_test.go TestServerCount, plus the fallback when nothing is known.
  t.like(serverCount('max', 24, 42), { count: 42, from: 'KNP server response headers' });
  t.like(serverCount('max', 6, 3), { count: 6, from: 'KNP lease count' });
  t.like(serverCount('max', 0, 0), { count: 1, from: 'fallback to 1' });
  t.like(serverCount('default', undefined, 3), { count: 3, from: 'KNP server response headers' });
  t.like(serverCount('default', 3, 6), { count: 3, from: 'KNP lease count' });
  t.like(serverCount('default', undefined, 0), { count: 1, from: 'fallback to 1' });
  t.is(parseServerCountSource('max'), 'max');
  t.throws(() => parseServerCountSource('min'), { message: '--server-count-source "min": use default or max' });
});

test('lease controller configuration is checked: labels, timing, server ID', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'token' });
  const log = memoryLogger().log;
  t.throws(() => new ServerLeaseController({ api, serverId: 's', labels: {}, log }), {
    message: /--lease-label must name at least one label/,
  });
  t.throws(
    () => new ServerLeaseController({ api, serverId: 's', labels: LABELS, log, leaseDurationSeconds: 10, renewIntervalMs: 10_000 }),
    { message: /must be shorter than the lease duration/ },
  );
  t.throws(() => new ServerLeaseController({ api, serverId: 'UPPER', labels: LABELS, log }), {
    message: /--server-id "UPPER" cannot name a Lease/,
  });
  t.throws(() => new ServerLeaseCounter({ api, log, selector: 'a in (' }), { message: /^--lease-label: unbalanced parentheses/ });
  const defaults = new ServerLeaseController({ api, serverId: 's', labels: LABELS, log });
  t.is(defaults.leaseName, 'konnectivity-proxy-server-s');
  t.is(defaults.namespace, 'kube-system');
  t.is(defaults.selector, 'k8s-app=konnectivity-server');
});
