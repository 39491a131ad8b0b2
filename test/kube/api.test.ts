/**
 * Kanal's Kubernetes client (src/kube) against the API stand-in: where it
 * finds its configuration, how every call is bounded (deadline, slots, queue,
 * client-go QPS/burst), what each failure says, and the watch stream's
 * bounds; plus the pure parts (labels, lease validity, token bucket).
 */
import test from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { V1MicroTime, type V1Lease } from '@kubernetes/client-node';
import { KubeApi, KubeApiError, type KubeApiErrorKind } from '../../src/kube/kube-api.js';
import { JSON_CONTENT_TYPE, PROTOBUF_CONTENT_TYPE } from '../../src/kube/content-types.js';
import { KubeConfigError, loadKubeConfig } from '../../src/kube/kube-config.js';
import { LabelSelector, LabelSyntaxError, formatLabels, parseLabels } from '../../src/kube/labels.js';
import { isLeaseValid, leaseExpiresAt, serverLeaseName, type LeaseTimes } from '../../src/kube/lease.js';
import { TokenBucket } from '../../src/kube/token-bucket.js';
import { RequestSlots, SlotsUnavailableError } from '../../src/kube/request-slots.js';
import { startKubeApi, waitUntil } from '../helpers/kube-stand-in/fixture.js';

const listLeases = (api: KubeApi, timeoutMs?: number) =>
  api.call(
    'list leases',
    (o) => api.coordination.listNamespacedLease({ namespace: 'kube-system' }, o),
    timeoutMs === undefined ? {} : { timeoutMs },
  );

async function kubeApiError(p: Promise<unknown>): Promise<KubeApiError> {
  try {
    await p;
  } catch (err) {
    if (err instanceof KubeApiError) return err;
    throw err;
  }
  throw new Error('expected a KubeApiError');
}

test('loadKubeConfig: a kubeconfig with a certificate or a token user, or the in-cluster service account; failures name the fix', async (t) => {
  const k = await startKubeApi(t);
  for (const auth of ['certificate', 'token', 'token-file'] as const) {
    const api = await k.client({ user: `user-${auth}`, auth });
    t.deepEqual((await listLeases(api)).items, []);
    t.is(k.api.requests.at(-1)?.user, `user-${auth}`);
  }

  const { serviceAccountDir, env } = await k.api.writeInClusterFiles(path.join(k.dir, 'sa'), {
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
  });
  const inCluster = new KubeApi({ kubeConfig: loadKubeConfig({ env, serviceAccountDir }) });
  await listLeases(inCluster);
  t.is(k.api.requests.at(-1)?.user, 'system:serviceaccount:kube-system:konnectivity-agent');

  const missing = path.join(k.dir, 'nope.yaml');
  t.throws(() => loadKubeConfig({ kubeconfig: missing }), {
    instanceOf: KubeConfigError,
    message: new RegExp(`--kubeconfig ${missing}: .*(ENOENT|no such file)`),
  });
  t.throws(() => loadKubeConfig({ env: {} }), { instanceOf: KubeConfigError, message: /not running in a pod .*pass --kubeconfig/ });
  t.throws(() => loadKubeConfig({ env, serviceAccountDir: path.join(k.dir, 'empty') }), {
    instanceOf: KubeConfigError,
    message: /service account file .*token is not readable/,
  });
  const plain = path.join(k.dir, 'http.yaml');
  await fs.writeFile(
    plain,
    JSON.stringify({
      clusters: [{ name: 'c', cluster: { server: 'http://127.0.0.1:1' } }],
      users: [{ name: 'u', user: { token: 't' } }],
      contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'x',
    }),
  );
  t.throws(() => loadKubeConfig({ kubeconfig: plain }), {
    instanceOf: KubeConfigError,
    message: /is not https:\/\/; Kanal talks to the Kubernetes API over TLS only/,
  });
  const anonymous = path.join(k.dir, 'anonymous.yaml');
  await fs.writeFile(
    anonymous,
    `clusters: [{name: c, cluster: {server: '${k.api.url}'}}]\nusers: [{name: nobody, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: nobody}}]\ncurrent-context: x\n`,
  );
  t.throws(() => loadKubeConfig({ kubeconfig: anonymous }), {
    instanceOf: KubeConfigError,
    message: /user "nobody" has no credential \(client-certificate, token, tokenFile, exec or auth-provider\)/,
  });
  const noContext = path.join(k.dir, 'no-context.yaml');
  await fs.writeFile(noContext, 'apiVersion: v1\nkind: Config\nclusters: []\n');
  t.throws(() => loadKubeConfig({ kubeconfig: noContext }), { instanceOf: KubeConfigError, message: /no cluster for current-context/ });
});

test('KubeApi: --kube-api-content-type protobuf (the default) is accepted with a notice that JSON is spoken; other types are refused', async (t) => {
  const k = await startKubeApi(t);
  const file = await k.api.writeKubeconfig(path.join(k.dir, 'kc'), { user: 'u', auth: 'token' });
  const kubeConfig = loadKubeConfig({ kubeconfig: file });
  t.regex(new KubeApi({ kubeConfig }).contentTypeNotice ?? '', /speaks application\/json.*requests use JSON/);
  t.regex(new KubeApi({ kubeConfig, contentType: PROTOBUF_CONTENT_TYPE }).contentTypeNotice ?? '', /protobuf/);
  t.is(new KubeApi({ kubeConfig, contentType: JSON_CONTENT_TYPE }).contentTypeNotice, undefined);
  t.throws(() => new KubeApi({ kubeConfig, contentType: 'application/yaml' }), {
    message: /--kube-api-content-type "application\/yaml": use/,
  });
  t.deepEqual(new KubeApi({ kubeConfig }).limits, { qps: 5, burst: 10, maxInFlight: 16, maxWaiting: 256 }, "client-go's defaults for 0");
});

test('KubeApi: a call without an answer fails at its deadline; calls in flight and waiting are bounded, beyond that refused at once', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'certificate' }, { maxInFlight: 2, maxWaiting: 1, qps: -1 });
  const hang = k.api.injectFault({ resource: 'leases' }, { hang: true });
  const hung = [listLeases(api, 1500), listLeases(api, 1500)].map(kubeApiError);
  await waitUntil(() => api.stats().inFlight === 2, 'two calls in flight');
  const queued = kubeApiError(listLeases(api, 300));
  await waitUntil(() => api.stats().waiting === 1, 'one call waiting');
  const started = performance.now();
  const refused = await kubeApiError(listLeases(api, 5000));
  const refusedAfterMs = performance.now() - started;
  t.is(refused.kind, 'overloaded');
  t.regex(refused.message, /^list leases: Kubernetes API client busy: 2 requests in flight and 1 waiting \(the limit\)$/);
  const waited = await queued;
  t.is(waited.kind, 'timeout', 'the queued call gives up at its own deadline');
  t.regex(waited.message, /no request slot free within 300 ms/);
  for (const err of await Promise.all(hung)) {
    t.is(err.kind, 'timeout');
    t.regex(err.message, /no answer from the Kubernetes API at https:\/\/127\.0\.0\.1:\d+ within 1500 ms/);
  }
  hang.clear();
  t.deepEqual((await listLeases(api)).items, [], 'slots are released after timeouts');
  t.deepEqual(api.stats(), { inFlight: 0, waiting: 0 });
  t.log(`refusal beyond the queue bound after ${refusedAfterMs.toFixed(1)} ms`);
});

test('KubeApi: calls share kept-alive TLS connections (client-node alone opens one per call); close() ends them', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'certificate' }, { qps: -1 });
  const before = k.api.connections.accepted;
  for (let i = 0; i < 20; i++) await listLeases(api);
  await Promise.all(Array.from({ length: 4 }, () => listLeases(api)));
  const opened = k.api.connections.accepted - before;
  t.log(`24 calls over ${opened} TLS connection(s)`);
  t.true(opened <= 5, `${opened} connections for 24 calls (one, then at most four at once)`);
  api.close();
  await waitUntil(() => k.api.connections.open === 0, 'the kept-alive connections closed');
  await listLeases(api);
  t.is(k.api.connections.accepted - before, opened + 1, 'a call after close() opens a new one');
});

test('KubeApi: QPS and burst as client-go: the burst goes at once, then calls are spaced; a wait past the deadline is refused', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'token' }, { qps: 0.2, burst: 3 });
  for (let i = 0; i < 3; i++) await listLeases(api);
  const refused = await kubeApiError(listLeases(api, 200));
  t.is(refused.kind, 'overloaded');
  t.regex(
    refused.message,
    /client-side rate limit \(--kubeconfig-qps=0.2, --kubeconfig-burst=3\) would delay the request past its deadline/,
  );
  const started = performance.now();
  await listLeases(api, 15_000);
  t.true(performance.now() - started >= 500, 'the fourth call waited for a token (one per 5 s)');
});

test('KubeApi: each failure names its cause (401, 403, 404, 409, 410, 429, 5xx, unreachable, wrong CA)', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'certificate' });
  const cases: Array<[number, KubeApiErrorKind, RegExp]> = [
    [
      401,
      'unauthorized',
      /rejected Kanal's credentials \(401 Unauthorized\): check the user in --kubeconfig or the mounted service account/,
    ],
    [403, 'forbidden', /403 Forbidden: injected 403: grant it with the RBAC in deploy\/rbac\//],
    [409, 'conflict', /409 Conflict/],
    [410, 'gone', /410 Gone/],
    [422, 'invalid', /422 Invalid/],
    [429, 'throttled', /429 Too Many Requests from the Kubernetes API/],
    [503, 'server-error', /HTTP 503 from the Kubernetes API: injected 503/],
  ];
  for (const [status, kind, message] of cases) {
    k.api.injectFault({ resource: 'leases' }, { status }, 1);
    const err = await kubeApiError(listLeases(api));
    t.is(err.kind, kind, `HTTP ${status}`);
    t.is(err.status, status);
    t.regex(err.message, message);
  }
  const missing = await kubeApiError(
    api.call('get', (o) => api.coordination.readNamespacedLease({ name: 'x', namespace: 'kube-system' }, o)),
  );
  t.like(missing, { kind: 'not-found', reason: 'NotFound' });

  await k.api.goDown();
  const down = await kubeApiError(listLeases(api));
  t.is(down.kind, 'unreachable');
  t.regex(
    down.message,
    /cannot reach the Kubernetes API at https:\/\/127\.0\.0\.1:\d+: .*(ECONNREFUSED|socket hang up|other side closed)/,
    'refused, or a kept-alive connection cut',
  );
  await k.api.comeBack();

  const other = await startKubeApi(t);
  const file = await k.api.writeKubeconfig(path.join(k.dir, 'wrong-ca'), { user: 'u', auth: 'token' });
  const config = JSON.parse(await fs.readFile(file, 'utf8')) as { clusters: Array<{ cluster: Record<string, string> }> };
  config.clusters[0].cluster['certificate-authority'] = other.api.caFile;
  await fs.writeFile(file, JSON.stringify(config));
  const wrongCa = await kubeApiError(listLeases(new KubeApi({ kubeConfig: loadKubeConfig({ kubeconfig: file }) })));
  t.is(wrongCa.kind, 'unreachable');
  t.regex(wrongCa.message, /TLS to the Kubernetes API .* failed .*check the CA and server name in the kubeconfig/);
});

test('KubeApi.watch: events in order; an ERROR event, an over-long line or a cut stream end it with the reason; stop() ends it quietly', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: 'u', auth: 'token' }, { qps: -1 });
  const ns = '/apis/coordination.k8s.io/v1/namespaces/kube-system/leases';
  const body = (name: string): V1Lease => ({ metadata: { name }, spec: { leaseDurationSeconds: 30, renewTime: new V1MicroTime() } });

  const events: string[] = [];
  const state: { ended: KubeApiError | undefined | 'open' } = { ended: 'open' };
  const handle = api.watch(
    ns,
    { resourceVersion: '0' },
    {
      onEvent: (type, o) => events.push(`${type} ${(o as { metadata: { name: string } }).metadata.name}`),
      onEnd: (e) => (state.ended = e),
    },
  );
  await waitUntil(() => k.api.openWatches === 1, 'watch open');
  await api.call('create', (o) => api.coordination.createNamespacedLease({ namespace: 'kube-system', body: body('a') }, o));
  await api.call('delete', (o) => api.coordination.deleteNamespacedLease({ namespace: 'kube-system', name: 'a' }, o));
  await waitUntil(() => events.length === 2, 'two events');
  t.deepEqual(events, ['ADDED a', 'DELETED a']);
  handle.stop();
  t.is(state.ended, undefined, 'stop() ends without an error');

  const endOf = (query: Record<string, string>, maxLineBytes?: number) =>
    new Promise<KubeApiError | undefined>((resolve) => api.watch(ns, query, { onEvent: () => {}, onEnd: resolve }, maxLineBytes));

  k.api.leases.compact();
  const gone = await endOf({ resourceVersion: '1' });
  t.like(gone, { kind: 'gone', reason: 'Expired' });
  t.regex(gone?.message ?? '', /too old resource version/);

  const long = endOf({ resourceVersion: '0' }, 64);
  await waitUntil(() => k.api.openWatches === 1, 'watch open');
  await api.call('create', (o) => api.coordination.createNamespacedLease({ namespace: 'kube-system', body: body('b') }, o));
  const tooLong = await long;
  t.is(tooLong?.kind, 'invalid');
  t.regex(tooLong?.message ?? '', /watch event longer than 64 bytes/);
  await waitUntil(() => k.api.openWatches === 0, 'the ended watch closed');

  const cut = endOf({ resourceVersion: '0' });
  await waitUntil(() => k.api.openWatches === 1, 'watch open');
  k.api.dropWatches('reset');
  t.like(await cut, { kind: 'unreachable' });

  const clean = endOf({ resourceVersion: '0', timeoutSeconds: '1' });
  t.is(await clean, undefined, 'the API ending the watch (timeoutSeconds) is no error');

  k.api.injectFault({ verb: 'watch' }, { status: 403 }, 1);
  t.like(await endOf({}), { kind: 'forbidden' });
  t.is(k.api.openWatches, 0);
});

test('labels: label sets and selectors parsed with Kubernetes rules; bad flags refused with the reason', (t) => {
  t.deepEqual(parseLabels('k8s-app=konnectivity-server'), { 'k8s-app': 'konnectivity-server' });
  t.deepEqual(parseLabels('b=2, a=1'), { b: '2', a: '1' });
  t.is(formatLabels({ b: '2', 'example.com/a': '1' }), 'b=2,example.com/a=1');
  t.throws(() => parseLabels('novalue', '--lease-label'), {
    instanceOf: LabelSyntaxError,
    message: '--lease-label: "novalue" is not key=value',
  });
  t.throws(() => parseLabels('a=1,a=2'), { message: /given twice/ });
  t.throws(() => parseLabels('a=has space'), { message: /label value "has space"/ });
  t.throws(() => parseLabels('Bad_Prefix/a=1'), { message: /invalid prefix/ });

  const labels = { 'k8s-app': 'konnectivity-server', tier: 'cp' };
  const yes = [
    '',
    'k8s-app=konnectivity-server',
    'k8s-app==konnectivity-server',
    'tier!=node',
    'k8s-app in (x, konnectivity-server)',
    'zone notin (a)',
    'tier',
    '!zone',
    'k8s-app=konnectivity-server,tier=cp',
  ];
  const no = ['k8s-app=other', 'tier!=cp', 'k8s-app in (x)', 'tier notin (cp)', 'zone', '!tier', 'k8s-app=konnectivity-server,tier=node'];
  for (const s of yes) t.true(LabelSelector.parse(s).matches(labels), s);
  for (const s of no) t.false(LabelSelector.parse(s).matches(labels), s);
  t.false(LabelSelector.parse('zone in (a)').matches(undefined));
  t.true(LabelSelector.parse('zone notin (a)').matches(undefined));
  for (const bad of ['a in (b', 'a,,b', 'a > 1', 'a=b=c'])
    t.throws(() => LabelSelector.parse(bad, '--lease-label'), { instanceOf: LabelSyntaxError, message: /^--lease-label: / }, bad);
});

test('lease validity: renewTime, else acquireTime, plus the duration; a lease without them never counts', (t) => {
  const now = Date.parse('2030-01-01T00:00:30Z');
  const at = (renewTime?: string, acquireTime?: string, leaseDurationSeconds: number | null = 30): LeaseTimes => ({
    spec: { renewTime, acquireTime, leaseDurationSeconds },
  });
  t.true(isLeaseValid(at('2030-01-01T00:00:01.000000Z'), now));
  t.false(isLeaseValid(at('2030-01-01T00:00:00.000000Z'), now), 'renewTime + duration must be after now');
  t.true(isLeaseValid(at(undefined, '2030-01-01T00:00:10.000000Z'), now));
  t.false(isLeaseValid(at(), now));
  t.false(isLeaseValid(at('2030-01-01T00:00:29.000000Z', undefined, null), now), 'no duration');
  t.false(isLeaseValid(at('garbage'), now));
  t.is(leaseExpiresAt(at('2030-01-01T00:00:01.000000Z')), Date.parse('2030-01-01T00:00:31Z'));
  t.is(serverLeaseName('0c3f5e2a-1b9d-4c34-9a3e-7f1f0e7a2b11'), 'konnectivity-proxy-server-0c3f5e2a-1b9d-4c34-9a3e-7f1f0e7a2b11');
  t.throws(() => serverLeaseName('Server_1'), { message: /--server-id "Server_1" cannot name a Lease/ });
});

test('TokenBucket: starts with the burst, refills at qps, refuses a wait beyond the budget and takes nothing then', (t) => {
  let now = 0;
  const bucket = new TokenBucket(2, 3, () => now);
  t.deepEqual([bucket.reserve(0), bucket.reserve(0), bucket.reserve(0)], [0, 0, 0]);
  t.is(bucket.reserve(100), undefined, 'the next token is 500 ms away');
  t.is(bucket.reserve(500), 500);
  t.is(bucket.reserve(1000), 1000, 'reservations queue behind each other');
  bucket.release();
  t.is(bucket.reserve(1000), 1000, 'a released reservation is reused');
  now = 10_000;
  t.deepEqual(
    [bucket.reserve(0), bucket.reserve(0), bucket.reserve(0), bucket.reserve(0)],
    [0, 0, 0, undefined],
    'refilled to the burst, not beyond',
  );
  t.is(new TokenBucket(-1, 0).reserve(0), 0, 'negative QPS: unlimited');
});

test('RequestSlots: FIFO hand-over, a wait bounded in time, a queue bounded in length', async (t) => {
  const slots = new RequestSlots(1, 2);
  const first = await slots.acquire(0);
  const order: string[] = [];
  const second = slots.acquire(1000).then((release) => (order.push('second'), release));
  const third = slots.acquire(1000).then((release) => (order.push('third'), release));
  await t.throwsAsync(slots.acquire(1000), { instanceOf: SlotsUnavailableError, message: /1 requests in flight and 2 waiting/ });
  first();
  (await second)();
  (await third)();
  t.deepEqual(order, ['second', 'third']);
  t.is(slots.inUse, 0);
  const held = await slots.acquire(0);
  await t.throwsAsync(slots.acquire(20), { instanceOf: SlotsUnavailableError, message: /no request slot free within 20 ms/ });
  t.is(slots.waiting, 0);
  held();
  held();
  t.is(slots.inUse, 0, 'releasing twice frees one slot');
});
