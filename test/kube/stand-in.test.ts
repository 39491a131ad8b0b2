/**
 * The Kubernetes API stand-in is itself under test: the other Kubernetes
 * tests are only as honest as its answers. Each test checks the wire (status
 * codes, Status reasons and messages, watch events) against the
 * kube-apiserver's behaviour for the calls Kanal and upstream make.
 */
import test from 'ava';
import https from 'node:https';
import fs from 'node:fs/promises';
import { shippedRbac, startKubeApi, waitUntil, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import { PROTOBUF, decodeObject, decodeWatchFrames, encodeObject } from '../helpers/kube-stand-in/protobuf.js';

const LEASES = '/apis/coordination.k8s.io/v1/namespaces/kube-system/leases';
const REVIEWS = '/apis/authentication.k8s.io/v1/tokenreviews';
const AUDIENCE = 'system:konnectivity-server';

const micro = (ms = Date.now()): string => new Date(ms).toISOString().replace('Z', '000Z');

function lease(
  name: string,
  labels: Record<string, string> = { 'k8s-app': 'konnectivity-server' },
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name, labels, ...extra },
    spec: { holderIdentity: name, leaseDurationSeconds: 30, renewTime: micro() },
  };
}

function review(token: string, audiences?: string[]): Record<string, unknown> {
  return { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, ...(audiences ? { audiences } : {}) } };
}

/**
 * A lease as the stand-in answers it (JSON, or protobuf decoded); the leases these tests write all carry labels and a
 * renewTime. A type, not an interface, so that decodeObject()'s Record<string, unknown> can be asserted to it.
 */
type LeaseJson = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace: string; uid: string; resourceVersion: string; labels: Record<string, string> };
  spec: { holderIdentity?: string; leaseDurationSeconds?: number; renewTime: string };
};

interface LeaseListJson {
  kind: string;
  metadata: { resourceVersion: string };
  items: LeaseJson[];
}

/** A TokenReview's status; which fields are present depends on the outcome, and the tests read only those that are. */
interface ReviewStatus {
  authenticated?: boolean;
  audiences?: string[];
  user: { username: string; groups: string[]; extra: Record<string, string[]> };
  error: string;
}

interface RawWatch {
  /** ERROR and BOOKMARK events carry a Status or a bare Lease; the tests read names only from the others. */
  events: Array<{ type: string; object: LeaseJson }>;
  ended: Promise<'end' | 'reset'>;
  close(): void;
}

/** A watch read line by line, as a client does. */
async function openWatch(k: KubeFixture, query: string, namespace = 'kube-system'): Promise<RawWatch> {
  const token = `watcher-${Math.random().toString(36).slice(2)}`;
  k.api.tokens.registerStaticToken(token, { username: 'watcher', groups: ['system:masters'] });
  const ca = await fs.readFile(k.api.caFile);
  const base = namespace ? `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases` : '/apis/coordination.k8s.io/v1/leases';
  const events: RawWatch['events'] = [];
  return new Promise((resolve, reject) => {
    const req = https.get(`${k.api.url}${base}?watch=true&${query}`, { ca, headers: { Authorization: `Bearer ${token}` } }, (res) => {
      let pending = '';
      const ended = new Promise<'end' | 'reset'>((done) => {
        res.on('end', () => done('end'));
        res.on('error', () => done('reset'));
        res.on('close', () => done(res.complete ? 'end' : 'reset'));
      });
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        pending += chunk;
        let nl;
        while ((nl = pending.indexOf('\n')) >= 0) {
          events.push(JSON.parse(pending.slice(0, nl)) as RawWatch['events'][number]);
          pending = pending.slice(nl + 1);
        }
      });
      resolve({ events, ended, close: () => req.destroy() });
    });
    req.on('error', reject);
  });
}

test('TokenReview: audiences, expiry, revocation and unknown tokens answered as the kube-apiserver does', async (t) => {
  const k = await startKubeApi(t);
  const tokens = k.api.tokens;
  const agent = tokens.issueServiceAccountToken({
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audiences: [AUDIENCE],
    pod: { name: 'konnectivity-agent-x1', uid: 'pod-uid-1' },
    node: { name: 'node-1' },
  });

  const ok = await k.request('POST', REVIEWS, { body: review(agent, [AUDIENCE, 'other']) });
  t.is(ok.status, 201);
  const status = ok.json().status as ReviewStatus;
  t.true(status.authenticated);
  t.deepEqual(status.audiences, [AUDIENCE], 'the intersection of requested and token audiences');
  t.is(status.user.username, 'system:serviceaccount:kube-system:konnectivity-agent');
  t.deepEqual(status.user.groups, ['system:serviceaccounts', 'system:serviceaccounts:kube-system', 'system:authenticated']);
  t.deepEqual(status.user.extra['authentication.kubernetes.io/pod-name'], ['konnectivity-agent-x1']);
  t.deepEqual(status.user.extra['authentication.kubernetes.io/pod-uid'], ['pod-uid-1']);
  t.deepEqual(status.user.extra['authentication.kubernetes.io/node-name'], ['node-1']);
  t.is((ok.json().spec as Record<string, unknown>).token, agent, 'the request is echoed with its status');

  const wrongAudience = (await k.request('POST', REVIEWS, { body: review(agent, ['https://kubernetes.default.svc.cluster.local']) })).json()
    .status as ReviewStatus;
  t.falsy(wrongAudience.authenticated);
  t.is(
    wrongAudience.error,
    '[invalid bearer token, token audiences ["system:konnectivity-server"] is invalid for the target audiences ["https://kubernetes.default.svc.cluster.local"]]',
  );

  // No spec.audiences: the API's own audiences, which a konnectivity token does not carry.
  t.regex(
    ((await k.request('POST', REVIEWS, { body: review(agent) })).json().status as ReviewStatus).error,
    /is invalid for the target audiences/,
  );
  const apiToken = tokens.issueServiceAccountToken({ namespace: 'default', serviceAccount: 'default' });
  const forApi = (await k.request('POST', REVIEWS, { body: review(apiToken) })).json().status as ReviewStatus;
  t.true(forApi.authenticated);
  t.deepEqual(forApi.audiences, ['https://kubernetes.default.svc.cluster.local']);

  const expired = tokens.issueServiceAccountToken({
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audiences: [AUDIENCE],
    expiresInSeconds: -10,
  });
  t.is(
    ((await k.request('POST', REVIEWS, { body: review(expired, [AUDIENCE]) })).json().status as ReviewStatus).error,
    '[invalid bearer token, service account token has expired]',
  );

  tokens.revoke(agent);
  t.is(
    ((await k.request('POST', REVIEWS, { body: review(agent, [AUDIENCE]) })).json().status as ReviewStatus).error,
    '[invalid bearer token, service account token has been invalidated]',
  );

  const unknown = (await k.request('POST', REVIEWS, { body: review('not-a-token', [AUDIENCE]) })).json().status as Record<string, unknown>;
  t.deepEqual(unknown, { user: {}, error: 'invalid bearer token' });
  const forged = `${agent.slice(0, agent.lastIndexOf('.'))}.AAAA`;
  t.regex(
    ((await k.request('POST', REVIEWS, { body: review(forged, [AUDIENCE]) })).json().status as ReviewStatus).error,
    /cryptographic primitive/,
  );

  const empty = await k.request('POST', REVIEWS, { body: review('', [AUDIENCE]) });
  t.is(empty.status, 400);
  t.like(empty.json(), { kind: 'Status', reason: 'BadRequest', message: 'token is required for TokenReview in authentication', code: 400 });
  t.is((await k.request('POST', REVIEWS, { body: { kind: 'Lease' } })).status, 400);
});

test('API authentication: a bad credential is 401, none is anonymous (403), a client certificate is its CN', async (t) => {
  const k = await startKubeApi(t);
  const bad = await k.request('GET', LEASES, { headers: { Authorization: 'Bearer nope' }, anonymous: true });
  t.is(bad.status, 401);
  t.like(bad.json(), { reason: 'Unauthorized', code: 401 });
  const anonymous = await k.request('GET', LEASES, { anonymous: true });
  t.is(anonymous.status, 403);
  t.regex(String(anonymous.json().message), /User "system:anonymous" cannot list resource "leases"/);

  const client = await k.client({ user: 'system:konnectivity-server', auth: 'certificate' });
  await client.call('list', (o) => client.coordination.listNamespacedLease({ namespace: 'kube-system' }, o));
  t.like(k.api.requests.at(-1), {
    verb: 'list',
    resource: 'leases',
    namespace: 'kube-system',
    user: 'system:konnectivity-server',
    status: 200,
  });

  // A pod's token is for the API's audience; a konnectivity-audience token is not accepted by the API itself.
  const agentToken = k.api.tokens.issueServiceAccountToken({
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audiences: [AUDIENCE],
  });
  t.is((await k.request('GET', LEASES, { headers: { Authorization: `Bearer ${agentToken}` }, anonymous: true })).status, 401);
});

test('Leases: create, get, update with resourceVersion conflicts, unconditional and no-op updates, delete with preconditions', async (t) => {
  const k = await startKubeApi(t);
  const created = await k.request('POST', LEASES, { body: lease('a') });
  t.is(created.status, 201);
  const a = JSON.parse(created.text) as LeaseJson;
  t.like(a, {
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: { name: 'a', namespace: 'kube-system', resourceVersion: '1' },
  });
  t.regex(a.metadata.uid, /^[0-9a-f-]{36}$/);
  t.regex(a.spec.renewTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/);

  const again = await k.request('POST', LEASES, { body: lease('a') });
  t.is(again.status, 409);
  t.like(again.json(), { reason: 'AlreadyExists', message: 'leases.coordination.k8s.io "a" already exists' });
  t.is(
    (await k.request('POST', LEASES, { body: { ...lease('b'), metadata: { name: 'b', resourceVersion: '7' } } })).status,
    500,
    'resourceVersion on create',
  );

  t.deepEqual((await k.request('GET', `${LEASES}/a`)).json(), a);

  const renewed: LeaseJson = { ...a, spec: { ...a.spec, renewTime: micro(Date.now() + 1000) } };
  const updated = await k.request('PUT', `${LEASES}/a`, { body: renewed });
  t.is(updated.status, 200);
  t.is((updated.json().metadata as Record<string, unknown>).resourceVersion, '2');
  const stale = await k.request('PUT', `${LEASES}/a`, { body: renewed });
  t.is(stale.status, 409);
  t.like(stale.json(), {
    reason: 'Conflict',
    message:
      'Operation cannot be fulfilled on leases.coordination.k8s.io "a": the object has been modified; please apply your changes to the latest version and try again',
  });
  const unconditional = { ...renewed, metadata: { ...renewed.metadata, resourceVersion: undefined } };
  t.is(
    ((await k.request('PUT', `${LEASES}/a`, { body: unconditional })).json().metadata as Record<string, unknown>).resourceVersion,
    '2',
    'a write that changes nothing is no write',
  );
  t.is((await k.request('PUT', `${LEASES}/b`, { body: lease('b') })).status, 404, 'leases are not created on update');
  t.is((await k.request('PUT', `${LEASES}/a`, { body: lease('z') })).status, 400, 'name in body and URL differ');

  const precondition = await k.request('DELETE', `${LEASES}/a`, {
    body: { apiVersion: 'v1', kind: 'DeleteOptions', preconditions: { resourceVersion: '1' } },
  });
  t.is(precondition.status, 409);
  t.is(
    precondition.json().message,
    'Operation cannot be fulfilled on leases.coordination.k8s.io "a": Precondition failed: ResourceVersion in precondition: 1, ResourceVersion in object meta: 2',
  );
  const deleted = await k.request('DELETE', `${LEASES}/a`, { body: { preconditions: { resourceVersion: '2' } } });
  t.like(deleted.json(), { kind: 'Status', status: 'Success', details: { name: 'a', kind: 'leases', uid: a.metadata.uid } });
  const gone = await k.request('GET', `${LEASES}/a`);
  t.is(gone.status, 404);
  t.like(gone.json(), { reason: 'NotFound', message: 'leases.coordination.k8s.io "a" not found' });
});

test('Leases: validated as the API does (MicroTime with six digits, DNS names, positive duration, namespace)', async (t) => {
  const k = await startKubeApi(t);
  const millis = await k.request('POST', LEASES, {
    body: { ...lease('a'), spec: { renewTime: new Date().toISOString(), leaseDurationSeconds: 30 } },
  });
  t.is(millis.status, 400, 'a JavaScript Date string has three digits: the API cannot parse it as MicroTime');
  t.regex(String(millis.json().message), /2006-01-02T15:04:05.000000Z07:00/);
  t.is((await k.request('POST', LEASES, { body: lease('Not_A_Name') })).status, 422);
  t.is((await k.request('POST', LEASES, { body: { ...lease('a'), metadata: {} } })).status, 422);
  const zero = await k.request('POST', LEASES, { body: { ...lease('a'), spec: { leaseDurationSeconds: 0 } } });
  t.is(zero.status, 422);
  t.regex(String(zero.json().message), /spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0/);
  t.is((await k.request('POST', LEASES, { body: { ...lease('a'), metadata: { name: 'a', namespace: 'default' } } })).status, 400);
  const offset = await k.request('POST', LEASES, { body: { ...lease('a'), spec: { renewTime: '2030-01-01T01:00:00.123456+01:00' } } });
  t.is((offset.json().spec as Record<string, unknown>).renewTime, '2030-01-01T00:00:00.123456Z', 'stored in UTC, microseconds kept');
});

test('Leases: list and watch with label selectors; selector transitions; replay from a resourceVersion; 410 when compacted', async (t) => {
  const k = await startKubeApi(t);
  await k.request('POST', LEASES, { body: lease('s1') });
  await k.request('POST', LEASES, { body: lease('other', { app: 'x' }) });
  await k.request('POST', '/apis/coordination.k8s.io/v1/namespaces/default/leases', { body: lease('s2') });

  const list = JSON.parse(
    (await k.request('GET', `${LEASES}?labelSelector=${encodeURIComponent('k8s-app=konnectivity-server')}`)).text,
  ) as LeaseListJson;
  t.is(list.kind, 'LeaseList');
  t.deepEqual(
    list.items.map((l) => l.metadata.name),
    ['s1'],
  );
  t.is(list.metadata.resourceVersion, '3');
  const all = JSON.parse(
    (await k.request('GET', `/apis/coordination.k8s.io/v1/leases?labelSelector=${encodeURIComponent('k8s-app in (konnectivity-server)')}`))
      .text,
  ) as LeaseListJson;
  t.deepEqual(
    all.items.map((l) => `${l.metadata.namespace}/${l.metadata.name}`),
    ['default/s2', 'kube-system/s1'],
  );
  t.is((await k.request('GET', `${LEASES}?labelSelector=${encodeURIComponent('a in (b')}`)).status, 400);

  const w = await openWatch(k, `labelSelector=k8s-app%3Dkonnectivity-server&resourceVersion=${list.metadata.resourceVersion}`);
  const s1 = JSON.parse((await k.request('GET', `${LEASES}/s1`)).text) as LeaseJson;
  await k.request('PUT', `${LEASES}/s1`, { body: { ...s1, spec: { ...s1.spec, renewTime: micro(Date.now() + 5) } } });
  await k.request('POST', LEASES, { body: lease('s3') });
  const s3 = JSON.parse((await k.request('GET', `${LEASES}/s3`)).text) as LeaseJson;
  await k.request('PUT', `${LEASES}/s3`, { body: { ...s3, metadata: { ...s3.metadata, labels: { app: 'moved' } } } });
  const other = JSON.parse((await k.request('GET', `${LEASES}/other`)).text) as LeaseJson;
  await k.request('PUT', `${LEASES}/other`, {
    body: { ...other, metadata: { ...other.metadata, labels: { 'k8s-app': 'konnectivity-server' } } },
  });
  await k.request('DELETE', `${LEASES}/s1`);
  await waitUntil(() => w.events.length >= 5, 'five watch events');
  t.deepEqual(
    w.events.map((e) => `${e.type} ${e.object.metadata.name} ${e.object.metadata.resourceVersion}`),
    ['MODIFIED s1 4', 'ADDED s3 5', 'DELETED s3 6', 'ADDED other 7', 'DELETED s1 8'],
    'a lease leaving the selector is DELETED for the watch, one entering it ADDED',
  );
  w.close();

  const replay = await openWatch(k, 'labelSelector=k8s-app%3Dkonnectivity-server&resourceVersion=6');
  await waitUntil(() => replay.events.length >= 2, 'replayed events');
  t.deepEqual(
    replay.events.map((e) => `${e.type} ${e.object.metadata.name}`),
    ['ADDED other', 'DELETED s1'],
  );
  replay.close();

  const fresh = await openWatch(k, 'resourceVersion=0');
  await waitUntil(() => fresh.events.length >= 2, 'synthetic ADDED');
  t.deepEqual(
    fresh.events.map((e) => `${e.type} ${e.object.metadata.name}`),
    ['ADDED other', 'ADDED s3'],
    'resourceVersion 0: the current state first',
  );
  fresh.close();

  k.api.leases.compact();
  const expired = await openWatch(k, 'resourceVersion=2');
  t.is(await expired.ended, 'end');
  t.is(expired.events.length, 1);
  t.like(expired.events[0], {
    type: 'ERROR',
    object: { kind: 'Status', code: 410, reason: 'Expired', message: 'too old resource version: 2 (9)' },
  });
});

test('Watches: bookmarks, timeoutSeconds, and streams ended, cut or silently stalled on demand', async (t) => {
  const k = await startKubeApi(t, { bookmarkIntervalMs: 100 });
  const bookmarked = await openWatch(k, 'allowWatchBookmarks=true&timeoutSeconds=1');
  await waitUntil(() => bookmarked.events.some((e) => e.type === 'BOOKMARK'), 'a bookmark');
  t.like(
    bookmarked.events.find((e) => e.type === 'BOOKMARK'),
    { object: { kind: 'Lease', metadata: { resourceVersion: '0' } } },
  );
  t.is(await bookmarked.ended, 'end', 'timeoutSeconds ends the stream cleanly');

  const ended = await openWatch(k, '');
  const cut = await openWatch(k, '');
  await waitUntil(() => k.api.openWatches === 2, 'two open watches');
  t.is(k.api.dropWatches('end'), 2);
  t.is(await ended.ended, 'end');
  t.is(await cut.ended, 'end');

  const reset = await openWatch(k, '');
  await waitUntil(() => k.api.openWatches === 1, 'one open watch');
  k.api.dropWatches('reset');
  t.is(await reset.ended, 'reset');

  const stalled = await openWatch(k, '');
  await waitUntil(() => k.api.openWatches === 1, 'one open watch');
  t.is(k.api.stallWatches(), 1);
  await k.request('POST', LEASES, { body: lease('silent') });
  await new Promise((r) => setTimeout(r, 200));
  t.is(stalled.events.length, 0, 'a stalled stream stays open and delivers nothing');
  stalled.close();
  await waitUntil(() => k.api.openWatches === 0, 'watch unregistered when the client leaves');
});

test('Faults: any status, delays, requests that never answer, resets; the server down and back on its port', async (t) => {
  const k = await startKubeApi(t);
  const fault = k.api.injectFault({ verb: 'create', resource: 'tokenreviews' }, { status: 429, message: 'slow down' }, 2);
  t.is((await k.request('POST', REVIEWS, { body: review('x') })).status, 429);
  t.like((await k.request('POST', REVIEWS, { body: review('x') })).json(), { reason: 'TooManyRequests', message: 'slow down', code: 429 });
  t.is((await k.request('POST', REVIEWS, { body: review('x') })).status, 201, 'a fault for two requests is spent after two');
  t.is(fault.hits, 2);

  k.api.injectFault({ resource: 'leases', name: 'slow' }, { delayMs: 300 }, 1);
  const before = Date.now();
  t.is((await k.request('GET', `${LEASES}/slow`)).status, 404, 'served normally after the delay');
  t.true(Date.now() - before >= 280);

  const hang = k.api.injectFault({ resource: 'leases' }, { hang: true });
  await t.throwsAsync(
    Promise.race([k.request('GET', LEASES), new Promise((_, reject) => setTimeout(() => reject(new Error('no answer')), 300))]),
    { message: 'no answer' },
  );
  hang.clear();
  k.api.injectFault({ resource: 'leases' }, { reset: true }, 1);
  await t.throwsAsync(k.request('GET', LEASES), { message: /socket hang up|ECONNRESET/ });

  const port = new URL(k.api.url).port;
  await k.api.goDown();
  await t.throwsAsync(k.request('GET', LEASES), { code: 'ECONNREFUSED' });
  await k.api.comeBack();
  t.is(new URL(k.api.url).port, port);
  t.is((await k.request('GET', LEASES)).status, 200);
});

test('RBAC: deploy/rbac grants the server TokenReview and its leases, the agent list and watch of leases, and nothing more', async (t) => {
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const server = { user: 'system:konnectivity-server' };
  const agent = {
    headers: {
      Authorization: `Bearer ${k.api.tokens.issueServiceAccountToken({ namespace: 'kube-system', serviceAccount: 'konnectivity-agent' })}`,
    },
    anonymous: true,
  };
  const stranger = {
    headers: { Authorization: `Bearer ${k.api.tokens.issueServiceAccountToken({ namespace: 'kube-system', serviceAccount: 'default' })}` },
    anonymous: true,
  };

  t.is((await k.request('POST', REVIEWS, { ...server, body: review('x', [AUDIENCE]) })).status, 201);
  t.is((await k.request('POST', LEASES, { ...server, body: lease('s1') })).status, 201);
  const s1 = (await k.request('GET', `${LEASES}/s1`, server)).json();
  t.is((await k.request('PUT', `${LEASES}/s1`, { ...server, body: s1 })).status, 200);
  t.is((await k.request('GET', LEASES, server)).status, 200);
  t.is(
    (await k.request('POST', '/apis/coordination.k8s.io/v1/namespaces/default/leases', { ...server, body: lease('s1') })).status,
    403,
    'only in the lease namespace',
  );

  t.is((await k.request('GET', `${LEASES}?labelSelector=k8s-app%3Dkonnectivity-server`, agent)).status, 200);
  const w = await openWatch(k, '');
  w.close();
  const agentWatch = await k.request('GET', `${LEASES}?watch=true&timeoutSeconds=1`, agent);
  t.is(agentWatch.status, 200);
  const denied = await k.request('PUT', `${LEASES}/s1`, { ...agent, body: s1 });
  t.is(denied.status, 403);
  t.is(
    denied.json().message,
    'leases.coordination.k8s.io "s1" is forbidden: User "system:serviceaccount:kube-system:konnectivity-agent" cannot update resource "leases" in API group "coordination.k8s.io" in the namespace "kube-system"',
  );
  t.is((await k.request('POST', REVIEWS, { ...agent, body: review('x', [AUDIENCE]) })).status, 403);
  t.is((await k.request('GET', LEASES, stranger)).status, 403);
  t.is((await k.request('DELETE', `${LEASES}/s1`, server)).status, 200);
});

test('Content types: JSON and protobuf bodies, answers negotiated from Accept as the API server does; a protobuf watch is length-delimited frames', async (t) => {
  const k = await startKubeApi(t);
  const token = k.api.tokens.issueServiceAccountToken({
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audiences: [AUDIENCE],
    node: { name: 'n1' },
  });
  const proto = await rawBinary(k, 'POST', REVIEWS, encodeObject(review(token, [AUDIENCE])), PROTOBUF);
  t.is(proto.status, 201);
  t.is(proto.contentType, PROTOBUF);
  const answered = decodeObject(proto.body) as { status: ReviewStatus };
  t.like(answered, {
    apiVersion: 'authentication.k8s.io/v1',
    kind: 'TokenReview',
    status: { authenticated: true, audiences: [AUDIENCE], user: { username: 'system:serviceaccount:kube-system:konnectivity-agent' } },
  });
  t.deepEqual(answered.status.user.extra['authentication.kubernetes.io/node-name'], ['n1']);

  const created = await rawBinary(k, 'POST', LEASES, encodeObject(lease('p1')), PROTOBUF);
  t.is(created.status, 201);
  const stored = decodeObject(created.body) as LeaseJson;
  t.regex(stored.spec.renewTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'MicroTime survives the protobuf round trip');
  t.is(stored.metadata.labels['k8s-app'], 'konnectivity-server');
  t.deepEqual(k.api.leases.get('kube-system', 'p1').spec, stored.spec);
  const conflict = await rawBinary(k, 'POST', LEASES, encodeObject(lease('p1')), PROTOBUF);
  t.like(decodeObject(conflict.body), { kind: 'Status', reason: 'AlreadyExists', code: 409 }, 'errors are Status objects in protobuf too');
  const deleteOptions = encodeObject({ apiVersion: 'v1', kind: 'DeleteOptions', preconditions: { resourceVersion: '99' } });
  t.like(
    decodeObject((await rawBinary(k, 'DELETE', `${LEASES}/p1`, deleteOptions, PROTOBUF)).body),
    { reason: 'Conflict' },
    'protobuf DeleteOptions preconditions',
  );

  const list = await rawBinary(k, 'GET', LEASES, undefined, `${PROTOBUF}, */*`);
  t.like(decodeObject(list.body), { kind: 'LeaseList', metadata: { resourceVersion: '1' } });
  t.is(
    (await rawBinary(k, 'GET', LEASES, undefined, 'application/json, */*;q=0.8')).contentType,
    'application/json',
    "client-node's Accept",
  );
  t.is(
    (await rawBinary(k, 'GET', LEASES, undefined, `${PROTOBUF};q=0.5, application/json`)).contentType,
    'application/json',
    'the higher quality wins',
  );
  t.is((await rawBinary(k, 'GET', LEASES, undefined, 'application/yaml')).status, 406);
  t.is((await rawBinary(k, 'POST', LEASES, Buffer.from('a: b'), 'application/json', 'application/yaml')).status, 415);
  t.like(JSON.parse((await rawBinary(k, 'POST', LEASES, Buffer.from('k8s\0garbage'), 'application/json', PROTOBUF)).body.toString()), {
    code: 400,
    reason: 'BadRequest',
  });

  const watch = await rawBinary(k, 'GET', `${LEASES}?watch=true&resourceVersion=0&timeoutSeconds=1`, undefined, `${PROTOBUF}, */*`);
  t.is(watch.contentType, `${PROTOBUF};stream=watch`);
  t.deepEqual(
    decodeWatchFrames(watch.body).map((e) => `${e.type} ${(e.object.metadata as { name: string }).name}`),
    ['ADDED p1'],
  );
});

/** One request with a binary body and the raw answer. */
async function rawBinary(
  k: KubeFixture,
  method: string,
  urlPath: string,
  body: Buffer | undefined,
  accept: string,
  contentType?: string,
): Promise<{ status: number; contentType: string; body: Buffer }> {
  const token = `raw-${Math.random().toString(36).slice(2)}`;
  k.api.tokens.registerStaticToken(token, { username: 'kubernetes-admin' });
  const ca = await fs.readFile(k.api.caFile);
  const headers: Record<string, string> = { Accept: accept, Authorization: `Bearer ${token}` };
  if (body) Object.assign(headers, { 'Content-Type': contentType ?? PROTOBUF, 'Content-Length': String(body.length) });
  return new Promise((resolve, reject) => {
    const req = https.request(`${k.api.url}${urlPath}`, { method, headers, ca }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, contentType: String(res.headers['content-type']), body: Buffer.concat(chunks) }),
      );
    });
    req.on('error', reject);
    req.end(body);
  });
}
