/**
 * A shared `kanal server --tenants-config` (docs/multi-tenant.md) with real
 * peers of each tenant:
 *
 * 1. Unmodified upstream proxy-agents (../shared/upstream, v0.36.0) join their
 *    tenant by name: they run in a network namespace whose hosts file maps the
 *    tenants' server names to the shared server, so Go sends the name as SNI.
 *    Each tenant's kube-apiserver (HTTP CONNECT on its own Unix socket) reaches
 *    its own agents only.
 * 2. Token tenants, each reviewed by its OWN Kubernetes API (two stand-ins):
 *    a token that cluster A issued, presented to tenant B (by B's server name,
 *    or by the `iss` both stand-ins put in their tokens), is reviewed by B's
 *    API alone, refused, and never shown to A's.
 * 3. Node -> control plane: a node of tenant A asking for tenant B's allowed
 *    destination is refused (and counted under tenant A), while A's own
 *    destination and B's node to B's destination work.
 *
 * Layout of 1 and 2: one network namespace created (and deleted) by the test,
 * loopback up, holding the server, the agents and the echo backend they dial;
 * the kube-apiservers come in on Unix sockets, the API stand-ins (in this
 * process) are relayed in through Unix sockets (test/helpers/tenant-netns.ts).
 * 3 runs on loopback with Kanal agents listening on 127.0.0.2 and 127.0.0.3.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import { connect, type Socket } from 'node:net';
import { createCertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { freePort } from '../../kit/launch/kanal-cli.js';
import { netnsUnavailableReason } from '../../kit/launch/netns.js';
import type { Child } from '../../kit/launch/child.js';
import { connectUnix, httpConnect, ConnectRefused } from '../../kit/demo/proxy-client.js';
import {
  echoRoundTrip,
  makeWorkspace,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  waitClosed,
  writeAll,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { shippedRbac, startKubeApi, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import { upstreamBinaries, upstreamUnavailableReason } from '../helpers/upstream.js';
import { createTenantNetns, type TenantNetns } from '../helpers/tenant-netns.js';
import { skippedBecause } from '../helpers/skipped.js';
import { startTenantsServer, tenantsFile, tenantsServerArgs, writePair, type Pem } from '../helpers/tenants.js';

// Inside the test's namespace every port is free: fixed numbers.
const AGENT_PORT = 8091;
const HEALTH_PORT = 8092;
const ECHO_PORT = 7000;
const ECHO = `127.0.0.1:${ECHO_PORT}`;
const SERVER_HEALTH = `http://127.0.0.1:${HEALTH_PORT}`;

const NS = 'kube-system';
const SA = 'konnectivity-agent';
const AUDIENCE = 'system:konnectivity-server';

/** One tenant's own credentials: the CA its agents trust and the certificate for its name, its agent CA. */
interface TenantPki {
  name: string;
  serverName: string;
  /** CA of the certificate presented for serverName (the agents' --ca-cert). */
  servingCa: string;
  serving: Pem;
  agentCa: string;
  agent(id: string): Promise<Pem>;
}

async function tenantPki(ws: Workspace, name: string): Promise<TenantPki> {
  const dir = path.join(ws.dir, `${name}-pki`);
  await fs.mkdir(dir);
  const serverName = `${name}.tenants.test`;
  const [servingCa, agentCa] = await Promise.all([
    createCertificateAuthority(`${name}-serving-ca`),
    createCertificateAuthority(`${name}-agents-ca`),
  ]);
  await fs.writeFile(path.join(dir, 'serving-ca.crt'), servingCa.certPem);
  await fs.writeFile(path.join(dir, 'agents-ca.crt'), agentCa.certPem);
  return {
    name,
    serverName,
    servingCa: path.join(dir, 'serving-ca.crt'),
    serving: await writePair(dir, 'serving', await servingCa.issue({ commonName: serverName, dnsNames: [serverName], usage: 'server' })),
    agentCa: path.join(dir, 'agents-ca.crt'),
    agent: async (id) => writePair(dir, `agent-${id}`, await agentCa.issue({ commonName: id, usage: 'client' })),
  };
}

/** The shared server inside the namespace; its /readyz answers once its listeners serve. */
async function startServerIn(
  netns: TenantNetns,
  ws: Workspace,
  yaml: string,
  agentHost = '127.0.0.1',
  pki: Pem = { cert: ws.pki.serverCert, key: ws.pki.serverKey },
): Promise<Child> {
  const file = path.join(ws.dir, 'tenants.yaml');
  await fs.writeFile(file, yaml);
  const server = netns.kanal(
    'shared-server',
    tenantsServerArgs({ file, defaultPair: pki, agentHost, agentPort: AGENT_PORT, healthPort: HEALTH_PORT }),
  );
  await netns.waitStatus(`${SERVER_HEALTH}/readyz`, 200, 20_000, server);
  return server;
}

interface UpstreamAgentIn {
  proc: Child;
  readyz: string;
}

let upstreamAgents = 0;

/** Upstream's proxy-agent inside the namespace, dialling `host` (a name from the hosts file: sent as SNI; an IP: no SNI). */
function upstreamAgentIn(netns: TenantNetns, id: string, o: { host: string; ca: string; cert?: Pem; tokenFile?: string }): UpstreamAgentIn {
  const n = ++upstreamAgents;
  const [health, admin] = [8200 + n, 8400 + n];
  const args = [
    `--proxy-server-host=${o.host}`,
    `--proxy-server-port=${AGENT_PORT}`,
    `--ca-cert=${o.ca}`,
    ...(o.cert ? [`--agent-cert=${o.cert.cert}`, `--agent-key=${o.cert.key}`] : []),
    ...(o.tokenFile ? [`--service-account-token-path=${o.tokenFile}`] : []),
    `--agent-id=${id}`,
    '--health-server-host=127.0.0.1',
    `--health-server-port=${health}`,
    '--admin-bind-address=127.0.0.1',
    `--admin-server-port=${admin}`,
    '--sync-interval=200ms',
    '--sync-interval-cap=1s',
    '--v=1',
  ];
  // Upstream's agent only drains on its first SIGTERM: end it for good.
  const proc = netns.spawn(id, [upstreamBinaries().proxyAgent, ...args], { kill: true });
  return { proc, readyz: `http://127.0.0.1:${health}/readyz` };
}

async function readyUpstreamAgent(netns: TenantNetns, a: UpstreamAgentIn): Promise<void> {
  await netns.waitStatus(a.readyz, 200, 20_000, a.proc);
}

/** CONNECT through a tenant's own socket (its kube-apiserver's way in). */
async function viaSocket(socket: string, address: string): Promise<Socket> {
  return httpConnect(await connectUnix(socket), address, 10_000);
}

async function echoes(open: Promise<Socket>, what: string): Promise<boolean> {
  const s = await open;
  try {
    return await echoRoundTrip(s, Buffer.from(what));
  } finally {
    s.destroy();
  }
}

/** The status a refused CONNECT got (0 when it was not refused, -1 when it failed otherwise). */
async function refusedWith(open: Promise<Socket>): Promise<number> {
  try {
    (await open).destroy();
    return 0;
  } catch (err) {
    return err instanceof ConnectRefused ? err.status : -1;
  }
}

function refusalLine(
  server: Child,
  reason: string,
  match: (l: Record<string, unknown>) => boolean,
  what: string,
): Promise<Record<string, unknown>> {
  return server.waitForLine((l) => l.refusal === reason && match(l), 15_000, `refusal ${reason}: ${what}`);
}

const netnsUnavailable = await netnsUnavailableReason();
const peersUnavailable = netnsUnavailable ?? upstreamUnavailableReason();
if (peersUnavailable) skippedBecause('tenants with upstream agents and token tenants in a network namespace', peersUnavailable);
const peersTest = peersUnavailable ? test.skip : test;

peersTest(
  'tenants: unmodified upstream agents join their tenant by server name (SNI from the hosts file); each kube-apiserver reaches only its own',
  async (t) => {
    const ws = await makeWorkspace(t, 'kanal-tenants-peers-');
    const [gamma, delta] = await Promise.all([tenantPki(ws, 'gamma'), tenantPki(ws, 'delta')]);
    const sockets = { gamma: path.join(ws.dir, 'gamma.sock'), delta: path.join(ws.dir, 'delta.sock') };
    const entry = (p: TenantPki): string => `  - name: ${p.name}
    server-name: [${p.serverName}]
    cluster-cert: ${p.serving.cert}
    cluster-key: ${p.serving.key}
    cluster-ca-cert: ${p.agentCa}
    uds-name: ${path.join(ws.dir, `${p.name}.sock`)}
`;
    const netns = await createTenantNetns(t, ws.dir, [gamma.serverName, delta.serverName]);
    await netns.echo(ECHO_PORT);
    const server = await startServerIn(netns, ws, tenantsFile([entry(gamma), entry(delta)]));

    // Gamma's node: upstream's agent, its tenant's name as --proxy-server-host, a certificate of gamma's agent CA.
    const g1 = upstreamAgentIn(netns, 'gamma-node-1', {
      host: gamma.serverName,
      ca: gamma.servingCa,
      cert: await gamma.agent('gamma-node-1'),
    });
    await readyUpstreamAgent(netns, g1);
    // It verified gamma's certificate for gamma's name, so the server chose it by SNI; the server says so too.
    const accepted = await server.waitForLine(
      (l) => l.msg === 'agent TLS connection accepted' && l.tenant === 'gamma',
      5000,
      "gamma's agent accepted",
    );
    t.regex(String(accepted.identity), /^server name gamma\.tenants\.test, certificate .*CN=gamma-node-1/);
    await server.waitForLine(
      (l) => l.msg === 'agent connected' && l.tenant === 'gamma' && l.agentID === 'gamma-node-1',
      5000,
      'gamma-node-1 connected',
    );

    t.true(
      await echoes(viaSocket(sockets.gamma, ECHO), 'gamma through upstream'),
      "gamma's kube-apiserver reaches the echo backend through gamma's upstream agent",
    );
    t.is(await refusedWith(viaSocket(sockets.delta, ECHO)), 500, "delta's kube-apiserver does not reach gamma's agent (no agent)");

    // Gamma's certificate naming delta (and trusting delta's serving CA): the name selects delta, the certificate is not delta's.
    const intruder = upstreamAgentIn(netns, 'gamma-as-delta', {
      host: delta.serverName,
      ca: delta.servingCa,
      cert: await gamma.agent('gamma-as-delta'),
    });
    const mismatch = await refusalLine(server, 'agent_tenant_mismatch', (l) => l.tenant === 'delta', 'gamma certificate under delta name');
    // Go's TLS client sends a certificate only if the server's CertificateRequest lists its issuer; for delta's
    // name the server asks for delta's agent CA, so gamma's certificate is not even sent (today's answer). Were it
    // sent, the refusal would name gamma's CA instead; either way delta refuses it.
    t.regex(String(mismatch.reason), /^(no client certificate presented|issued by the CA of tenant "gamma")$/, JSON.stringify(mismatch));
    t.not((await netns.get(intruder.readyz)).status, 200, 'the intruder holds no tunnel');
    await intruder.proc.kill();
    t.is(await refusedWith(viaSocket(sockets.delta, ECHO)), 500, 'still no agent of delta');

    // Delta's own upstream agent: delta is served, gamma is untouched.
    const d1 = upstreamAgentIn(netns, 'delta-node-1', {
      host: delta.serverName,
      ca: delta.servingCa,
      cert: await delta.agent('delta-node-1'),
    });
    await readyUpstreamAgent(netns, d1);
    t.true(await echoes(viaSocket(sockets.delta, ECHO), 'delta through upstream'), "delta's kube-apiserver reaches delta's upstream agent");
    t.true(await echoes(viaSocket(sockets.gamma, ECHO), 'gamma again'), 'gamma still served');

    // Without a name (an IP address: Go sends no SNI) the default certificate is presented and gamma's CA recognises the agent.
    const g2 = upstreamAgentIn(netns, 'gamma-node-2', { host: '127.0.0.1', ca: ws.pki.caCert, cert: await gamma.agent('gamma-node-2') });
    await readyUpstreamAgent(netns, g2);
    const byCa = await server.waitForLine(
      (l) => l.msg === 'agent TLS connection accepted' && l.tenant === 'gamma' && /CN=gamma-node-2/.test(String(l.identity)),
      5000,
      'gamma-node-2 accepted',
    );
    t.regex(String(byCa.identity), /^certificate /, 'recognised by its certificate, not by a name');

    const m = await netns.metrics(`${SERVER_HEALTH}/metrics`);
    t.is(m.get('kanal_server_agents{tenant="gamma"}'), 2);
    t.is(m.get('kanal_server_agents{tenant="delta"}'), 1);
    t.true((m.get('kanal_refusals_total{reason="agent_tenant_mismatch"}') ?? 0) >= 1, 'the crossing is counted');
    t.true(
      server.jsonLines().every((l) => !(l.msg === 'agent connected' && l.agentID === 'gamma-as-delta')),
      'the intruder was never admitted',
    );
    t.true(g1.proc.running() && g2.proc.running() && d1.proc.running());
  },
);

/** A projected token of cluster `k` for `pod` (the agents' account and audience), in a file. */
async function tokenFile(ws: Workspace, k: KubeFixture, pod: string): Promise<{ file: string; token: string }> {
  const token = k.api.tokens.issueServiceAccountToken({
    namespace: NS,
    serviceAccount: SA,
    audiences: [AUDIENCE],
    pod: { name: pod },
    node: { name: `node-of-${pod}` },
  });
  const file = path.join(ws.dir, `${pod}.token`);
  await fs.writeFile(file, token);
  return { file, token };
}

function issuerOf(token: string): string {
  const claims = JSON.parse(Buffer.from(token.split('.')[1], 'base64url').toString('utf8')) as { iss?: unknown };
  return String(claims.iss);
}

const reviews = (k: KubeFixture): number => k.api.requests.filter((r) => r.resource === 'tokenreviews').length;

peersTest(
  "tenants: a token tenant is reviewed by its own kube-apiserver; cluster A's token named for tenant B (B's server name, or the issuer both share) is refused by B's API and never shown to A's",
  async (t) => {
    const ws = await makeWorkspace(t, 'kanal-tenants-tokens-');
    const [alpha, beta] = await Promise.all([tenantPki(ws, 'alpha'), tenantPki(ws, 'beta')]);
    const rbac = await shippedRbac();
    const [kA, kB] = await Promise.all([startKubeApi(t, { rbac }), startKubeApi(t, { rbac })]);
    const kubeconfig = async (k: KubeFixture, name: string): Promise<string> =>
      k.api.writeKubeconfig(path.join(ws.dir, `${name}.kubeconfig`), { user: 'system:konnectivity-server', auth: 'certificate' });
    const [kubeconfigA, kubeconfigB] = await Promise.all([kubeconfig(kA, 'alpha'), kubeconfig(kB, 'beta')]);

    // Both clusters issue tokens with the same `iss` (the stand-in's, kubeadm's default too): only one tenant may claim it.
    const probeA = await tokenFile(ws, kA, 'probe-a');
    const probeB = await tokenFile(ws, kB, 'probe-b');
    const iss = issuerOf(probeA.token);
    t.is(issuerOf(probeB.token), iss, 'the two clusters share one issuer: the claim cannot tell them apart, only the review can');

    const entry = (p: TenantPki, kc: string, extra = ''): string => `  - name: ${p.name}
    server-name: [${p.serverName}]
    cluster-cert: ${p.serving.cert}
    cluster-key: ${p.serving.key}
    agent-namespace: ${NS}
    agent-service-account: ${SA}
    authentication-audience: ${AUDIENCE}
    kubeconfig: ${kc}
    uds-name: ${path.join(ws.dir, `${p.name}.sock`)}
${extra}`;
    const sockets = { alpha: path.join(ws.dir, 'alpha.sock'), beta: path.join(ws.dir, 'beta.sock') };
    const netns = await createTenantNetns(t, ws.dir, [alpha.serverName, beta.serverName], ['127.0.0.2']);
    // The API stand-ins listen on this namespace's 127.0.0.1; their kubeconfigs name that address.
    for (const k of [kA, kB]) await netns.reachRootPort(Number(new URL(k.api.url).port));
    await netns.echo(ECHO_PORT);
    // Default certificate (connections without SNI): valid for 127.0.0.2 too, where the issuer-only agent dials.
    const defaults = await writeThrowawayPki(path.join(ws.dir, 'default-pki'), { serverIps: ['127.0.0.2'] });
    const server = await startServerIn(
      netns,
      ws,
      tenantsFile([entry(alpha, kubeconfigA), entry(beta, kubeconfigB, `    token-issuer: ${iss}\n`)]),
      '0.0.0.0', // the namespace has nothing but its loopback: 127.0.0.1 and 127.0.0.2
      { cert: defaults.serverCert, key: defaults.serverKey },
    );

    // Alpha's node: upstream's agent with alpha's token and alpha's name, no certificate (the usual token DaemonSet).
    const a1 = upstreamAgentIn(netns, 'alpha-node-1', {
      host: alpha.serverName,
      ca: alpha.servingCa,
      tokenFile: (await tokenFile(ws, kA, 'alpha-node-1')).file,
    });
    await readyUpstreamAgent(netns, a1);
    const connected = await server.waitForLine((l) => l.msg === 'agent connected' && l.tenant === 'alpha', 5000, 'alpha-node-1 connected');
    t.regex(
      String(connected.credential),
      /system:serviceaccount:kube-system:konnectivity-agent pod alpha-node-1/,
      "alpha's API vouched for the pod",
    );
    t.true(reviews(kA) >= 1, "alpha's API reviewed alpha's agent");
    t.is(reviews(kB), 0, "beta's API saw nothing of alpha's agent");
    t.true(await echoes(viaSocket(sockets.alpha, ECHO), 'alpha through its token agent'));
    t.is(await refusedWith(viaSocket(sockets.beta, ECHO)), 500, "beta's kube-apiserver does not reach alpha's agent");

    // Attack 1: a valid token of alpha presented under beta's server name.
    const reviewsA = reviews(kA);
    const bySni = upstreamAgentIn(netns, 'alpha-token-as-beta', {
      host: beta.serverName,
      ca: beta.servingCa,
      tokenFile: (await tokenFile(ws, kA, 'thief-1')).file,
    });
    const refusedBySni = await refusalLine(
      server,
      'agent_token_rejected',
      (l) => l.tenant === 'beta' && /^127\.0\.0\.1:/.test(String(l.peer)),
      'by SNI',
    );
    // Beta's API (same issuer, its own signing key) is the one that said no.
    t.regex(String(refusedBySni.reason), /did not authenticate the token: .*square\/go-jose: error in cryptographic primitive/);
    t.true(reviews(kB) >= 1, "beta's API reviewed the token named for beta");
    t.not((await netns.get(bySni.readyz)).status, 200);
    await bySni.proc.kill();

    // Attack 2: another valid token of alpha with no server name (an IP address): its `iss` names beta, whose API decides.
    const reviewsB = reviews(kB);
    const byIssuer = upstreamAgentIn(netns, 'alpha-token-by-iss', {
      host: '127.0.0.2',
      ca: defaults.caCert,
      tokenFile: (await tokenFile(ws, kA, 'thief-2')).file,
    });
    const refusedByIssuer = await refusalLine(
      server,
      'agent_token_rejected',
      (l) => l.tenant === 'beta' && /^127\.0\.0\.2:/.test(String(l.peer)),
      'by issuer',
    );
    t.regex(String(refusedByIssuer.reason), /did not authenticate the token: .*square\/go-jose: error in cryptographic primitive/);
    const noSni = await server.waitForLine(
      (l) => l.msg === 'agent TLS connection accepted' && /^127\.0\.0\.2:/.test(String(l.peer)),
      5000,
      'the no-SNI connection',
    );
    t.is(noSni.identity, 'a token to name its tenant', 'no name and no certificate: the token names the tenant');
    t.true(reviews(kB) > reviewsB, "beta's API reviewed the token its issuer named for beta");
    t.not((await netns.get(byIssuer.readyz)).status, 200);
    await byIssuer.proc.kill();
    t.is(reviews(kA), reviewsA, "alpha's API never saw a review for beta's streams");

    // Beta's own token agent by name: admitted by beta's API; beta's kube-apiserver now reaches it.
    const b1 = upstreamAgentIn(netns, 'beta-node-1', {
      host: beta.serverName,
      ca: beta.servingCa,
      tokenFile: (await tokenFile(ws, kB, 'beta-node-1')).file,
    });
    await readyUpstreamAgent(netns, b1);
    t.true(await echoes(viaSocket(sockets.beta, ECHO), 'beta through its token agent'));
    t.is(reviews(kA), reviewsA, "alpha's API still saw nothing of beta's");

    const m = await netns.metrics(`${SERVER_HEALTH}/metrics`);
    t.true((m.get('kanal_refusals_total{reason="agent_token_rejected",tenant="beta"}') ?? 0) >= 2, 'both attacks counted under beta');
    t.is(m.get('kanal_refusals_total{reason="agent_token_rejected",tenant="alpha"}') ?? 0, 0, 'nothing refused under alpha');
    t.is(m.get('kanal_server_agents{tenant="alpha"}'), 1);
    t.is(m.get('kanal_server_agents{tenant="beta"}'), 1);
    t.true(
      server.jsonLines().every((l) => !(l.msg === 'agent connected' && /^alpha-token/.test(String(l.agentID)))),
      'no attacker was admitted',
    );
    t.true(a1.proc.running());
  },
);

interface RootServer extends Child {
  healthPort: number;
  agentPort: number;
}

async function startRootServer(t: ExecutionContext, ws: Workspace, yaml: string): Promise<RootServer> {
  const file = path.join(ws.dir, 'tenants.yaml');
  await fs.writeFile(file, yaml);
  return startTenantsServer(t, {
    file,
    defaultPair: { cert: ws.pki.serverCert, key: ws.pki.serverKey },
    name: 'shared-server',
    logFile: path.join(ws.dir, 'shared-server.log'),
    ready: 'readyz',
  });
}

/** What a client of a node-side listener gets: the echo of its bytes, or the connection closed. */
async function nodeDial(host: string, port: number, what: string): Promise<'echoed' | 'closed'> {
  const s = await new Promise<Socket>((resolve, reject) => {
    const c = connect({ host, port });
    c.once('connect', () => resolve(c));
    c.once('error', reject);
  });
  s.on('error', () => undefined);
  const closed = waitClosed(s, 10_000).then(() => 'closed' as const);
  const data = Buffer.from(what);
  const echoed = new Promise<'echoed'>((resolve) => {
    let got = Buffer.alloc(0);
    s.on('data', (d: Buffer) => {
      got = Buffer.concat([got, d]);
      if (got.equals(data)) resolve('echoed');
    });
  });
  await writeAll(s, data).catch(() => undefined);
  try {
    return await Promise.race([echoed, closed]);
  } finally {
    s.destroy();
  }
}

test("tenants: a node of tenant a asking for tenant b's allowed destination is refused and counted under a; a's own destination and b's node to b's destination work", async (t) => {
  const ws = await makeWorkspace(t, 'kanal-tenants-node-');
  const [a, b] = await Promise.all([tenantPki(ws, 'a'), tenantPki(ws, 'b')]);
  const [x, y] = await Promise.all([startEchoBackend(t), startEchoBackend(t)]);
  // Recognised by their agent CA (no SNI): a may dial Y, b may dial X.
  const entry = (p: TenantPki, allowed: string): string => `  - name: ${p.name}
    cluster-ca-cert: ${p.agentCa}
    uds-name: ${path.join(ws.dir, `${p.name}.sock`)}
    allowed-destination: [${allowed}]
`;
  const server = await startRootServer(t, ws, tenantsFile([entry(a, y.address), entry(b, x.address)]));

  const aToX = await freePort('127.0.0.2');
  let aToY = await freePort('127.0.0.2');
  for (let i = 0; i < 5 && aToY === aToX; i++) aToY = await freePort('127.0.0.2');
  const bToX = await freePort('127.0.0.3');
  const aCred = await a.agent('a-node-1');
  await startAgent(t, ws, server, {
    agentID: 'a-node-1',
    cert: 'none',
    extraArgs: [
      '--agent-cert',
      aCred.cert,
      '--agent-key',
      aCred.key,
      '--bind-address',
      '127.0.0.2',
      '--bind-interface-type',
      'none',
      '--target',
      `${aToX}:${x.address}`,
      '--target',
      `${aToY}:${y.address}`,
    ],
  });
  const bCred = await b.agent('b-node-1');
  await startAgent(t, ws, server, {
    agentID: 'b-node-1',
    cert: 'none',
    extraArgs: [
      '--agent-cert',
      bCred.cert,
      '--agent-key',
      bCred.key,
      '--bind-address',
      '127.0.0.3',
      '--bind-interface-type',
      'none',
      '--target',
      `${bToX}:${x.address}`,
    ],
  });

  t.is(await nodeDial('127.0.0.2', aToX, 'a wants X'), 'closed', "a's node does not reach b's destination");
  const refused = await refusalLine(server, 'destination_not_allowed', (l) => l.tenant === 'a', "a's dial to X");
  t.is(refused.agentID, 'a-node-1');
  t.regex(JSON.stringify(refused), new RegExp(x.address.replace(/\./g, '\\.')));
  t.is(x.accepted(), 0, 'X never saw a connection from a');

  t.is(await nodeDial('127.0.0.2', aToY, 'a wants Y'), 'echoed', "a's node reaches a's destination");
  t.is(y.accepted(), 1);
  t.is(await nodeDial('127.0.0.3', bToX, 'b wants X'), 'echoed', "b's node reaches b's destination");
  t.is(x.accepted(), 1);

  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_refusals_total{reason="destination_not_allowed",tenant="a"}'), 1, 'counted once, under a');
  t.is(m.get('kanal_refusals_total{reason="destination_not_allowed",tenant="b"}') ?? 0, 0, 'nothing counted under b');
});
