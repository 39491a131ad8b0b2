/**
 * Lease-based server counting wired into `kanal server`
 * (--enable-lease-controller) and `kanal agent` (--count-server-leases),
 * with real CLI processes behind one balanced address and the
 * Kubernetes API stand-in: each server holds its Lease and collects expired
 * ones, agents hold as many tunnels as there are valid leases, a server that
 * stops deletes its lease (agents drop to two), a new one brings them back
 * to three, and a server that dies is counted until its lease expires and is
 * collected. The servers announce --server-count 1 throughout: only the leases
 * can tell the agent there are three.
 */
import test from 'ava';
import {
  makeWorkspace,
  runCli,
  scrapeMetrics,
  startAgent,
  startServer,
  waitMetrics,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';
import { roundRobin } from '../helpers/round-robin.js';
import { startKonnectivityKubeApi, waitUntil } from '../helpers/kube-stand-in/fixture.js';
import { LabelSelector } from '../../src/kube/labels.js';

const NS = 'kube-system';
const EVERYTHING = LabelSelector.parse('');

test('three servers with leases: the agent converges to three tunnels, drops to two when one stops, is back at three with a new one, and at two once the lease of a dead server expires', async (t) => {
  t.timeout(180_000);
  const ws = await makeWorkspace(t, 'kanal-leases-');
  const { k, serverKubeconfig, agentKubeconfig } = await startKonnectivityKubeApi(t, ws.dir);
  // A server long gone left its lease behind: the servers collect it.
  k.api.leases.create(NS, {
    metadata: { name: 'konnectivity-proxy-server-gone', labels: { 'k8s-app': 'konnectivity-server' } },
    spec: {
      holderIdentity: 'gone',
      leaseDurationSeconds: 30,
      renewTime: new Date(Date.now() - 600_000).toISOString().replace('Z', '000Z'),
    },
  });
  const leaseHolders = (): string[] =>
    k.api.leases
      .list(NS, EVERYTHING)
      .items.map((l) => l.spec.holderIdentity ?? '')
      .sort();

  const serverArgs = ['--server-count', '1', '--enable-lease-controller', '--kubeconfig', serverKubeconfig];
  const servers: KanalServerProcess[] = [];
  for (const name of ['server-a', 'server-b', 'server-c']) servers.push(await startServer(t, ws, { name, extraArgs: serverArgs }));
  await waitUntil(() => leaseHolders().join() === 'server-a,server-b,server-c', 'three leases, the stale one collected', 30_000);
  // Upstream's garbage-collection metrics: one server culled it; each listed the leases.
  const gc = await Promise.all(servers.map((s) => scrapeMetrics(s.healthPort)));
  t.is(
    gc.reduce((n, m) => n + (m.get('konnectivity_network_proxy_server_culled_leases_count') ?? 0), 0),
    1,
    'culled once',
  );
  for (const m of gc)
    t.true(
      (m.get('konnectivity_network_proxy_server_lease_list_total{http_status_code="200",reason=""}') ?? 0) >= 1,
      'lease lists counted',
    );

  const live = (): number[] => servers.filter((s) => s.running()).map((s) => s.agentPort);
  const lbPort = await roundRobin(t, live);
  let since = Date.now();
  const agent = await startAgent(
    t,
    ws,
    { agentPort: lbPort },
    {
      agentID: 'node-1',
      extraArgs: ['--count-server-leases', '--kubeconfig', agentKubeconfig, '--kube-api-content-type', 'application/json'],
    },
  );
  await waitMetrics(agent.healthPort, { kanal_agent_tunnels: 3, kanal_agent_expected_servers: 3 }, 60_000);
  t.log(`three tunnels ${Date.now() - since} ms after the agent started`);
  await agent.waitForLog(
    (l) => l.msg === 'server count changed' && l.serverCount === 3 && l.from === 'KNP lease count',
    5000,
    'the count from leases',
  );
  t.true(
    ((await scrapeMetrics(agent.healthPort)).get(
      'konnectivity_network_proxy_agent_lease_lists_total{http_response_code="200",reason=""}',
    ) ?? 0) >= 1,
    "upstream's agent lease list metric counts the list",
  );

  // A clean stop deletes the server's lease: agents stop counting it at once.
  since = Date.now();
  await servers[2].stop();
  t.deepEqual(leaseHolders(), ['server-a', 'server-b'], 'the stopped server deleted its lease');
  await waitMetrics(agent.healthPort, { kanal_agent_tunnels: 2, kanal_agent_expected_servers: 2 }, 30_000);
  t.log(`two tunnels, counting two, ${Date.now() - since} ms after SIGTERM to a server`);

  since = Date.now();
  servers.push(await startServer(t, ws, { name: 'server-d', extraArgs: serverArgs }));
  await waitMetrics(agent.healthPort, { kanal_agent_tunnels: 3, kanal_agent_expected_servers: 3 }, 60_000);
  t.log(`three tunnels again ${Date.now() - since} ms after starting a new server`);
  t.deepEqual(leaseHolders(), ['server-a', 'server-b', 'server-d']);

  // A server that dies leaves its lease: agents count it until it expires (30 s), then another server collects it.
  since = Date.now();
  await servers[1].kill();
  await waitMetrics(agent.healthPort, { kanal_agent_tunnels: 2, kanal_agent_expected_servers: 2 }, 60_000);
  t.log(`counting two ${Date.now() - since} ms after SIGKILL to a server (its lease expired)`);
  await waitUntil(() => leaseHolders().join() === 'server-a,server-d', "the dead server's lease collected", 30_000);
  t.log(`its lease collected ${Date.now() - since} ms after SIGKILL`);
  t.true(agent.running());
});

test("command line: lease flags are checked, with upstream's names and defaults", async (t) => {
  const server = [
    'server',
    '--dry-run',
    '--uds-name',
    '/tmp/kanal-never.sock',
    '--cluster-cert',
    'c.crt',
    '--cluster-key',
    'c.key',
    '--cluster-ca-cert',
    'ca.crt',
  ];
  const leases = await runCli([...server, '--enable-lease-controller', '--server-id', 'cp-1']);
  const config = JSON.parse(leases.stdout) as { leases: unknown; kube: unknown };
  t.deepEqual(config.leases, { namespace: 'kube-system', labels: { 'k8s-app': 'konnectivity-server' } });
  t.deepEqual(config.kube, { qps: 0, burst: 0, contentType: 'application/vnd.kubernetes.protobuf' });
  const badID = await runCli([...server, '--enable-lease-controller', '--server-id', 'CP_1']);
  t.is(badID.code, 2);
  t.regex(badID.stderr, /--enable-lease-controller: --server-id "CP_1" cannot name a Lease/);
  const badLabel = await runCli([...server, '--enable-lease-controller', '--lease-label', 'no-equals']);
  t.is(badLabel.code, 2);
  t.regex(badLabel.stderr, /--lease-label/);

  const agent = ['agent', '--dry-run', '--proxy-server-host', 'cp.example', '--ca-cert', 'ca.crt'];
  const counting = await runCli([
    ...agent,
    '--count-server-leases',
    '--server-count-source',
    'max',
    '--sync-forever',
    '--lease-label',
    'k8s-app in (konnectivity-server)',
  ]);
  const a = JSON.parse(counting.stdout) as { leases: unknown; settings: { 'server-count-source': string; 'sync-forever': boolean } };
  t.deepEqual(a.leases, {
    kube: { qps: 0, burst: 0, contentType: 'application/vnd.kubernetes.protobuf' },
    namespace: 'kube-system',
    selector: 'k8s-app in (konnectivity-server)',
  });
  t.is(a.settings['server-count-source'], 'max');
  t.true(a.settings['sync-forever']);
  const badSource = await runCli([...agent, '--server-count-source', 'min']);
  t.is(badSource.code, 2);
  t.regex(badSource.stderr, /server-count-source/);
});
