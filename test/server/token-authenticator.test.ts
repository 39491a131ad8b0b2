/**
 * Server-side agent authentication by service account token, through
 * @kubernetes/client-node against the API stand-in with the RBAC Kanal ships:
 * who is accepted, every refusal and its reason, an API that is down, slow or
 * refusing the server, and that one slow review never stalls the others.
 */
import test from 'ava';
import type { ExecutionContext } from 'ava';
import type { KubeApiOptions } from '../../src/kube/kube-api.js';
import {
  TokenAuthenticator,
  type TokenAuthenticatorOptions,
  type TokenAuthentication,
} from '../../src/server/identity/token-authenticator.js';
import { shippedRbac, startKubeApi, waitUntil, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import type { ServiceAccountTokenSpec } from '../helpers/kube-stand-in/tokens.js';

const AUDIENCE = 'system:konnectivity-server';
const SERVER_USER = 'system:konnectivity-server';

interface Setup {
  k: KubeFixture;
  auth: TokenAuthenticator;
  token(spec?: Partial<ServiceAccountTokenSpec>): string;
  reviews(): number;
}

async function setup(
  t: ExecutionContext,
  options: Partial<TokenAuthenticatorOptions> = {},
  client: Omit<KubeApiOptions, 'kubeConfig'> = {},
): Promise<Setup> {
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const api = await k.client({ user: SERVER_USER, auth: 'certificate' }, { qps: -1, ...client });
  const auth = new TokenAuthenticator({
    api,
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audience: AUDIENCE,
    ...options,
  });
  return {
    k,
    auth,
    token: (spec = {}) =>
      k.api.tokens.issueServiceAccountToken({
        namespace: 'kube-system',
        serviceAccount: 'konnectivity-agent',
        audiences: [AUDIENCE],
        ...spec,
      }),
    reviews: () => k.api.requests.filter((r) => r.resource === 'tokenreviews').length,
  };
}

const bearer = (token: string): string[] => [`Bearer ${token}`];

function refusal(t: ExecutionContext, result: TokenAuthentication): { kind: string; reason: string; agentFault: boolean } {
  if (result.ok) {
    t.fail(`expected a refusal, got ${result.identity.username}`);
    return { kind: '', reason: '', agentFault: true };
  }
  return result.refusal;
}

test('a projected token of the agent service account is accepted: identity with pod, node, uid and expiry; reconnects within the TTL cost no review', async (t) => {
  const s = await setup(t);
  const token = s.token({ pod: { name: 'konnectivity-agent-7xk2p', uid: 'pod-1' }, node: { name: 'worker-1' }, expiresInSeconds: 3600 });
  const first = await s.auth.authenticate(bearer(token));
  if (!first.ok) return t.fail(first.refusal.reason);
  t.false(first.cached);
  t.like(first.identity, {
    username: 'system:serviceaccount:kube-system:konnectivity-agent',
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    podName: 'konnectivity-agent-7xk2p',
    podUid: 'pod-1',
    nodeName: 'worker-1',
  });
  t.regex(first.identity.uid, /^[0-9a-f-]{36}$/);
  t.regex(first.identity.credentialId ?? '', /^JTI=/);
  t.true(Math.abs((first.identity.expiresAt?.getTime() ?? 0) - (Date.now() + 3600_000)) < 10_000);
  for (let i = 0; i < 5; i++) t.like(await s.auth.authenticate([`bearer  ${token}`]), { ok: true, cached: true });
  t.is(s.reviews(), 1);
  t.like(s.auth.stats(), { reviews: 1, cacheHits: 5, cached: 1 });
});

test('refusals name the fix: no token, malformed, unknown, expired, revoked, wrong audience, wrong service account, wrong namespace, not a service account', async (t) => {
  const s = await setup(t);
  const cases: Array<[string[], string, RegExp]> = [
    [
      [],
      'no-token',
      /no service account token: the agent sent no authorization metadata \(set --service-account-token-path on the agent\)/,
    ],
    [['Basic dXNlcjpwYXNz'], 'malformed', /authorization metadata is not "Bearer <token>"/],
    [['Bearer a', 'Bearer b'], 'malformed', /2 authorization values; send exactly one "Bearer <token>"/],
    [['Bearer '], 'malformed', /empty bearer token/],
    [bearer('x'.repeat(20_000)), 'malformed', /bearer token longer than 16384 bytes/],
  ];
  for (const [values, kind, reason] of cases) {
    const r = refusal(t, await s.auth.authenticate(values));
    t.is(r.kind, kind, values.join(',').slice(0, 40));
    t.regex(r.reason, reason);
    t.true(r.agentFault);
  }
  t.is(s.reviews(), 0, 'malformed input never reaches the API');

  const revoked = s.token();
  s.k.api.tokens.revoke(revoked);
  const apiCases: Array<[string, string, RegExp]> = [
    ['opaque-garbage', 'rejected', /^the Kubernetes API did not authenticate the token: invalid bearer token$/],
    [
      s.token({ expiresInSeconds: -5 }),
      'rejected',
      /did not authenticate the token: \[invalid bearer token, service account token has expired\]/,
    ],
    [revoked, 'rejected', /service account token has been invalidated/],
    [
      s.token({ audiences: ['https://kubernetes.default.svc.cluster.local'] }),
      'wrong-audience',
      /the token is for audiences \["https:\/\/kubernetes.default.svc.cluster.local"\], this server requires "system:konnectivity-server" \(--authentication-audience; the audience of the agent's projected token\)/,
    ],
    [
      s.token({ serviceAccount: 'default' }),
      'wrong-identity',
      /the token belongs to service account default in namespace kube-system; this server accepts only system:serviceaccount:kube-system:konnectivity-agent \(--agent-namespace, --agent-service-account\)/,
    ],
    [
      s.token({ namespace: 'tenant-a' }),
      'wrong-identity',
      /service account konnectivity-agent in namespace tenant-a; this server accepts only/,
    ],
  ];
  s.k.api.tokens.registerStaticToken('static-admin', { username: 'kubernetes-admin', groups: ['system:masters'] }, [AUDIENCE]);
  apiCases.push(['static-admin', 'wrong-identity', /the token belongs to user "kubernetes-admin", not a service account/]);
  for (const [token, kind, reason] of apiCases) {
    const r = refusal(t, await s.auth.authenticate(bearer(token)));
    t.is(r.kind, kind, reason.source.slice(0, 40));
    t.regex(r.reason, reason);
    t.true(r.agentFault);
    t.false(r.reason.includes(token) && token.length > 20, 'the reason never contains the token');
  }
  t.like(s.auth.stats().refusals, { 'no-token': 1, malformed: 4, rejected: 3, 'wrong-audience': 1, 'wrong-identity': 3 });
  t.is(s.auth.stats().cached, 0, 'refusals are not cached');
});

test("the API down, slow, or refusing the server (401, 403): refused as unavailable, not the agent's fault, with the cause; accepted once the API is back", async (t) => {
  const s = await setup(t, { cacheTtlMs: 0, refusalCacheTtlMs: 0 });
  const token = s.token();
  const impatient = new TokenAuthenticator({
    api: await s.k.client({ user: SERVER_USER, auth: 'certificate' }),
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audience: AUDIENCE,
    reviewTimeoutMs: 500,
  });

  await s.k.api.goDown();
  let r = refusal(t, await s.auth.authenticate(bearer(token)));
  t.like(r, { kind: 'unavailable', agentFault: false });
  t.regex(
    r.reason,
    /^cannot check the token: TokenReview for audience system:konnectivity-server: cannot reach the Kubernetes API at https:\/\/127\.0\.0\.1:\d+: .*(ECONNREFUSED|socket hang up)/,
  );
  await s.k.api.comeBack();

  const hang = s.k.api.injectFault({ resource: 'tokenreviews' }, { hang: true });
  const started = performance.now();
  r = refusal(t, await impatient.authenticate(bearer(token)));
  t.log(`hung review refused after ${(performance.now() - started).toFixed(0)} ms (reviewTimeoutMs 500)`);
  t.like(r, { kind: 'unavailable', agentFault: false });
  t.regex(r.reason, /no answer from the Kubernetes API at .* within 500 ms/);
  await waitUntil(() => hang.hits === 1, 'the stand-in saw the abandoned review'); // before the next fault, which it would take
  hang.clear();

  s.k.api.injectFault({ resource: 'tokenreviews' }, { status: 401 }, 1);
  t.regex(
    refusal(t, await s.auth.authenticate(bearer(token))).reason,
    /rejected Kanal's credentials \(401 Unauthorized\): check the user in --kubeconfig/,
  );

  // A server user the shipped RBAC does not bind: the API's own 403.
  const unbound = new TokenAuthenticator({
    api: await s.k.client({ user: 'some-other-server', auth: 'certificate' }),
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audience: AUDIENCE,
  });
  r = refusal(t, await unbound.authenticate(bearer(token)));
  t.like(r, { kind: 'unavailable', agentFault: false });
  t.regex(
    r.reason,
    /403 Forbidden: tokenreviews.authentication.k8s.io is forbidden: User "some-other-server" cannot create resource "tokenreviews" .* at the cluster scope: grant it with the RBAC in deploy\/rbac\//,
  );

  // An API server that is not audience-aware: authenticated, but no audiences confirmed.
  s.k.api.injectFault(
    { resource: 'tokenreviews' },
    {
      status: 201,
      body: {
        kind: 'TokenReview',
        apiVersion: 'authentication.k8s.io/v1',
        status: { authenticated: true, user: { username: 'system:serviceaccount:kube-system:konnectivity-agent' } },
      },
    },
    1,
  );
  r = refusal(t, await s.auth.authenticate(bearer(token)));
  t.is(r.kind, 'wrong-audience');
  t.regex(r.reason, /authenticated the token, but not for audience "system:konnectivity-server" \(it answered \[\]\)/);

  t.like(await s.auth.authenticate(bearer(token)), { ok: true, cached: false });
});

test('a slow review does not stall the others; reviews in flight and waiting are bounded and refused beyond; cached tokens pass while the API hangs', async (t) => {
  const s = await setup(t, { reviewTimeoutMs: 3000 }, { maxInFlight: 2, maxWaiting: 2 });
  const cachedToken = s.token();
  t.true((await s.auth.authenticate(bearer(cachedToken))).ok);

  const first = s.k.api.injectFault({ resource: 'tokenreviews' }, { hang: true }, 1);
  const slow = s.auth.authenticate(bearer(s.token()));
  await waitUntil(() => first.hits === 1, 'one review hanging');
  const started = performance.now();
  const other = await s.auth.authenticate(bearer(s.token()));
  const otherMs = performance.now() - started;
  t.true(other.ok, 'another agent is accepted while one review hangs');
  t.log(`another agent accepted in ${otherMs.toFixed(0)} ms while one review hangs`);

  const hang = s.k.api.injectFault({ resource: 'tokenreviews' }, { hang: true });
  const stuck = [s.auth.authenticate(bearer(s.token())), s.auth.authenticate(bearer(s.token())), s.auth.authenticate(bearer(s.token()))];
  await waitUntil(() => hang.hits === 1 && s.auth.stats().inFlight === 4, 'the slow one, one more in flight and two waiting');
  const refusedAt = performance.now();
  const refused = refusal(t, await s.auth.authenticate(bearer(s.token())));
  t.log(`refused beyond the queue bound after ${(performance.now() - refusedAt).toFixed(1)} ms`);
  t.like(refused, { kind: 'unavailable', agentFault: false });
  t.regex(refused.reason, /Kubernetes API client busy: 2 requests in flight and 2 waiting \(the limit\)/);
  t.like(await s.auth.authenticate(bearer(cachedToken)), { ok: true, cached: true }, 'a cached token needs no review');

  for (const result of await Promise.all([slow, ...stuck]))
    t.like(result, { ok: false, refusal: { kind: 'unavailable' } }, 'each at its own deadline');
  hang.clear();
  t.true((await s.auth.authenticate(bearer(s.token()))).ok, 'served again once the API answers');
});

test('concurrent checks of one token share one review; the cache never outlives the token nor its TTL', async (t) => {
  const s = await setup(t, { cacheTtlMs: 400 });
  const token = s.token();
  const results = await Promise.all(Array.from({ length: 10 }, () => s.auth.authenticate(bearer(token))));
  t.true(results.every((r) => r.ok));
  t.is(s.reviews(), 1, 'ten connects, one review');

  s.k.api.tokens.revoke(token);
  t.like(await s.auth.authenticate(bearer(token)), { ok: true, cached: true }, 'within the TTL the cached answer stands');
  await new Promise((r) => setTimeout(r, 450));
  t.is(refusal(t, await s.auth.authenticate(bearer(token))).kind, 'rejected', 'after the TTL a revoked token is refused');

  const shortLived = s.token({ expiresInSeconds: 2 });
  const long = new TokenAuthenticator({
    api: await s.k.client({ user: SERVER_USER, auth: 'token' }),
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audience: AUDIENCE,
    cacheTtlMs: 60_000,
  });
  t.true((await long.authenticate(bearer(shortLived))).ok);
  await waitUntil(
    () => Date.now() / 1000 > (JSON.parse(Buffer.from(shortLived.split('.')[1], 'base64url').toString()) as { exp: number }).exp,
    'the token expired',
    5000,
  );
  const expired = refusal(t, await long.authenticate(bearer(shortLived)));
  t.is(expired.kind, 'rejected', 'an expired token is reviewed again, whatever the TTL');
  t.regex(expired.reason, /service account token has expired/);

  const bounded = new TokenAuthenticator({
    api: await s.k.client({ user: SERVER_USER, auth: 'token' }),
    namespace: 'kube-system',
    serviceAccount: 'konnectivity-agent',
    audience: AUDIENCE,
    maxCacheEntries: 3,
  });
  for (let i = 0; i < 5; i++) t.true((await bounded.authenticate(bearer(s.token()))).ok);
  t.is(bounded.stats().cached, 3, 'the cache keeps at most maxCacheEntries');
});

test('configuration: all of --agent-namespace, --agent-service-account and --authentication-audience, without ":" in the names', async (t) => {
  const k = await startKubeApi(t);
  const api = await k.client({ user: SERVER_USER, auth: 'token' });
  const base = { api, namespace: 'kube-system', serviceAccount: 'konnectivity-agent', audience: AUDIENCE };
  t.throws(() => new TokenAuthenticator({ ...base, namespace: '' }), {
    message: '--agent-namespace must not be empty for token authentication',
  });
  t.throws(() => new TokenAuthenticator({ ...base, serviceAccount: '' }), { message: /--agent-service-account must not be empty/ });
  t.throws(() => new TokenAuthenticator({ ...base, audience: '' }), { message: /--authentication-audience must not be empty/ });
  t.throws(() => new TokenAuthenticator({ ...base, serviceAccount: 'a:b' }), {
    message: '--agent-service-account "a:b" must not contain \':\'',
  });
  t.is(new TokenAuthenticator(base).expectedUsername, 'system:serviceaccount:kube-system:konnectivity-agent');
});

test('one peer sending fresh tokens holds at most --maxReviewsPerPeer reviews: another peer is still reviewed; a refused token is not reviewed again within the refusal TTL', async (t) => {
  const s = await setup(t, { reviewTimeoutMs: 3000, refusalCacheTtlMs: 400 }, { maxInFlight: 4, maxWaiting: 0 });
  const hang = s.k.api.injectFault({ resource: 'tokenreviews' }, { hang: true }, 2);
  const flood = [s.auth.authenticate(bearer(s.token()), '192.0.2.7'), s.auth.authenticate(bearer(s.token()), '192.0.2.7')];
  await waitUntil(() => hang.hits === 2, 'two reviews of one peer hanging');
  const third = refusal(t, await s.auth.authenticate(bearer(s.token()), '192.0.2.7'));
  t.like(third, { kind: 'unavailable', agentFault: false }, 'a third review of the same peer is refused at once');
  t.regex(third.reason, /2 token reviews from 192\.0\.2\.7 are still in flight \(the limit\)/);
  t.true((await s.auth.authenticate(bearer(s.token()), '192.0.2.8')).ok, 'another peer is reviewed meanwhile');
  for (const r of await Promise.all(flood)) t.like(r, { ok: false, refusal: { kind: 'unavailable' } });
  t.true((await s.auth.authenticate(bearer(s.token()), '192.0.2.7')).ok, 'the peer is reviewed again once its reviews settled');

  const junk = s.token({ audiences: ['another-audience'] });
  const before = s.reviews();
  for (let i = 0; i < 5; i++) t.is(refusal(t, await s.auth.authenticate(bearer(junk), '192.0.2.9')).kind, 'wrong-audience');
  t.is(s.reviews() - before, 1, 'five refusals of one token, one review');
  await new Promise((r) => setTimeout(r, 450));
  t.is(refusal(t, await s.auth.authenticate(bearer(junk), '192.0.2.9')).kind, 'wrong-audience');
  t.is(s.reviews() - before, 2, 'reviewed again after the refusal TTL');
});
