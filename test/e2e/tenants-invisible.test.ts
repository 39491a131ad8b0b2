/**
 * A tenant is invisible to those outside it (docs/multi-tenant.md, "What a
 * tenant can and cannot see or do"), tried as a stranger does on a shared
 * server of four tenants — by server name (a), by certificate with a
 * kube-apiserver on the TCP frontend (b), by token issuer (c), and by
 * certificate and token (secret-customer-d):
 *
 * 1. Agent streams without a certificate or a server name, whose bearer JWT
 *    names d's issuer, c's issuer (reviewed by c's API and refused: a bad
 *    signature), an issuer of nobody, or that carry no token, and one with an
 *    expired certificate of b's CA: every one gets
 *    the same gRPC status and text, naming no tenant, issuer or CA. The
 *    server's log names the tenant (the operator's).
 * 2. `openssl s_client` without a credential: the agent port without SNI,
 *    with an unknown name, and the TCP frontend list no CA in their
 *    CertificateRequest; the agent port with a's name lists a's agent CA
 *    alone (docs: "send none, or only the SNI-selected tenant's").
 *
 * Meanwhile a's agent (by name) and b's agent (by certificate) stay
 * connected, and b's kube-apiserver reaches b's agent on the TCP frontend.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createCertificateAuthority, type CertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { freePort, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import { run } from '../../kit/launch/run-to-end.js';
import type { Child } from '../../kit/launch/child.js';
import { connectUnix, httpConnect } from '../../kit/demo/proxy-client.js';
import { echoRoundTrip, makeWorkspace, startAgent, startEchoBackend, tlsToFrontend, type Workspace } from '../helpers/kanal-processes.js';
import { shippedRbac, startKubeApi } from '../helpers/kube-stand-in/fixture.js';
import { tcpFrontendArgs, tenantsFile, tenantsServerArgs, writePair, type Pem } from '../helpers/tenants.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import { AGENT_SERVICE_CONNECT, MD_AGENT_ID, MD_AUTHORIZATION } from '../../src/wire/metadata.js';
import { GrpcStatus, GrpcStatusError } from '../../src/transport/grpc-status.js';
import { UNPROVEN_PEER_REFUSALS } from '../../src/server/identity/peer-refusals.js';

const A_NAME = 'a.tenants.test';
const D_ISSUER = 'https://secret-customer-d.example.com';
const NS = 'kube-system';
const SA = 'konnectivity-agent';
const AUDIENCE = 'system:konnectivity-server';
/** Words that would tell a stranger about a tenant: names, issuers, CA names. */
const SECRETS = ['tenant-a', 'tenant-b', 'tenant-c', 'secret-customer-d', 'a-agent-ca', 'b-agent-ca', 'b-kas-ca', 'd-agent-ca', 'd-kas-ca'];

interface Pki {
  dir: string;
  ca: Record<string, { authority: CertificateAuthority; file: string }>;
  aServing: Pem & { ca: string };
}

async function pki(ws: Workspace): Promise<Pki> {
  const dir = path.join(ws.dir, 'tenants-pki');
  await fs.mkdir(dir);
  const names = ['a-serving-ca', 'a-agent-ca', 'b-agent-ca', 'b-kas-ca', 'd-agent-ca', 'd-kas-ca'];
  const ca: Pki['ca'] = {};
  for (const n of names) {
    const authority = await createCertificateAuthority(n);
    const file = path.join(dir, `${n}.crt`);
    await fs.writeFile(file, authority.certPem);
    ca[n] = { authority, file };
  }
  const serving = await writePair(
    dir,
    'a-serving',
    await ca['a-serving-ca'].authority.issue({ commonName: A_NAME, dnsNames: [A_NAME], usage: 'server' }),
  );
  return { dir, ca, aServing: { ...serving, ca: ca['a-serving-ca'].file } };
}

async function issue(p: Pki, caName: string, cn: string): Promise<Pem> {
  return writePair(p.dir, cn, await p.ca[caName].authority.issue({ commonName: cn, usage: 'client' }));
}

/** A JWT with `iss` and a signature nobody made: what a stranger can always write. */
function forgedToken(iss: string): string {
  const part = (o: object): string => Buffer.from(JSON.stringify(o)).toString('base64url');
  const claims = { iss, sub: `system:serviceaccount:${NS}:${SA}`, aud: [AUDIENCE], exp: Math.floor(Date.now() / 1000) + 3600 };
  return `${part({ alg: 'RS256', kid: 'k' })}.${part(claims)}.${randomBytes(64).toString('base64url')}`;
}

/** The status and text an agent stream gets, on a TLS connection of its own without a certificate and without SNI (an IP address). */
async function refusalOf(ws: Workspace, port: number, authorization: string | undefined, cred?: Pem): Promise<string> {
  const tlsOptions = { ca: readFileSync(ws.pki.caCert), ...(cred ? { cert: readFileSync(cred.cert), key: readFileSync(cred.key) } : {}) };
  const channel = h2Transport.createChannel({ target: `127.0.0.1:${port}`, tls: tlsOptions });
  try {
    const md: Record<string, string> = { [MD_AGENT_ID]: 'probe' };
    if (authorization !== undefined) md[MD_AUTHORIZATION] = authorization;
    const stream = await channel.openStream(AGENT_SERVICE_CONNECT, md, 10_000);
    stream.destroy();
    return 'accepted';
  } catch (err) {
    return err instanceof GrpcStatusError ? `${GrpcStatus[err.code]}: ${err.message}` : `not a gRPC status: ${String(err)}`;
  } finally {
    channel.close();
  }
}

/** The CA names a CertificateRequest listed, as `openssl s_client` prints them ([] for none sent). */
async function acceptableCaNames(port: number, serverName?: string): Promise<string[] | string> {
  const args = ['s_client', '-connect', `127.0.0.1:${port}`, ...(serverName ? ['-servername', serverName] : ['-noservername'])];
  const r = await run('openssl', args, { timeoutMs: 20_000 });
  if (/No client certificate CA names sent/.test(r.stdout)) return [];
  const m =
    /Acceptable client certificate CA names\n([\s\S]*?)\n(?:Requested Signature Algorithms|Client Certificate Types|Shared Requested|---)/.exec(
      r.stdout,
    );
  return m ? m[1].split('\n').map((l) => l.trim()) : `no CA section in: ${r.stdout.slice(0, 2000)} ${r.stderr.slice(0, 500)}`;
}

interface Server extends Child {
  agentPort: number;
  frontendPort: number;
  healthPort: number;
}

async function startServer(t: ExecutionContext, ws: Workspace, yaml: string): Promise<Server> {
  const file = path.join(ws.dir, 'tenants.yaml');
  await fs.writeFile(file, yaml);
  return withPortRetry(async () => {
    const [agentPort, healthPort, frontendPort] = [await freePort(), await freePort(), await freePort()];
    const args = [
      ...tenantsServerArgs({
        file,
        defaultPair: { cert: ws.pki.serverCert, key: ws.pki.serverKey },
        agentHost: '127.0.0.1',
        agentPort,
        healthPort,
      }),
      ...tcpFrontendArgs(frontendPort, { cert: ws.pki.frontendCert, key: ws.pki.frontendKey }),
    ];
    const proc = spawnKanal(t, { name: 'shared-server', args, logFile: path.join(ws.dir, 'shared-server.log') });
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/readyz`, 20_000);
    return Object.assign(proc, { agentPort, healthPort, frontendPort });
  });
}

/** CONNECT through the TCP frontend as `cred` (b's kube-apiserver), echoing `what`. */
async function echoesViaFrontend(ws: Workspace, server: Server, cred: Pem, address: string, what: string): Promise<boolean> {
  const s = await tlsToFrontend(server, ws, { credential: cred, servername: 'localhost' });
  // A connection the server refuses after the handshake (TLS 1.3 checks the client's certificate then) is closed without an answer.
  const closed = new Promise<never>((_, reject) => s.once('close', () => reject(new Error('closed without an answer'))));
  const tunnel = await Promise.race([httpConnect(s, address, 10_000), closed]);
  try {
    return await echoRoundTrip(tunnel, Buffer.from(what));
  } finally {
    tunnel.destroy();
  }
}

async function echoesViaSocket(socket: string, address: string, what: string): Promise<boolean> {
  const tunnel = await httpConnect(await connectUnix(socket), address, 10_000);
  try {
    return await echoRoundTrip(tunnel, Buffer.from(what));
  } finally {
    tunnel.destroy();
  }
}

test('tenants are invisible to strangers: one refusal text for every unproven agent, and no CA names in a CertificateRequest but the SNI-named tenant’s', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-invisible-');
  const p = await pki(ws);
  const echo = await startEchoBackend(t);
  const kube = await startKubeApi(t, { rbac: await shippedRbac() });
  const kubeconfig = await kube.api.writeKubeconfig(path.join(ws.dir, 'review.kubeconfig'), {
    user: 'system:konnectivity-server',
    auth: 'certificate',
  });
  const realToken = kube.api.tokens.issueServiceAccountToken({ namespace: NS, serviceAccount: SA, audiences: [AUDIENCE] });
  const cIssuer = String((JSON.parse(Buffer.from(realToken.split('.')[1], 'base64url').toString()) as { iss?: unknown }).iss);
  const review = `    agent-namespace: ${NS}
    agent-service-account: ${SA}
    authentication-audience: ${AUDIENCE}
    kubeconfig: ${kubeconfig}
`;
  const aSocket = path.join(ws.dir, 'a.sock');
  const yaml = tenantsFile([
    `  - name: tenant-a
    server-name: [${A_NAME}]
    cluster-cert: ${p.aServing.cert}
    cluster-key: ${p.aServing.key}
    cluster-ca-cert: ${p.ca['a-agent-ca'].file}
    uds-name: ${aSocket}
`,
    `  - name: tenant-b
    cluster-ca-cert: ${p.ca['b-agent-ca'].file}
    server-ca-cert: ${p.ca['b-kas-ca'].file}
`,
    `  - name: tenant-c
${review}    token-issuer: ${cIssuer}
    uds-name: ${path.join(ws.dir, 'c.sock')}
`,
    `  - name: secret-customer-d
    cluster-ca-cert: ${p.ca['d-agent-ca'].file}
${review}    token-issuer: ${D_ISSUER}
    server-ca-cert: ${p.ca['d-kas-ca'].file}
`,
  ]);
  const server = await startServer(t, ws, yaml);

  // The honest: a's agent by its name, b's by its certificate (no SNI), b's kube-apiserver on the TCP frontend.
  const aCred = await issue(p, 'a-agent-ca', 'a-node-1');
  const aAgent = await startAgent(t, ws, server, {
    agentID: 'a-node-1',
    cert: 'none',
    extraArgs: ['--ca-cert', p.aServing.ca, '--tls-server-name', A_NAME, '--agent-cert', aCred.cert, '--agent-key', aCred.key],
  });
  const bCred = await issue(p, 'b-agent-ca', 'b-node-1');
  const bAgent = await startAgent(t, ws, server, {
    agentID: 'b-node-1',
    cert: 'none',
    extraArgs: ['--agent-cert', bCred.cert, '--agent-key', bCred.key],
  });
  const bKas = await issue(p, 'b-kas-ca', 'b-kube-apiserver');
  t.true(await echoesViaFrontend(ws, server, bKas, echo.address, 'b before'), "b's kube-apiserver reaches b's agent");
  t.true(await echoesViaSocket(aSocket, echo.address, 'a before'), "a's kube-apiserver reaches a's agent");

  // 1. Strangers' agent streams: no certificate (or an expired one), no server name.
  const expired = await writePair(
    p.dir,
    'b-expired',
    await p.ca['b-agent-ca'].authority.issue({ commonName: 'b-node-old', usage: 'client', validDays: -1 }),
  );
  const reviews = (): number => kube.api.requests.filter((r) => r.resource === 'tokenreviews').length;
  const before = reviews();
  const answers = {
    "d's issuer (d wants a certificate too)": await refusalOf(ws, server.agentPort, `Bearer ${forgedToken(D_ISSUER)}`),
    "c's issuer, a bad signature": await refusalOf(ws, server.agentPort, `Bearer ${forgedToken(cIssuer)}`),
    'an issuer of no tenant': await refusalOf(ws, server.agentPort, `Bearer ${forgedToken('https://nobody.example.com')}`),
    'no token': await refusalOf(ws, server.agentPort, undefined),
    'not a JWT': await refusalOf(ws, server.agentPort, 'Bearer not-a-jwt'),
    // The server checks the chain itself now: an expired certificate of b's CA proves nothing either.
    "an expired certificate of b's CA": await refusalOf(ws, server.agentPort, undefined, expired),
  };
  t.log(answers);
  t.true(reviews() > before, "c's API reviewed the token naming c's issuer: that path ran");
  const texts = new Set(Object.values(answers));
  t.is(texts.size, 1, `one answer for all: ${JSON.stringify(answers)}`);
  const [text] = texts;
  t.true(text.startsWith('UNAUTHENTICATED: '), text);
  t.true(UNPROVEN_PEER_REFUSALS.includes(text.replace(/^UNAUTHENTICATED: /, '')), 'the text is from the generic set');
  for (const s of [...SECRETS, D_ISSUER, cIssuer]) t.false(text.includes(s), `the answer does not name ${s}`);
  // The operator's log still says whose it was.
  const logged = await server.waitForLine(
    (l) => l.refusal === 'agent_tenant_mismatch' && l.tenant === 'secret-customer-d',
    10_000,
    "d's refusal in the log",
  );
  t.regex(String(logged.reason), /needs a client certificate/);
  await server.waitForLine((l) => l.refusal === 'agent_token_rejected' && l.tenant === 'tenant-c', 10_000, "c's refusal in the log");

  // 2. What a CertificateRequest lists to a peer with no credential.
  const listed = {
    agentNoSni: await acceptableCaNames(server.agentPort),
    agentUnknownName: await acceptableCaNames(server.agentPort, 'nobody.tenants.test'),
    agentA: await acceptableCaNames(server.agentPort, A_NAME),
    frontendNoSni: await acceptableCaNames(server.frontendPort),
    frontendName: await acceptableCaNames(server.frontendPort, 'localhost'),
  };
  t.log(listed);
  t.deepEqual(listed.agentNoSni, [], 'the agent port without a name lists no CA');
  t.deepEqual(listed.agentUnknownName, [], 'nor with a name of no tenant');
  t.deepEqual(listed.frontendNoSni, [], 'the TCP frontend lists no CA');
  t.deepEqual(listed.frontendName, []);
  t.deepEqual(listed.agentA, ['CN = a-agent-ca'], "a's name: a's agent CA alone");

  // The frontend checks the chain itself too: an expired certificate of b's KAS CA is refused, and the log says why.
  const expiredKas = await writePair(
    p.dir,
    'b-kas-expired',
    await p.ca['b-kas-ca'].authority.issue({ commonName: 'b-kube-apiserver', usage: 'client', validDays: -1 }),
  );
  await t.throwsAsync(echoesViaFrontend(ws, server, expiredKas, echo.address, 'expired'));
  const refusedKas = await server.waitForLine(
    (l) => l.refusal === 'frontend_certificate' && /b-kube-apiserver/.test(String(l.reason)),
    10_000,
    'the expired KAS refused',
  );
  t.regex(String(refusedKas.reason), /CN=b-kube-apiserver.*expired/);

  // Meanwhile nothing honest was disturbed.
  t.true(await echoesViaFrontend(ws, server, bKas, echo.address, 'b after'), "b's kube-apiserver still reaches b's agent");
  t.true(await echoesViaSocket(aSocket, echo.address, 'a after'), "a's kube-apiserver still reaches a's agent");
  t.true(aAgent.running() && bAgent.running());
  t.true(
    server.jsonLines().every((l) => !(l.msg === 'agent connected' && l.agentID === 'probe')),
    'no stranger was admitted',
  );
});
