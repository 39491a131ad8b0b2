/**
 * "What is connected": the admin port's /status and `kanal status`
 * (docs/operations.md) against a real server and agent with connections held
 * open both ways. The document counts what the test opened, names the
 * agent's credential and no secret, counts a refusal the test provoked, shows
 * a lost tunnel waiting for its resume, and is refused on an admin port that
 * is not loopback. `kanal status` prints it as tables or JSON and says what
 * to fix when nothing (or something else) answers.
 */
import test from 'ava';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import http from 'node:http';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import {
  echoRoundTrip,
  freePort,
  httpGet,
  makeWorkspace,
  nodeListener,
  runCli,
  startAgent,
  startEchoBackend,
  startProxy,
  startServer,
  tunnelThrough,
  waitClosed,
  waitMetrics,
  waitUntil,
  type Scope,
} from '../helpers/kanal-processes.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';
import { shippedRbac, startKubeApi } from '../helpers/kube-stand-in/fixture.js';
import type { AgentStatusDocument, ServerStatusDocument, StatusDocument } from '../../src/domain/status-document.js';

async function statusOf<D extends StatusDocument>(adminPort: number): Promise<D> {
  const r = await httpGet(`http://127.0.0.1:${adminPort}/status`, 5000);
  if (r.status !== 200) throw new Error(`/status answered ${r.status}: ${r.body}`);
  return JSON.parse(r.body) as D;
}

/** A node -> control plane connection through the agent's listener, echoed once, held open by the scope. */
async function heldNodeConnection(scope: Scope, connect: () => Promise<net.Socket>): Promise<net.Socket> {
  const s = await connect();
  scope.teardown(() => void s.destroy());
  if (!(await echoRoundTrip(s, randomBytes(10_000)))) throw new Error('node -> control plane echo failed');
  return s;
}

/** Every string anywhere in a JSON value. */
function strings(v: unknown): string[] {
  if (typeof v === 'string') return [v];
  if (Array.isArray(v)) return v.flatMap(strings);
  if (v && typeof v === 'object') return Object.values(v).flatMap(strings);
  return [];
}

test('server and agent status: the agent, its credential, connections each way, bytes, a refusal, and no secret', async (t) => {
  t.timeout(90_000);
  const echo = await startEchoBackend(t);
  const allowed = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  // A second --target on the same address whose destination the server does not allow.
  const forbidden = await nodeListener({ host: '127.0.0.2', destination: '127.0.0.1:9' });
  const { ws, server, agent } = await startProxy(t, {
    server: { extraArgs: ['--allowed-destination', echo.address] },
    agents: [{ agentID: 'node-1', extraArgs: [...allowed.args, '--target', `${forbidden.port}:127.0.0.1:9`] }],
  });

  // Held open: 2 control plane -> node, 3 node -> control plane.
  for (let i = 0; i < 2; i++) t.true(await echoRoundTrip(await tunnelThrough(t, server, echo.address), randomBytes(20_000)));
  for (let i = 0; i < 3; i++) await heldNodeConnection(t, () => allowed.connect());
  // Refused by the server: the agent's listener closes the connection.
  const refused = await forbidden.connect();
  await waitClosed(refused, 10_000);
  await waitMetrics(server.healthPort, { 'kanal_refusals_total{reason="destination_not_allowed"}': 1 }, 10_000);

  const doc = await statusOf<ServerStatusDocument>(server.adminPort);
  t.is(doc.kind, 'kanal-status');
  t.is(doc.version, 2);
  t.is(doc.component, 'server');
  t.is(doc.server.serverID, 'server');
  t.is(doc.server.state, 'listening');
  t.is(doc.server.tenants, undefined, 'one cluster: no tenants listed');
  t.is(doc.agents.length, 1);
  const a = doc.agents[0];
  t.is(a.agentID, 'node-1');
  t.regex(a.credential, /CN=node-1/, 'the certificate subject it authenticated with');
  t.is(a.tunnels.length, 1);
  const tun = a.tunnels[0];
  t.is(tun.state, 'open');
  t.deepEqual(tun.connections, { cpToNode: 2, nodeToCp: 3 });
  t.deepEqual(tun.pendingDials, { cpToNode: 0, nodeToCp: 0 });
  t.true(tun.bytes.toPeer >= 2 * 20_000 + 3 * 10_000, `bytes to the agent: ${tun.bytes.toPeer}`);
  t.true(tun.bytes.fromPeer >= 2 * 20_000 + 3 * 10_000, `bytes from the agent: ${tun.bytes.fromPeer}`);
  t.true(tun.features.includes('node-dial'));
  t.regex(tun.peer, /^127\.0\.0\.1:\d+$/);
  t.is(tun.liveness?.quiet, false);
  t.is(tun.recent.refusals.destination_not_allowed?.['1m'], 1, "counted against the agent's tunnel");
  t.is(doc.recent.refusals.destination_not_allowed?.['15m'], 1, 'and in the process');

  // No secret: no key material, no PEM, no resume token (22 base64url characters, resumable-tunnels.ts).
  const text = JSON.stringify(doc);
  t.false(/PRIVATE KEY|BEGIN CERTIFICATE/.test(text));
  const keyBody = fs
    .readFileSync(ws.pki.agentKey, 'utf8')
    .split('\n')
    .filter((l) => !l.startsWith('-----'))
    .join('');
  for (let i = 0; i + 32 <= keyBody.length; i += 32) t.false(text.includes(keyBody.slice(i, i + 32)), 'a piece of a private key');
  t.deepEqual(
    strings(doc).filter((s) => /^[A-Za-z0-9_-]{22}$/.test(s)),
    [],
    'nothing shaped like a resume token',
  );

  // kanal status: the tables, then the same document as JSON.
  const text1 = await runCli(['status', '--admin-address', `127.0.0.1:${server.adminPort}`]);
  t.is(text1.code, 0, text1.stderr);
  t.regex(text1.stdout, /^Kanal server server \(listening, one of 1 server\(s\)\)/);
  t.regex(text1.stdout, /1 agent\(s\), 1 tunnel\(s\):\nAGENT +CREDENTIAL +PEER +AGE +STATE/);
  t.regex(text1.stdout, /node-1 +CN=node-1.* open +ok .*node-dial.* 2\/3 +0\/0 +\d.* \/ \d.* 1\/1\/1\n/);
  t.regex(text1.stdout, /refused +destination_not_allowed +1 +1 +1/);
  const json = await runCli(['status', '--admin-address', `127.0.0.1:${server.adminPort}`, '-o', 'json']);
  t.is(json.code, 0, json.stderr);
  const parsed = JSON.parse(json.stdout) as ServerStatusDocument;
  t.is(parsed.agents[0].agentID, 'node-1');
  t.deepEqual(parsed.agents[0].tunnels[0].connections, { cpToNode: 2, nodeToCp: 3 });

  // The agent's side of the same tunnel.
  const ad = await statusOf<AgentStatusDocument>(agent.adminPort);
  t.is(ad.component, 'agent');
  t.is(ad.agent.agentID, 'node-1');
  t.is(ad.agent.state, 'running');
  t.deepEqual(
    ad.servers.map((s) => [s.address, s.state, s.serverIDs]),
    [[`127.0.0.1:${server.agentPort}`, 'connected', ['server']]],
  );
  t.is(ad.tunnels.length, 1);
  t.is(ad.tunnels[0].serverID, 'server');
  t.deepEqual(ad.tunnels[0].connections, { cpToNode: 2, nodeToCp: 3 });
  t.true(ad.tunnels[0].bytes.toPeer >= 2 * 20_000 + 3 * 10_000);
  t.deepEqual(ad.nodeListeners?.targets, [
    { listen: `127.0.0.2:${allowed.port}`, destination: echo.address },
    { listen: `127.0.0.2:${forbidden.port}`, destination: '127.0.0.1:9' },
  ]);
  t.is(ad.nodeListeners?.active, 3);
  t.is(ad.hostInterface?.type, 'none');
  t.is(ad.hostInterface?.ready, true);
  const agentText = await runCli(['status', '--admin-address', `127.0.0.1:${agent.adminPort}`]);
  t.is(agentText.code, 0, agentText.stderr);
  t.regex(agentText.stdout, /^Kanal agent node-1 \(running, /);
  t.regex(
    agentText.stdout,
    /Server addresses:\nADDRESS +NAME +STATE +SERVER IDS +LAST ERROR\n127\.0\.0\.1:\d+ +127\.0\.0\.1 +connected +server/,
  );
  t.regex(agentText.stdout, /Tunnels:\nSERVER ID .*\nserver +127\.0\.0\.1:\d+ +\S+ +open +[a-z,-]+ +2\/3 +0\/0/);
  t.regex(agentText.stdout, /Node listeners \(node -> control plane, accepting; 3 connection\(s\) carried, 0 waiting for a tunnel\):/);
  t.regex(agentText.stdout, new RegExp(`127\\.0\\.0\\.2:${allowed.port} +${echo.address.replace(/\./g, '\\.')}`));
});

test('an agent that authenticated with a service account token shows as its account and pod; the token is nowhere', async (t) => {
  t.timeout(90_000);
  const ws = await makeWorkspace(t, 'kanal-status-token-');
  const k = await startKubeApi(t, { rbac: await shippedRbac() });
  const [ns, sa, audience] = ['kube-system', 'konnectivity-agent', 'system:konnectivity-server'];
  const kubeconfig = await k.api.writeKubeconfig(path.join(ws.dir, 'server.kubeconfig'), {
    user: 'system:konnectivity-server',
    auth: 'certificate',
  });
  const server = await startServer(t, ws, {
    clusterCa: false,
    extraArgs: ['--agent-namespace', ns, '--agent-service-account', sa, '--authentication-audience', audience, '--kubeconfig', kubeconfig],
  });
  const token = k.api.tokens.issueServiceAccountToken({
    namespace: ns,
    serviceAccount: sa,
    audiences: [audience],
    pod: { name: 'pod-1' },
    node: { name: 'node-1' },
  });
  const file = path.join(ws.dir, 'pod-1.token');
  await fsp.writeFile(file, token);
  await startAgent(t, ws, server, { agentID: 'pod-1', cert: 'none', extraArgs: ['--service-account-token-path', file] });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);

  const r = await httpGet(`http://127.0.0.1:${server.adminPort}/status`, 5000);
  t.is(r.status, 200);
  const doc = JSON.parse(r.body) as ServerStatusDocument;
  t.is(doc.agents[0].agentID, 'pod-1');
  t.is(doc.agents[0].credential, `system:serviceaccount:${ns}:${sa} pod pod-1 on node node-1`);
  // The token whole, and each of its three JWT parts (a signature or a claim set alone is still a secret's piece).
  t.false(r.body.includes(token));
  for (const part of token.split('.')) t.false(r.body.includes(part), 'a part of the token');
  const cli = await runCli(['status', '--admin-address', `127.0.0.1:${server.adminPort}`, '-o', 'json']);
  t.is(cli.code, 0, cli.stderr);
  t.false(cli.stdout.includes(token.split('.')[2]));
});

test('a lost tunnel shows as detached on both sides while its connection waits, and open again once resumed', async (t) => {
  t.timeout(90_000);
  const fast = ['--keepalive-time', '1s', '--keepalive-timeout', '3s', '--resume-timeout', '30s'];
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: fast });
  const relay = await startTcpRelay(t, { host: '127.0.0.1', port: server.agentPort });
  const agent = await startAgent(t, ws, { agentPort: relay.port }, { agentID: 'node-1', extraArgs: fast });
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  const held = await tunnelThrough(t, server, echo.address);
  t.true(await echoRoundTrip(held, randomBytes(1000)));

  relay.blackhole();
  let serverSide: ServerStatusDocument | undefined;
  await waitUntil(
    async () => {
      serverSide = await statusOf<ServerStatusDocument>(server.adminPort);
      return serverSide.agents[0]?.tunnels[0]?.state === 'detached';
    },
    'the server holds the tunnel detached',
    20_000,
  );
  const lost = serverSide?.agents[0].tunnels[0];
  t.is(serverSide?.agents[0].agentID, 'node-1');
  t.is(lost?.peer, '', 'no stream, no peer');
  t.deepEqual(lost?.connections, { cpToNode: 1, nodeToCp: 0 }, 'its connection waits');
  t.is(typeof lost?.detachedSeconds, 'number');
  let agentSide: AgentStatusDocument | undefined;
  await waitUntil(
    async () => {
      agentSide = await statusOf<AgentStatusDocument>(agent.adminPort);
      return agentSide.tunnels[0]?.state === 'detached';
    },
    'the agent holds the tunnel detached',
    20_000,
  );
  t.is(agentSide?.servers[0].state, 'detached');
  const text = await runCli(['status', '--admin-address', `127.0.0.1:${server.adminPort}`]);
  t.regex(text.stdout, /node-1 +CN=node-1.* - +\S+ +detached \d+s +- /, 'no peer, detached for a while, no PING state');

  relay.restore();
  await waitUntil(
    async () => (await statusOf<ServerStatusDocument>(server.adminPort)).agents[0]?.tunnels[0]?.state === 'open',
    'the server resumed the tunnel',
    30_000,
  );
  t.true(await echoRoundTrip(held, randomBytes(1000)), 'the connection carried on');
});

test('an admin port bound beyond loopback refuses /status with 403 and says why; /metrics is still served', async (t) => {
  t.timeout(60_000);
  const ws = await makeWorkspace(t);
  // The wildcard address is not loopback; the test still only talks to 127.0.0.1.
  const server = await startServer(t, ws, { extraArgs: ['--admin-bind-address', '0.0.0.0'] });
  const r = await httpGet(`http://127.0.0.1:${server.adminPort}/status`, 5000);
  t.is(r.status, 403);
  t.regex(r.body, /served only when the admin port listens on a loopback address .*listens on 0\.0\.0\.0 \(--admin-bind-address\)/);
  t.is((await httpGet(`http://127.0.0.1:${server.adminPort}/metrics`, 5000)).status, 200);
  const cli = await runCli(['status', '--admin-address', `127.0.0.1:${server.adminPort}`]);
  t.is(cli.code, 1);
  t.regex(cli.stderr, /^kanal: 127\.0\.0\.1:\d+ refused the status: .*loopback/);
});

/** An HTTP server on 127.0.0.1 that answers every request with `status` and `body`. */
async function fakeAdmin(scope: Scope, status: number, body: string, type = 'application/json'): Promise<number> {
  const s = http.createServer((_req, res) => res.writeHead(status, { 'content-type': type }).end(body));
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', () => resolve()));
  scope.teardown(() => new Promise<void>((resolve) => (s.closeAllConnections(), s.close(() => resolve()))));
  return (s.address() as net.AddressInfo).port;
}

test('kanal status names the flag when nothing answers, and refuses answers that are not a Kanal status it knows', async (t) => {
  t.timeout(60_000);
  const nobody = await freePort();
  const none = await runCli(['status', '--admin-address', `127.0.0.1:${nobody}`]);
  t.is(none.code, 1);
  t.regex(
    none.stderr,
    new RegExp(
      `no Kanal admin port answers: 127\\.0\\.0\\.1:${nobody} \\(--admin-address\\): nothing listens there\\..*--admin-address host:port`,
    ),
  );

  const cases: [port: number, message: RegExp][] = [
    [
      await fakeAdmin(t, 404, 'page not found', 'text/plain'),
      /answered HTTP 404 for \/status \("page not found"\): not the admin port of a Kanal/,
    ],
    [
      await fakeAdmin(t, 200, '<html>hello</html>', 'text/html'),
      /is not a Kanal admin port: its \/status is not JSON \(text\/html: "<html>hello<\/html>"\)/,
    ],
    [await fakeAdmin(t, 200, '{"status":"ok"}'), /is JSON but not a Kanal status document/],
    [await fakeAdmin(t, 200, '{"kind":"kanal-status","version":3}'), /serves status version 3; this kanal reads version 2/],
  ];
  for (const [port, message] of cases) {
    const r = await runCli(['status', '--admin-address', `127.0.0.1:${port}`]);
    t.is(r.code, 1, r.stdout);
    t.regex(r.stderr, message);
  }
  const bad = await runCli(['status', '--admin-address', 'no-port']);
  t.is(bad.code, 2);
  t.regex(bad.stderr, /--admin-address: address "no-port": expected host:port/);
});
