/**
 * Which tenant owns a connection (src/server/tenants/tenant-directory.ts), a
 * security decision, checked through the directory's own API: by server name
 * (SNI) with the tenant's CA, by client certificate alone, by a token's
 * issuer; refused when ambiguous, unknown, or crossing tenants; and what a
 * replacement directory decides while the old one keeps its answers.
 */
import test from 'ava';
import { X509Certificate } from 'node:crypto';
import type tls from 'node:tls';
import { createCertificateAuthority, type CertificateAuthority } from '../../../kit/pki/certificate-authority.js';
import { TenantDirectory, type Recognition, type TenantCredentials } from '../../../src/server/tenants/tenant-directory.js';
import { NO_PINS, parseSubjectPattern, type RolePins } from '../../../src/server/identity/client-roles.js';

interface Cas {
  alphaAgents: CertificateAuthority;
  alphaServing: CertificateAuthority;
  betaAgents: CertificateAuthority;
  betaKas: CertificateAuthority;
  rogue: CertificateAuthority;
}

let casPromise: Promise<Cas> | undefined;
function cas(): Promise<Cas> {
  casPromise ??= (async () => {
    const [alphaAgents, alphaServing, betaAgents, betaKas, rogue] = await Promise.all(
      ['alpha-agents', 'alpha-serving', 'beta-agents', 'beta-kas', 'rogue'].map((n) => createCertificateAuthority(n)),
    );
    return { alphaAgents, alphaServing, betaAgents, betaKas, rogue };
  })();
  return casPromise;
}

const ALPHA_NAME = 'alpha.tenants.test';

async function alpha(c: Cas, overrides: Partial<TenantCredentials> = {}): Promise<TenantCredentials> {
  const serving = await c.alphaServing.issue({ commonName: ALPHA_NAME, dnsNames: [ALPHA_NAME], usage: 'server' });
  return {
    name: 'alpha',
    serverNames: [ALPHA_NAME],
    serving: { cert: Buffer.from(serving.certPem), key: Buffer.from(serving.keyPem) },
    agentCa: Buffer.from(c.alphaAgents.certPem),
    agentPins: NO_PINS,
    frontendPins: NO_PINS,
    tokens: false,
    ...overrides,
  };
}

function beta(c: Cas, overrides: Partial<TenantCredentials> = {}): TenantCredentials {
  return {
    name: 'beta',
    serverNames: [],
    agentCa: Buffer.from(c.betaAgents.certPem),
    agentPins: NO_PINS,
    frontendCa: Buffer.from(c.betaKas.certPem),
    frontendPins: NO_PINS,
    tokens: false,
    ...overrides,
  };
}

const pins = (...subjects: string[]): RolePins => ({ subjects: subjects.map(parseSubjectPattern), ekus: [] });

/** What recognise*() reads of a socket after its handshake: the server name, the certificate as sent, OpenSSL's verdict. */
function handshake(o: { servername?: string; certPem?: string; authorized?: boolean; authorizationError?: string }): tls.TLSSocket {
  const raw = o.certPem === undefined ? undefined : new X509Certificate(o.certPem).raw;
  const fake = {
    servername: o.servername ?? false,
    authorized: o.authorized ?? false,
    authorizationError: o.authorizationError,
    getPeerCertificate: () => (raw ? { raw } : {}),
  };
  return fake as unknown as tls.TLSSocket;
}

async function clientCert(ca: CertificateAuthority, commonName: string): Promise<string> {
  return (await ca.issue({ commonName, usage: 'client' })).certPem;
}

function refusal<C>(r: Recognition<C>): Extract<Recognition<C>, { ok: false }> {
  if (r.ok) throw new Error(`expected a refusal, got tenant ${JSON.stringify(r.connection)} (${r.identity})`);
  return r;
}

function accepted<C>(r: Recognition<C>): Extract<Recognition<C>, { ok: true }> {
  if (!r.ok) throw new Error(`expected a tenant, got ${r.reason}: ${r.what}; ${r.detail}`);
  return r;
}

function token(claims: object): string {
  const part = (o: object): string => Buffer.from(JSON.stringify(o)).toString('base64url');
  return `Bearer ${part({ alg: 'RS256' })}.${part(claims)}.c2ln`;
}

test('SNI: the server name picks the tenant (any case), its context is presented, and its CA must have issued the certificate', async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c), beta(c)], {});
  t.is(dir.size, 2);
  t.truthy(dir.contextFor(ALPHA_NAME), "alpha's serving context for its name");
  t.truthy(dir.contextFor(ALPHA_NAME.toUpperCase()), 'server names compare without case');
  t.is(dir.contextFor('beta.tenants.test'), undefined, 'no context for a name no tenant lists');

  const agent = await clientCert(c.alphaAgents, 'alpha-agent-1');
  const ok = accepted(dir.recogniseAgent(handshake({ servername: 'Alpha.Tenants.Test', certPem: agent, authorized: true })));
  t.is(ok.connection.tenant, 'alpha');
  t.is(ok.connection.credential?.subject, 'CN=alpha-agent-1 (issuer CN=alpha-agents)');
  t.regex(ok.identity, /^server name alpha\.tenants\.test, certificate CN=alpha-agent-1 /);

  // Beta's agent naming alpha's server: refused, and the log learns whose certificate it is.
  const crossing = refusal(
    dir.recogniseAgent(
      handshake({
        servername: ALPHA_NAME,
        certPem: await clientCert(c.betaAgents, 'beta-agent'),
        authorizationError: 'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
      }),
    ),
  );
  t.is(crossing.reason, 'agent_tenant_mismatch');
  t.regex(crossing.what, /server name "alpha.tenants.test" is tenant "alpha"'s, the certificate is not/);
  t.regex(crossing.detail, /issued by the CA of tenant "beta"/);
  t.deepEqual(crossing.fields, { tenant: 'alpha', certificateTenants: ['beta'] });

  // OpenSSL said yes but the directory's own chain check did not (a handshake under an older context): refused.
  const rogue = refusal(
    dir.recogniseAgent(handshake({ servername: ALPHA_NAME, certPem: await clientCert(c.rogue, 'alpha-agent-1'), authorized: true })),
  );
  t.is(rogue.reason, 'agent_tenant_mismatch');
  t.deepEqual(rogue.fields, { tenant: 'alpha' });

  const none = refusal(dir.recogniseAgent(handshake({ servername: ALPHA_NAME })));
  t.is(none.reason, 'agent_tenant_mismatch');
  t.is(none.detail, 'no client certificate presented');
});

test("SNI: a tenant's pins still apply to a certificate its CA issued", async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c, { agentPins: pins('CN=alpha-agent-*') })], {});
  const pinned = accepted(
    dir.recogniseAgent(handshake({ servername: ALPHA_NAME, certPem: await clientCert(c.alphaAgents, 'alpha-agent-2'), authorized: true })),
  );
  t.is(pinned.connection.tenant, 'alpha');
  const other = refusal(
    dir.recogniseAgent(handshake({ servername: ALPHA_NAME, certPem: await clientCert(c.alphaAgents, 'someone-else'), authorized: true })),
  );
  t.is(other.reason, 'agent_tenant_mismatch');
  t.regex(other.what, /not tenant "alpha"'s/);
});

test('client certificate without SNI: the one tenant whose CA issued it and whose pins it matches', async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c), beta(c)], {});
  const ok = accepted(dir.recogniseAgent(handshake({ certPem: await clientCert(c.betaAgents, 'system:node:n1') })));
  t.is(ok.connection.tenant, 'beta');
  t.is(ok.identity, 'certificate CN=system:node:n1 (issuer CN=beta-agents)');
  // Alpha's agent without its server name is still alpha's: its CA is alpha's alone.
  t.is(accepted(dir.recogniseAgent(handshake({ certPem: await clientCert(c.alphaAgents, 'a') }))).connection.tenant, 'alpha');
});

test('client certificate: two tenants trusting one CA are ambiguous until pins tell them apart', async (t) => {
  const c = await cas();
  const shared = beta(c, { name: 'beta-2' });
  const cert = await clientCert(c.betaAgents, 'system:node:n1');

  const ambiguous = refusal(new TenantDirectory([beta(c), shared], {}).recogniseAgent(handshake({ certPem: cert })));
  t.is(ambiguous.reason, 'agent_tenant_ambiguous');
  t.deepEqual(ambiguous.fields, { tenants: ['beta', 'beta-2'] });
  t.regex(ambiguous.detail, /tenants "beta" and "beta-2" all accept CN=system:node:n1/);

  const pinnedApart = new TenantDirectory(
    [beta(c, { agentPins: pins('CN=system:node:*') }), { ...shared, agentPins: pins('CN=other-*') }],
    {},
  );
  t.is(accepted(pinnedApart.recogniseAgent(handshake({ certPem: cert }))).connection.tenant, 'beta');
  // Pinned to neither: no tenant, and the refusal says each tenant's reason.
  const neither = refusal(pinnedApart.recogniseAgent(handshake({ certPem: await clientCert(c.betaAgents, 'stranger') })));
  t.is(neither.reason, 'agent_tenant_unknown');
  t.deepEqual(neither.fields, { tenants: ['beta', 'beta-2'] });
  t.regex(neither.detail, /tenant "beta": .*; tenant "beta-2": /);
});

test('unknown: a certificate no tenant issued, or neither a server name nor a certificate, names no tenant', async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c), beta(c)], {});
  const rogue = refusal(dir.recogniseAgent(handshake({ certPem: await clientCert(c.rogue, 'system:node:n1') })));
  t.is(rogue.reason, 'agent_tenant_unknown');
  t.is(rogue.what, 'its certificate fits no tenant');
  t.deepEqual(rogue.fields, { tenants: [] });

  const bare = refusal(dir.recogniseAgent(handshake({})));
  t.is(bare.reason, 'agent_tenant_unknown');
  t.is(bare.what, 'it names no tenant');
  t.regex(bare.detail, /no server name \(SNI\) and no client certificate/);

  const wrongName = refusal(dir.recogniseAgent(handshake({ servername: 'nobody.test' })));
  t.is(wrongName.reason, 'agent_tenant_unknown');
  t.deepEqual(wrongName.fields, { serverName: 'nobody.test' });
});

test("token issuer: a token's iss names its tenant; anything else names none", async (t) => {
  const c = await cas();
  const gamma: TenantCredentials = {
    name: 'gamma',
    serverNames: [],
    agentPins: NO_PINS,
    frontendPins: NO_PINS,
    tokenIssuer: 'https://gamma.example',
    tokens: true,
  };
  const dir = new TenantDirectory([beta(c), gamma], {});
  t.true(dir.hasTokenIssuers());
  t.false(new TenantDirectory([beta(c)], {}).hasTokenIssuers());

  t.is(dir.tenantOfToken([token({ iss: 'https://gamma.example', sub: 'x' })]), 'gamma');
  t.is(dir.tenantOfToken([token({ iss: 'https://beta.example' })]), undefined, 'an issuer no tenant has');
  t.is(dir.tenantOfToken([token({ sub: 'x' })]), undefined, 'no iss');
  t.is(dir.tenantOfToken([token({ iss: 42 })]), undefined, 'an iss that is no string');
  t.is(dir.tenantOfToken([token({ iss: 'https://gamma.example' }), token({ iss: 'https://gamma.example' })]), undefined, 'two headers');
  t.is(dir.tenantOfToken(['Bearer not-a-jwt']), undefined);
  t.is(dir.tenantOfToken(['Basic Z2FtbWE6eA==']), undefined);
  t.is(dir.tenantOfToken([`Bearer e30.${Buffer.from('{not json').toString('base64url')}.x`]), undefined, 'claims that are not JSON');

  // Without a certificate the connection waits for its token to name the tenant; a certificate of a tenant still decides.
  const waiting = accepted(dir.recogniseAgent(handshake({})));
  t.deepEqual(waiting.connection, {});
  t.is(waiting.identity, 'a token to name its tenant');
  t.is(accepted(dir.recogniseAgent(handshake({ certPem: await clientCert(c.betaAgents, 'n') }))).connection.tenant, 'beta');
});

test('SNI of a token-only tenant: the name decides, the token comes later', async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c, { agentCa: undefined, tokens: true, tokenIssuer: 'https://alpha.example' })], {});
  const ok = accepted(dir.recogniseAgent(handshake({ servername: ALPHA_NAME })));
  t.deepEqual(ok.connection, { tenant: 'alpha' });
  t.regex(ok.identity, /a token to come/);
});

test('frontend: the tenant whose server-ca-cert issued the certificate; agent credentials and strangers refused', async (t) => {
  const c = await cas();
  const dir = new TenantDirectory([await alpha(c), beta(c)], {});
  const kas = (await c.betaKas.issue({ commonName: 'beta-kube-apiserver', usage: 'client' })).certPem;
  const ok = accepted(dir.recogniseFrontend(handshake({ certPem: kas })));
  t.deepEqual(ok.connection, { tenant: 'beta' });
  t.is(ok.identity, 'certificate CN=beta-kube-apiserver (issuer CN=beta-kas)');

  const none = refusal(dir.recogniseFrontend(handshake({})));
  t.is(none.reason, 'frontend_certificate');
  t.is(none.detail, 'no client certificate presented');
  const stranger = refusal(dir.recogniseFrontend(handshake({ certPem: await clientCert(c.rogue, 'kube-apiserver') })));
  t.is(stranger.reason, 'frontend_certificate');

  // One CA for both roles: a certificate the tenant takes as an agent's never opens its frontend.
  const oneCa = new TenantDirectory([beta(c, { frontendCa: Buffer.from(c.betaAgents.certPem) })], {});
  const role = refusal(oneCa.recogniseFrontend(handshake({ certPem: await clientCert(c.betaAgents, 'system:node:n1') })));
  t.is(role.reason, 'frontend_role');
  t.deepEqual(role.fields, { tenants: ['beta'] });

  const twice = new TenantDirectory([beta(c), beta(c, { name: 'beta-2', agentCa: undefined })], {});
  const ambiguous = refusal(twice.recogniseFrontend(handshake({ certPem: kas })));
  t.is(ambiguous.reason, 'frontend_tenant_ambiguous');
  t.deepEqual(ambiguous.fields, { tenants: ['beta', 'beta-2'] });

  const pinned = new TenantDirectory([beta(c, { frontendPins: pins('CN=other') })], {});
  const unpinned = refusal(pinned.recogniseFrontend(handshake({ certPem: kas })));
  t.is(unpinned.reason, 'frontend_tenant_unknown');
  t.deepEqual(unpinned.fields, { tenants: ['beta'] });
});

test('after a replacement: the new directory decides by the new list alone; the old one keeps its answers', async (t) => {
  const c = await cas();
  const before = new TenantDirectory([await alpha(c), beta(c)], {});
  const alphaAgent = await clientCert(c.alphaAgents, 'alpha-agent-1');
  const betaAgent = await clientCert(c.betaAgents, 'system:node:n1');

  // Alpha removed; beta now trusts alpha's agent CA too (a CA rotation): alpha's agents are beta's from now on.
  const after = new TenantDirectory([beta(c, { agentCa: Buffer.from(c.alphaAgents.certPem + c.betaAgents.certPem) })], {}, before);
  t.is(after.size, 1);
  t.is(after.contextFor(ALPHA_NAME), undefined, "the removed tenant's server name is gone");
  const renamed = refusal(after.recogniseAgent(handshake({ servername: ALPHA_NAME })));
  t.is(renamed.reason, 'agent_tenant_unknown', "alpha's name names no tenant any more");
  t.deepEqual(renamed.fields, { serverName: ALPHA_NAME });
  // With its name gone, the certificate alone decides.
  const byCert = accepted(after.recogniseAgent(handshake({ servername: ALPHA_NAME, certPem: alphaAgent, authorized: true })));
  t.is(byCert.connection.tenant, 'beta');
  t.regex(byCert.identity, /^certificate /);
  t.is(accepted(after.recogniseAgent(handshake({ certPem: alphaAgent }))).connection.tenant, 'beta');
  t.is(accepted(after.recogniseAgent(handshake({ certPem: betaAgent }))).connection.tenant, 'beta');

  // The directory it replaced is whole as it was: a decision in flight never sees half a change.
  t.truthy(before.contextFor(ALPHA_NAME));
  t.is(accepted(before.recogniseAgent(handshake({ certPem: alphaAgent }))).connection.tenant, 'alpha');

  // Beta removed as well: its agents are nobody's.
  const empty = new TenantDirectory([], {}, after);
  t.is(empty.size, 0);
  t.is(refusal(empty.recogniseAgent(handshake({ certPem: betaAgent }))).reason, 'agent_tenant_unknown');
});
