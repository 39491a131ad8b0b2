/**
 * Token authentication and lease counting across the mixed pairings:
 * upstream v0.36's proxy-agent authenticates to Kanal servers with its
 * service account token and counts them by their leases; a Kanal agent does
 * the same against upstream proxy-servers. Both through the Kubernetes API
 * stand-in, with the servers announcing --server-count 1 so only the leases
 * can say there are two. Skips with the reason when upstream's binaries are
 * absent.
 */
import test, { type ExecutionContext } from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import fs from 'node:fs/promises';
import path from 'node:path';
import {
  makeWorkspace,
  startAgent,
  startServer,
  waitMetrics,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { startUpstreamAgent, startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';
import { startKonnectivityKubeApi, waitUntil, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';
import { roundRobin } from '../helpers/round-robin.js';
import { LabelSelector } from '../../src/kube/labels.js';

const unavailable = upstreamUnavailableReason();
const maybe = unavailable ? test.skip : test;
if (unavailable) skippedBecause('token and lease interop with upstream', unavailable);

const NS = 'kube-system';
const TOKEN_FLAGS = [
  '--agent-namespace=kube-system',
  '--agent-service-account=konnectivity-agent',
  '--authentication-audience=system:konnectivity-server',
];

interface KubeSide {
  k: KubeFixture;
  serverKubeconfig: string;
  agentKubeconfig: string;
  tokenFile: string;
}

async function kubeSide(t: ExecutionContext, ws: Workspace): Promise<KubeSide> {
  const { k, serverKubeconfig, agentKubeconfig } = await startKonnectivityKubeApi(t, ws.dir);
  const tokenFile = path.join(ws.dir, 'agent-token');
  const token = k.api.tokens.issueServiceAccountToken({
    namespace: NS,
    serviceAccount: 'konnectivity-agent',
    audiences: ['system:konnectivity-server'],
    pod: { name: 'agent-pod' },
    node: { name: 'node-1' },
  });
  await fs.writeFile(tokenFile, token);
  return { k, serverKubeconfig, agentKubeconfig, tokenFile };
}

const holders = (k: KubeFixture): string[] =>
  k.api.leases
    .list(NS, LabelSelector.parse(''))
    .items.map((l) => l.spec.holderIdentity ?? '')
    .sort();

maybe('an upstream agent authenticates to Kanal servers with its token and counts them by their leases', async (t) => {
  t.timeout(120_000);
  const ws = await makeWorkspace(t, 'kanal-kube-up-agent-');
  const { k, serverKubeconfig, agentKubeconfig, tokenFile } = await kubeSide(t, ws);
  const serverArgs = [...TOKEN_FLAGS, '--kubeconfig', serverKubeconfig, '--enable-lease-controller', '--server-count', '1'];
  const servers: KanalServerProcess[] = [];
  for (const name of ['kanal-a', 'kanal-b']) servers.push(await startServer(t, ws, { name, clusterCa: false, extraArgs: serverArgs }));
  await waitUntil(() => holders(k).join() === 'kanal-a,kanal-b', 'both Kanal servers hold a lease', 20_000);
  const lbPort = await roundRobin(t, () => servers.map((s) => s.agentPort));

  const agent = await startUpstreamAgent(
    t,
    ws,
    { agentPort: lbPort },
    {
      agentID: 'upstream-agent',
      verbosity: 4,
      extraArgs: [`--service-account-token-path=${tokenFile}`, '--count-server-leases', `--kubeconfig=${agentKubeconfig}`],
    },
  );
  await agent.waitForLog(
    /"Determined server count" serverCount=2 source="KNP lease count"/,
    30_000,
    'the upstream agent counts two Kanal servers by leases',
  );
  for (const server of servers) {
    const line = await server.waitForLog(
      (l) => l.msg === 'agent connected' && l.agentID === 'upstream-agent',
      30_000,
      'the upstream agent admitted by its token',
    );
    t.regex(
      String(line.credential),
      /^system:serviceaccount:kube-system:konnectivity-agent pod agent-pod on node node-1$/,
      `${server.name} knows the agent by its token`,
    );
  }
});

maybe('a Kanal agent authenticates to upstream servers with its token and counts them by their leases', async (t) => {
  t.timeout(120_000);
  const ws = await makeWorkspace(t, 'kanal-kube-up-server-');
  const { k, serverKubeconfig, agentKubeconfig, tokenFile } = await kubeSide(t, ws);
  const serverArgs = [...TOKEN_FLAGS, `--kubeconfig=${serverKubeconfig}`, '--enable-lease-controller'];
  // Upstream refuses --cluster-ca-cert together with token authentication.
  const servers = [
    await startUpstreamServer(t, ws, { name: 'upstream-a', agentClientCa: false, serverCount: 1, extraArgs: serverArgs }),
    await startUpstreamServer(t, ws, { name: 'upstream-b', agentClientCa: false, serverCount: 1, extraArgs: serverArgs }),
  ];
  await waitUntil(() => holders(k).join() === 'upstream-a,upstream-b', 'both upstream servers hold a lease', 20_000);
  const lbPort = await roundRobin(t, () => servers.map((s) => s.agentPort));

  const agent = await startAgent(
    t,
    ws,
    { agentPort: lbPort },
    {
      agentID: 'kanal-agent',
      cert: 'none',
      extraArgs: ['--service-account-token-path', tokenFile, '--count-server-leases', '--kubeconfig', agentKubeconfig],
    },
  );
  await waitMetrics(agent.healthPort, { kanal_agent_tunnels: 2, kanal_agent_expected_servers: 2 }, 60_000);
  // The metric can be read before the log line is written (log lines wait up to 10 ms to share a write): wait for each.
  for (const serverID of ['upstream-a', 'upstream-b'])
    await agent.waitForLog((l) => l.msg === 'tunnel up' && l.serverID === serverID, 30_000, `the agent's tunnel to ${serverID}`);
  const up = agent
    .logLines()
    .filter((l) => l.msg === 'tunnel up')
    .map((l) => String(l.serverID))
    .sort();
  t.deepEqual([...new Set(up)], ['upstream-a', 'upstream-b']);
});
