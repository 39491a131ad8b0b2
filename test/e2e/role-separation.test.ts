/**
 * Roles never mix (docs/trust-model.md): an agent's certificate never opens the
 * frontend and the kube-apiserver's never registers as an agent. The shipped
 * TCP example runs as shipped (separate CAs); one CA for both roles refuses
 * to start unless each role is pinned, and pinned roles are enforced.
 */
import test, { type ExecutionContext } from 'ava';
import { X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createCertificateAuthority } from '../../kit/pki/certificate-authority.js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { ClientRoles, parseEku, parseSubjectPattern, sharedTrust } from '../../src/server/identity/client-roles.js';
import {
  freePort,
  httpConnect,
  makeWorkspace,
  runCli,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  tlsToFrontend,
  waitClosed,
  warnLine,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { agentChannel, connectRawAgent } from '../helpers/raw-agent.js';
import { parseEnvFile, splitWords } from '../helpers/packaging.js';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');

/**
 * deploy/server-tcp.env.example's flags with /etc/kanal/ files taken from the
 * workspace's PKI (same names) and without its fixed --server-port.
 */
function shippedTcpExample(ws: Workspace): string[] {
  const env = parseEnvFile(fs.readFileSync(path.join(REPO, 'deploy/server-tcp.env.example'), 'utf8'));
  const words = splitWords(env.get('KANAL_SERVER_FLAGS') ?? '');
  const port = words.indexOf('--server-port');
  if (port >= 0) words.splice(port, 2);
  return words.map((w) => (w.startsWith('/etc/kanal/') ? path.join(ws.pki.dir, path.basename(w)) : w));
}

/** Flags that keep a test's server on loopback and free ports (later values win). */
async function loopbackPorts(): Promise<string[]> {
  return [
    '--server-bind-address',
    '127.0.0.1',
    '--server-port',
    String(await freePort()),
    '--agent-bind-address',
    '127.0.0.1',
    '--agent-port',
    String(await freePort()),
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    String(await freePort()),
  ];
}

/** Opens a TLS connection to the frontend with `credential` and expects the server to drop it. */
async function frontendRefuses(server: KanalServerProcess, ws: Workspace, credential: { cert: string; key: string }): Promise<void> {
  // The server checks the certificate after the handshake; the client may see the close first.
  const s = await tlsToFrontend(server, ws, { credential }).catch(() => undefined);
  if (!s) return;
  s.on('error', () => undefined);
  s.write('CONNECT 127.0.0.1:9 HTTP/1.1\r\nHost: x\r\n\r\n');
  await waitClosed(s, 5000);
}

/** Opens a Connect stream with `credential` and expects it refused. */
async function agentRefused(
  t: ExecutionContext,
  ws: Workspace,
  server: KanalServerProcess,
  credential: { cert: string; key: string },
): Promise<void> {
  await t.throwsAsync(connectRawAgent(t, ws, server, credential, 'not-an-agent', agentChannel(t, ws, server, credential)));
}

test('the shipped TCP example (separate CAs) runs; an agent certificate cannot open its frontend, the KAS certificate cannot register as an agent', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { frontend: 'tcp', extraArgs: shippedTcpExample(ws) });
  await startAgent(t, ws, server, { agentID: 'node-1' });
  // The KAS gets through.
  const kas = await httpConnect(await tlsToFrontend(server, ws), backend.address);
  kas.destroy();
  // node-1's certificate on the frontend: refused at the TLS layer.
  await frontendRefuses(server, ws, await issueAgentCertificate(ws.pki, 'node-1'));
  // The KAS's certificate on the agent port: refused too.
  await agentRefused(t, ws, server, { cert: ws.pki.frontendClientCert, key: ws.pki.frontendClientKey });
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_refusals_total{reason="frontend_certificate"}'), 1);
  t.is(m.get('kanal_refusals_total{reason="agent_certificate"}'), 1);
});

test('one CA for both roles (the old example) and no pins: the server refuses to start and says how to fix it', async (t) => {
  const ws = await makeWorkspace(t);
  const flags = shippedTcpExample(ws).map((w) => (w === ws.pki.frontendCaCert ? ws.pki.caCert : w));
  const r = await runCli(['server', ...flags, ...(await loopbackPorts())]);
  t.is(r.code, 1);
  t.regex(r.stderr, /--cluster-ca-cert and --server-ca-cert share a CA \(both trust CN=kanal-throwaway-ca\)/);
  t.regex(r.stderr, /--frontend-client-subject .*--agent-client-subject/);
  t.regex(r.stderr, /docs\/trust-model\.md/);
  // Pinning one role only is not enough; pinning both to the same subject is refused too.
  const one = await runCli(['server', ...flags, ...(await loopbackPorts()), '--frontend-client-subject', 'CN=kube-apiserver']);
  t.is(one.code, 1);
  const same = await runCli([
    'server',
    ...flags,
    ...(await loopbackPorts()),
    '--frontend-client-subject',
    'CN=x',
    '--agent-client-subject',
    'CN=x',
  ]);
  t.is(same.code, 1);
  t.regex(same.stderr, /pinned to the same subject or EKU/);
});

test('one CA with both roles pinned: each certificate works in its role only', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  // The KAS's client certificate from the agents' CA, as operators with one CA have it.
  const kasCred = await issueAgentCertificate(ws.pki, 'kube-apiserver');
  const server = await startServer(t, ws, {
    frontend: 'tcp',
    extraArgs: ['--server-ca-cert', ws.pki.caCert, '--frontend-client-subject', 'CN=kube-apiserver', '--agent-client-subject', 'CN=node-*'],
  });
  await startAgent(t, ws, server, { agentID: 'node-1' });
  const kas = await httpConnect(await tlsToFrontend(server, ws, { credential: kasCred }), backend.address);
  kas.destroy();
  await frontendRefuses(server, ws, await issueAgentCertificate(ws.pki, 'node-1'));
  await agentRefused(t, ws, server, kasCred);
  // Neither role's pin: refused on both ports.
  const stray = await issueAgentCertificate(ws.pki, 'monitoring');
  await frontendRefuses(server, ws, stray);
  await agentRefused(t, ws, server, stray);
  const m = await scrapeMetrics(server.healthPort);
  t.is(m.get('kanal_refusals_total{reason="frontend_role"}'), 2);
  t.is(m.get('kanal_refusals_total{reason="agent_role"}'), 2);
  const line = server.logLines().find(warnLine('refused frontend connection: not a frontend credential'));
  t.regex(String(line?.reason), /CN=node-1 .*pinned to the agent role \(--agent-client-subject CN=node-\*\)/);
  const agentLine = server.logLines().find(warnLine('refused agent connection: not an agent credential'));
  t.regex(String(agentLine?.reason), /CN=kube-apiserver .*pinned to the frontend role/);
});

test("pins: subject attributes (exact or prefix) and extended key usages; the other role's pin excludes", async (t) => {
  const ca = await createCertificateAuthority('one-ca');
  const AGENT_EKU = '1.3.6.1.4.1.55555.1';
  const cert = async (cn: string, eku?: string): Promise<X509Certificate> =>
    new X509Certificate((await ca.issue({ commonName: cn, usage: 'client', extraExtendedKeyUsages: eku ? [eku] : [] })).certPem);
  const byEku = new ClientRoles(
    { subjects: [], ekus: [parseEku(AGENT_EKU)] },
    { subjects: [parseSubjectPattern('CN=kube-apiserver')], ekus: [] },
  );
  t.is(byEku.refusal(await cert('node-7', AGENT_EKU), 'agent'), undefined);
  t.regex(byEku.refusal(await cert('node-7'), 'agent') ?? '', /matches none of --agent-client-eku 1\.3\.6\.1\.4\.1\.55555\.1/);
  t.is(byEku.refusal(await cert('kube-apiserver'), 'frontend'), undefined);
  t.regex(byEku.refusal(await cert('kube-apiserver', AGENT_EKU), 'frontend') ?? '', /pinned to the agent role/);
  const bySubject = new ClientRoles({ subjects: [parseSubjectPattern('cn=node-*')], ekus: [] }, { subjects: [], ekus: [] });
  t.is(bySubject.refusal(await cert('node-1'), 'agent'), undefined);
  t.truthy(bySubject.refusal(await cert('nodes'), 'agent'));
  t.truthy(bySubject.refusal(await cert('node-1'), 'frontend'), 'an agent pin excludes the frontend');
  t.throws(() => parseSubjectPattern('kube-apiserver'), { message: /want ATTRIBUTE=VALUE/ });
  t.throws(() => parseEku('clientAuth'), { message: /OID/ });
  // Trust: the same CA in both bundles is found, also among other certificates.
  const other = await createCertificateAuthority('other-ca');
  t.is(sharedTrust(ca.certPem, other.certPem), undefined);
  t.regex(sharedTrust(`${other.certPem}\n${ca.certPem}`, ca.certPem) ?? '', /both trust CN=one-ca/);
});

test('malformed role pins exit 2 naming the flag', async (t) => {
  const base = ['server', '--dry-run', '--uds-name', '/tmp/x.sock', '--cluster-cert', 'a', '--cluster-key', 'b', '--cluster-ca-cert', 'c'];
  const subject = await runCli([...base, '--agent-client-subject', 'node-1']);
  t.is(subject.code, 2);
  t.regex(subject.stderr, /--agent-client-subject "node-1": want ATTRIBUTE=VALUE/);
  const eku = await runCli([...base, '--frontend-client-eku', 'serverAuth']);
  t.is(eku.code, 2);
  t.regex(eku.stderr, /--frontend-client-eku "serverAuth"/);
  const bound = await runCli([...base, '--max-agents-per-credential', '0']);
  t.is(bound.code, 2);
  t.regex(bound.stderr, /--max-agents-per-credential must be a whole number of at least 1, got 0/);
});
