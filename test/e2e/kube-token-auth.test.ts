/**
 * Service account token authentication wired into `kanal server` and
 * `kanal agent`, with real CLI processes and the
 * Kubernetes API stand-in (TokenReview through @kubernetes/client-node, the
 * RBAC in deploy/rbac/): a valid token opens a tunnel; every bad token, and an
 * API that is down or slow, is refused with the reason on both sides while the
 * agents already admitted keep working; a rotated token file is read afresh.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  echoesThrough,
  makeWorkspace,
  restartServer,
  runCli,
  scrapeMetrics,
  startAgent,
  startEchoBackend,
  startServer,
  waitStatus,
  warnLine,
  type Backend,
  type KanalAgentProcess,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { shippedRbac, startKubeApi, waitUntil, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import type { ServiceAccountTokenSpec } from '../helpers/kube-stand-in/tokens.js';

const NS = 'kube-system';
const SA = 'konnectivity-agent';
const AUDIENCE = 'system:konnectivity-server';
const TOKEN_FLAGS = ['--agent-namespace', NS, '--agent-service-account', SA, '--authentication-audience', AUDIENCE];

async function tokenServer(t: ExecutionContext, ws: Workspace, k: KubeFixture, extraArgs: string[] = []): Promise<KanalServerProcess> {
  const kubeconfig = await k.api.writeKubeconfig(path.join(ws.dir, 'server.kubeconfig'), {
    user: 'system:konnectivity-server',
    auth: 'certificate',
  });
  // As upstream's token deployments: no client CA on the agent port.
  return startServer(t, ws, { clusterCa: false, extraArgs: [...TOKEN_FLAGS, '--kubeconfig', kubeconfig, ...extraArgs] });
}

/** A projected token for `pod` (default: the right account and audience) in a file of its own. */
async function tokenFile(
  ws: Workspace,
  k: KubeFixture,
  pod: string,
  spec: Partial<ServiceAccountTokenSpec> = {},
): Promise<{ file: string; token: string }> {
  const token = k.api.tokens.issueServiceAccountToken({
    namespace: NS,
    serviceAccount: SA,
    audiences: [AUDIENCE],
    pod: { name: pod },
    node: { name: `node-of-${pod}` },
    ...spec,
  });
  const file = path.join(ws.dir, `${pod}.token`);
  await fs.writeFile(file, token);
  return { file, token };
}

function tokenAgent(
  t: ExecutionContext,
  ws: Workspace,
  server: KanalServerProcess,
  agentID: string,
  file: string | undefined,
  waitReady = true,
): Promise<KanalAgentProcess> {
  return startAgent(t, ws, server, { agentID, cert: 'none', waitReady, extraArgs: file ? ['--service-account-token-path', file] : [] });
}

async function assertTunnel(t: ExecutionContext, server: KanalServerProcess, backend: Backend, what: string): Promise<void> {
  t.true(await echoesThrough(server, backend.address, Buffer.from(what)), what);
}

/** The agent logs the server's reason; the server warns and counts the refusal. */
async function assertRefused(
  t: ExecutionContext,
  server: KanalServerProcess,
  agent: KanalAgentProcess,
  kind: string,
  reason: RegExp,
): Promise<void> {
  const line = await agent.waitForLog(
    warnLine('cannot connect to proxy server', (l) => reason.test(String(l.err))),
    20_000,
    `the ${kind} refusal`,
  );
  t.regex(String(line.err), reason, `${agent.agentID} logs why`);
  await server.waitForLog(warnLine(`refused agent stream: service account token ${kind}`), 10_000, `the ${kind} warning`);
  const metric = `kanal_refusals_total{reason="agent_token_${kind.replace(/-/g, '_')}"}`;
  t.true(((await scrapeMetrics(server.healthPort)).get(metric) ?? 0) >= 1, metric);
}

test('a valid token opens a tunnel; wrong audience, account, namespace, expired, unknown or no token are refused with the reason, and the admitted agent keeps working', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-token-');
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const backend = await startEchoBackend(t);
  const server = await tokenServer(t, ws, k);
  const good = await tokenAgent(t, ws, server, 'pod-good', (await tokenFile(ws, k, 'pod-good')).file);
  await waitStatus(server.readyzUrl(), 200, 10_000);
  await assertTunnel(t, server, backend, 'through the token agent');
  const connected = await server.waitForLog((l) => l.msg === 'agent connected' && l.agentID === 'pod-good', 5000, 'the admission');
  t.regex(
    String(connected.credential),
    /system:serviceaccount:kube-system:konnectivity-agent pod pod-good on node node-of-pod-good/,
    'the credential is the pod the token is bound to',
  );

  const cases: Array<[string, Partial<ServiceAccountTokenSpec> | 'unknown' | 'none', string, RegExp]> = [
    ['wrong-aud', { audiences: ['https://kubernetes.default.svc.cluster.local'] }, 'wrong-audience', /system:konnectivity-server/],
    ['wrong-sa', { serviceAccount: 'default' }, 'wrong-identity', /service account default in namespace kube-system/],
    ['wrong-ns', { namespace: 'default' }, 'wrong-identity', /namespace default/],
    ['expired', { expiresInSeconds: -60 }, 'rejected', /did not authenticate/],
    ['unknown', 'unknown', 'rejected', /did not authenticate/],
    ['no-token', 'none', 'no-token', /--service-account-token-path/],
  ];
  for (const [pod, spec, kind, reason] of cases) {
    let file: string | undefined;
    if (spec === 'unknown') {
      file = path.join(ws.dir, `${pod}.token`);
      await fs.writeFile(file, 'not-a-token-the-api-knows');
    } else if (spec !== 'none') {
      file = (await tokenFile(ws, k, pod, spec)).file;
    }
    const agent = await tokenAgent(t, ws, server, pod, file, false);
    await assertRefused(t, server, agent, kind, reason);
    t.is((await fetch(agent.readyzUrl())).status, 503, `${pod} has no tunnel`);
  }
  t.true(
    server.logLines().every((l) => !l.msg.includes('agent connected') || l.agentID === 'pod-good'),
    'no refused agent was ever admitted',
  );
  t.true(good.running());
  await assertTunnel(t, server, backend, 'the admitted agent still works');
});

test('an API that is down or slow refuses new agents as unavailable (the agent retries) and stalls no one; they get in once it answers', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-token-api-');
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const backend = await startEchoBackend(t);
  const server = await tokenServer(t, ws, k);
  await tokenAgent(t, ws, server, 'pod-a', (await tokenFile(ws, k, 'pod-a')).file);

  // Slow: the review hangs until its 5 s deadline.
  const hang = k.api.injectFault({ resource: 'tokenreviews' }, { hang: true });
  const slow = await tokenAgent(t, ws, server, 'pod-slow', (await tokenFile(ws, k, 'pod-slow')).file, false);
  await waitUntil(() => hang.hits > 0, 'the review to hang', 20_000);
  await assertTunnel(t, server, backend, 'the admitted agent works while a review hangs');
  await assertRefused(t, server, slow, 'unavailable', /no answer from the Kubernetes API/);
  hang.clear();
  await waitStatus(slow.readyzUrl(), 200, 30_000);

  // Down: connection refused.
  await k.api.goDown();
  const down = await tokenAgent(t, ws, server, 'pod-down', (await tokenFile(ws, k, 'pod-down')).file, false);
  await assertRefused(t, server, down, 'unavailable', /cannot check the token: .*cannot reach the Kubernetes API/);
  await assertTunnel(t, server, backend, 'the admitted agents work while the API is down');
  await k.api.comeBack();
  await waitStatus(down.readyzUrl(), 200, 30_000);
});

test('the token file is read afresh on every connect: a rotated token is sent after a reconnect', async (t) => {
  const ws = await makeWorkspace(t, 'kanal-token-rotate-');
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const server = await tokenServer(t, ws, k);
  const first = await tokenFile(ws, k, 'pod-r');
  const agent = await tokenAgent(t, ws, server, 'pod-r', first.file);
  // The kubelet rotates the projected token in place; the old one stops being valid.
  const second = k.api.tokens.issueServiceAccountToken({
    namespace: NS,
    serviceAccount: SA,
    audiences: [AUDIENCE],
    pod: { name: 'pod-r' },
  });
  await fs.writeFile(first.file, second);
  k.api.tokens.revoke(first.token);
  await server.stop();
  const again = await restartServer(t, server);
  await waitStatus(again.readyzUrl(), 200, 30_000);
  await waitStatus(agent.readyzUrl(), 200, 10_000);
  t.false(
    again.logLines().some((l) => l.msg.includes('refused agent stream')),
    'the revoked token was never sent again',
  );

  // A file emptied or removed mid-rotation is an error naming the flag, never an anonymous dial.
  await fs.writeFile(first.file, '');
  await again.stop();
  const third = await restartServer(t, again);
  await agent.waitForLog(
    warnLine('cannot connect to proxy server', (l) => /--service-account-token-path\) is empty/.test(String(l.err))),
    20_000,
    'the empty file',
  );
  await fs.rm(first.file);
  await agent.waitForLog(
    warnLine('cannot connect to proxy server', (l) => /--service-account-token-path\) does not exist/.test(String(l.err))),
    20_000,
    'the missing file',
  );
  t.false(
    third.logLines().some((l) => l.msg.includes('no-token')),
    'no stream without a token reached the server',
  );
});

test('command line: the token flags go together, default-deny stays, and a token without a client CA starts', async (t) => {
  const base = ['server', '--dry-run', '--uds-name', '/tmp/kanal-never.sock', '--cluster-cert', 'c.crt', '--cluster-key', 'c.key'];
  const partial = await runCli([...base, '--agent-namespace', NS, '--agent-service-account', SA]);
  t.is(partial.code, 2);
  t.regex(partial.stderr, /missing --authentication-audience/);
  const none = await runCli(base);
  t.is(none.code, 2);
  t.regex(
    none.stderr,
    /--cluster-ca-cert .*--agent-namespace, --agent-service-account and --authentication-audience .*--allow-unauthenticated-agents/,
  );
  const both = await runCli([...base, ...TOKEN_FLAGS, '--allow-unauthenticated-agents']);
  t.is(both.code, 2);
  t.regex(both.stderr, /--allow-unauthenticated-agents contradicts token authentication/);
  const badType = await runCli([...base, ...TOKEN_FLAGS, '--kube-api-content-type', 'text/yaml']);
  t.is(badType.code, 2);
  t.regex(badType.stderr, /--kube-api-content-type "text\/yaml"/);
  const colon = await runCli([...base, ...TOKEN_FLAGS, '--agent-service-account', 'a:b']);
  t.is(colon.code, 2);
  t.regex(colon.stderr, /--agent-service-account "a:b" must not contain ':'/);
  const ok = await runCli([...base, ...TOKEN_FLAGS, '--kubeconfig', '/etc/kanal/kubeconfig']);
  t.is(ok.code, 1, 'the flags pass; the certificate files do not exist');
  const config = JSON.parse(ok.stdout) as { agent: { tokens: unknown }; kube: unknown };
  t.deepEqual(config.agent.tokens, { namespace: NS, serviceAccount: SA, audience: AUDIENCE });
  t.deepEqual(config.kube, { kubeconfig: '/etc/kanal/kubeconfig', qps: 0, burst: 0, contentType: 'application/vnd.kubernetes.protobuf' });

  // For real: a kubeconfig that cannot be read stops the start, naming the file; without one and outside a pod, the flag.
  const ws = await makeWorkspace(t, 'kanal-token-cli-');
  const real = [
    'server',
    '--uds-name',
    path.join(ws.dir, 's.sock'),
    '--cluster-cert',
    ws.pki.serverCert,
    '--cluster-key',
    ws.pki.serverKey,
    '--health-port',
    '0',
    '--agent-port',
    '0',
    ...TOKEN_FLAGS,
  ];
  const missing = await runCli([...real, '--kubeconfig', path.join(ws.dir, 'absent.kubeconfig')]);
  t.is(missing.code, 1);
  t.regex(missing.stderr, /--kubeconfig .*absent\.kubeconfig/);
  const outside = await runCli(real);
  t.is(outside.code, 1);
  t.regex(outside.stderr, /no --kubeconfig given and not running in a pod .*pass --kubeconfig/);
});
