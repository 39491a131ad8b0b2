/**
 * A running agent that cannot open its tunnel says why and which flag to
 * change, on /readyz and in its log (src/agent/connect-diagnosis.ts, shared
 * with `kanal agent --check`): an untrusted server certificate, a name
 * mismatch (a DNS name and an IP address), a client certificate refused, no
 * credential, a token refused, connection refused, no answer, a port that
 * does not speak TLS, and a TLS server without HTTP/2 in ALPN. Each cause is
 * logged once however often the agent retries. Real server and agent
 * processes, real TLS, loopback only.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import path from 'node:path';
import tls from 'node:tls';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  fileScope,
  freePort,
  httpGet,
  makeWorkspace,
  startAgent,
  startServer,
  waitUntil,
  levelAtLeast,
  type AgentSpec,
  type KanalAgentProcess,
  type KanalServerProcess,
  type LogLine,
  type Workspace,
} from '../helpers/kanal-processes.js';

const scope = fileScope(test);
let ws: Workspace;
let server: KanalServerProcess;

test.before(async () => {
  ws = await makeWorkspace(scope, 'kanal-connect-errors-');
  server = await startServer(scope, ws);
});

const attempts = (agent: KanalAgentProcess): LogLine[] => agent.logLines().filter((l) => l.msg === 'connect attempt failed');
const warnings = (agent: KanalAgentProcess): LogLine[] =>
  agent.logLines().filter((l) => levelAtLeast(l.level, 'warn') && l.msg.startsWith('cannot connect to proxy server'));

/**
 * Starts an agent that cannot connect, and checks that /readyz and its one
 * warning say `cause` in words matching `says`, after three attempts.
 */
async function diagnosed(
  t: ExecutionContext,
  agentPort: number,
  spec: AgentSpec & { agentID: string },
  cause: string,
  says: RegExp,
): Promise<void> {
  const agent = await startAgent(t, ws, { agentPort }, { ...spec, waitReady: false });
  let body: string;
  const deadline = Date.now() + 20_000;
  for (;;) {
    const r = await httpGet(agent.readyzUrl());
    body = r.body;
    if ((r.status === 503 && says.test(body)) || Date.now() > deadline) break;
    await sleep(100);
  }
  t.regex(body, says, `/readyz of ${spec.agentID} names the cause`);
  t.regex(body, /^not ready: no tunnel to a proxy server \(last error: /);
  t.notRegex(body, /pending stream has been canceled|failed\)\n$/, 'no bare transport words');
  await waitUntil(() => attempts(agent).length >= 3, `${spec.agentID} retried`, 20_000);
  const warned = warnings(agent);
  t.is(warned.length, 1, `one warning for ${attempts(agent).length} attempts: ${JSON.stringify(warned)}`);
  t.is(warned[0]?.cause, cause);
  t.regex(String(warned[0]?.err), says);
  t.true(agent.running(), 'the agent keeps retrying');
  await agent.stop();
}

test('a server certificate --ca-cert does not verify names --ca-cert', async (t) => {
  await diagnosed(
    t,
    server.agentPort,
    { agentID: 'wrong-ca', extraArgs: ['--ca-cert', ws.pki.rogueCaCert] },
    'untrusted',
    /the server certificate is not trusted \(.*SELF_SIGNED_CERT_IN_CHAIN\): --ca-cert must hold the CA that signed the server's certificate/,
  );
});

test('a name the certificate does not carry names --tls-server-name and the names it carries', async (t) => {
  await diagnosed(
    t,
    server.agentPort,
    { agentID: 'wrong-name', extraArgs: ['--tls-server-name', 'kanal.example'] },
    'name-mismatch',
    /not valid for kanal\.example \(it carries DNS:localhost, IP Address:127\.0\.0\.1.*\); set --tls-server-name to a name it carries/,
  );
});

test('an IP address the certificate does not carry says it must be an IP SAN', async (t) => {
  await diagnosed(
    t,
    server.agentPort,
    { agentID: 'wrong-ip', extraArgs: ['--tls-server-name', '10.1.2.3'] },
    'name-mismatch',
    /not valid for 10\.1\.2\.3 .*IP SANs only, so the certificate must carry IP 10\.1\.2\.3, or set --tls-server-name/,
  );
});

test("a client certificate the server refuses names the server's --cluster-ca-cert", async (t) => {
  await diagnosed(
    t,
    server.agentPort,
    { agentID: 'rogue', cert: 'rogue' },
    'credentials-refused',
    /closed the connection right after the TLS handshake: it refused the agent certificate: is --agent-cert signed by a CA in the server's --cluster-ca-cert/,
  );
});

test('no credential at all names --agent-cert and --service-account-token-path', async (t) => {
  await diagnosed(
    t,
    server.agentPort,
    { agentID: 'no-cert', cert: 'none' },
    'credentials-refused',
    /it requires a client certificate \(--agent-cert, --agent-key\) or a token \(--service-account-token-path\)/,
  );
});

test('a token refused by a token-authenticating server says so with its reason', async (t) => {
  // The server refuses a stream without a token before it asks the API anything: a kubeconfig to nowhere suffices.
  const kubeconfig = path.join(ws.dir, 'nowhere.kubeconfig');
  fs.writeFileSync(
    kubeconfig,
    'apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]\n' +
      'users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n',
  );
  const tokens = await startServer(t, ws, {
    name: 'token-server',
    clusterCa: false,
    extraArgs: [
      '--agent-namespace',
      'kube-system',
      '--agent-service-account',
      'konnectivity-agent',
      '--authentication-audience',
      'aud',
    ].concat(['--kubeconfig', kubeconfig]),
  });
  await diagnosed(
    t,
    tokens.agentPort,
    { agentID: 'no-token', cert: 'none' },
    'agent-refused',
    /the server refused the agent: no service account token: .*--service-account-token-path/,
  );
});

test('connection refused names --proxy-server-host and --proxy-server-port', async (t) => {
  await diagnosed(
    t,
    await freePort(),
    { agentID: 'refused' },
    'refused',
    /connection refused, nothing listens there: check --proxy-server-host and --proxy-server-port \(the server's --agent-port\)/,
  );
});

/** A TCP listener that accepts and never answers (a black hole behind a firewall's accept), closed by the test. */
async function silentListener(t: ExecutionContext): Promise<number> {
  const sockets = new Set<net.Socket>();
  const silent = net.createServer((s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    for (const s of sockets) s.destroy();
    silent.close();
  });
  return (silent.address() as AddressInfo).port;
}

test('no answer names --connect-timeout and the address flags', async (t) => {
  await diagnosed(
    t,
    await silentListener(t),
    { agentID: 'silent', extraArgs: ['--connect-timeout', '300ms'] },
    'timeout',
    /no answer within 300 ms \(--connect-timeout\): a firewall, a wrong --proxy-server-host or --proxy-server-port/,
  );
});

test('a port that does not speak TLS (the server health port) names --proxy-server-port', async (t) => {
  await diagnosed(
    t,
    server.healthPort,
    { agentID: 'plain-http' },
    'not-tls',
    /does not speak TLS: is --proxy-server-port the server's --agent-port/,
  );
});

test('a TLS server without HTTP/2 in ALPN says so', async (t) => {
  const front = tls.createServer({ cert: fs.readFileSync(ws.pki.serverCert), key: fs.readFileSync(ws.pki.serverKey) }, (s) => s.destroy());
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve));
  t.teardown(() => front.close());
  await diagnosed(
    t,
    (front.address() as AddressInfo).port,
    { agentID: 'no-h2' },
    'alpn',
    /the server did not agree on HTTP\/2 in ALPN \(server did not negotiate HTTP\/2 via ALPN \(got false\)\)/,
  );
});
