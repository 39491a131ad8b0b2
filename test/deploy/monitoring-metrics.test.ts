/**
 * The dashboard and the alert rules against what real processes export:
 * a server and an agent (through a TCP relay the test black-holes, so
 * tunnels die and resume) carry traffic both ways, a dial error, a refused
 * request and a forbidden node → control plane destination; a server with
 * --tenants-config serves a tenant's agent and refuses a request, and
 * refuses an invalid tenants file. Both /metrics are scraped, and every
 * query's metrics and labels (matchers, by/without, on/group, le) must be
 * among them (promql-labels.ts).
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import anyTest, { type TestFn } from 'ava';
import { ConnectRefused } from '../../kit/demo/proxy-client.js';
import {
  connectThrough,
  connectUnix,
  echoRoundTrip,
  fileScope,
  freePort,
  httpConnect,
  httpGet,
  makeWorkspace,
  nodeListener,
  rawRequest,
  startAgent,
  startEchoBackend,
  startServer,
  waitMetrics,
  waitUntil,
  scrapeMetrics,
} from '../helpers/kanal-processes.js';
import { startTcpRelay } from '../helpers/tcp-relay.js';
import { startTenantsServer, tenantsFile } from '../helpers/tenants.js';
import { analyse, labelsFromExposition, type LabelLookup } from './promql-labels.js';
import { alerts, dashboardQueries, labelValuesQuery, loadDashboard, loadRules, NOT_YET_EXPORTED } from './monitoring-files.js';

interface Ctx {
  /** Label names per metric over every scrape (target labels included). */
  exported: Map<string, Set<string>>;
}

const test = anyTest as TestFn<Ctx>;
const shared = fileScope(test);

/** PINGs that notice a black hole in seconds (as test/e2e/resume.test.ts). */
const FAST_KEEPALIVE = ['--keepalive-time', '1s', '--keepalive-timeout', '3s'];

/** Series Prometheus makes itself for each target. */
const SYNTHESIZED: Record<string, readonly string[]> = { up: [] };

async function metricsText(port: number): Promise<string> {
  const res = await httpGet(`http://127.0.0.1:${port}/metrics`, 5000);
  if (res.status !== 200) throw new Error(`/metrics on ${port} answered ${res.status}`);
  return res.body;
}

/** Expects CONNECT `address` through `uds` to be refused; returns the refusal. */
async function refusedThrough(uds: string, address: string): Promise<ConnectRefused> {
  try {
    (await httpConnect(await connectUnix(uds), address, 15_000)).destroy();
  } catch (err) {
    if (err instanceof ConnectRefused) return err;
    throw err;
  }
  throw new Error(`CONNECT ${address} was accepted`);
}

/** A single-tenant server and its agent, through everything the dashboard shows; returns both scrapes. */
async function singleTenant(): Promise<string[]> {
  const ws = await makeWorkspace(shared, 'kanal-monitoring-');
  const echo = await startEchoBackend(shared);
  const listener = await nodeListener({ host: '127.0.0.2', destination: echo.address });
  const forbiddenPort = await freePort('127.0.0.2');
  const resume = ['--resume-timeout', '20s'];
  const audit = (who: string): string[] => ['--audit-log-path', path.join(ws.dir, `${who}-audit.log`)];
  const server = await startServer(shared, ws, {
    extraArgs: [...FAST_KEEPALIVE, ...resume, ...audit('server'), '--allowed-destination', echo.address],
  });
  const relay = await startTcpRelay(shared, { host: '127.0.0.1', port: server.agentPort });
  const agent = await startAgent(
    shared,
    ws,
    { agentPort: relay.port },
    {
      agentID: 'node-1',
      extraArgs: [
        ...FAST_KEEPALIVE,
        ...resume,
        ...audit('agent'),
        ...listener.args,
        '--target',
        `${forbiddenPort}:127.0.0.1:${await freePort()}`,
      ],
    },
  );
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);

  // Both directions, each connection closed so its bytes are counted.
  const down = await connectThrough(server, echo.address);
  if (!(await echoRoundTrip(down, Buffer.from('control plane to node')))) throw new Error('no echo control plane -> node');
  down.destroy();
  const up = await listener.connect();
  if (!(await echoRoundTrip(up, Buffer.from('node to control plane')))) throw new Error('no echo node -> control plane');
  up.destroy();
  // A dial error (a closed port), a refused request (not CONNECT), a destination not allowed.
  const refusal = await refusedThrough(server.uds, `127.0.0.1:${await freePort()}`);
  if (refusal.status !== 502) throw new Error(`a dial to a closed port answered ${refusal.status}`);
  const get = await rawRequest(server.uds, 'GET / HTTP/1.1\r\nHost: kanal\r\n\r\n');
  if (get.status !== 405) throw new Error(`GET answered ${get.status}`);
  const forbidden = net.connect({ host: '127.0.0.2', port: forbiddenPort });
  forbidden.on('error', () => undefined);
  await waitMetrics(
    server.healthPort,
    {
      'kanal_refusals_total{reason="destination_not_allowed"}': 1,
      'kanal_refusals_total{reason="frontend_method"}': 1,
      'kanal_dials_total{direction="node_to_cp",result="ok"}': 1,
      'kanal_dials_total{direction="cp_to_node",result="refused"}': 1,
    },
    10_000,
  );
  forbidden.destroy();

  // A black-holed path: PINGs go unanswered, the tunnel dies and detaches, then resumes.
  relay.blackhole();
  await waitUntil(
    async () => ((await scrapeMetrics(server.healthPort)).get('kanal_resume_detached_total') ?? 0) >= 1,
    'the tunnel detached',
    20_000,
  );
  relay.restore();
  await waitMetrics(server.healthPort, { 'kanal_resumes_total{result="resumed"}': 1 }, 20_000);
  return [await metricsText(server.adminPort), await metricsText(agent.adminPort)];
}

/** A server with --tenants-config and one tenant's agent, a connection and a refusal of that tenant, an invalid reload; returns its scrape. */
async function multiTenant(): Promise<string> {
  const ws = await makeWorkspace(shared, 'kanal-monitoring-tenants-');
  const echo = await startEchoBackend(shared);
  const file = path.join(ws.dir, 'tenants.yaml');
  const uds = path.join(ws.dir, 'one.sock');
  fs.writeFileSync(file, tenantsFile([`  - name: one\n    cluster-ca-cert: ${ws.pki.caCert}\n    uds-name: ${uds}\n`]));
  const { agentPort, healthPort } = await startTenantsServer(shared, {
    file,
    defaultPair: { cert: ws.pki.serverCert, key: ws.pki.serverKey },
    name: 'tenants-server',
    logFile: path.join(ws.dir, 'tenants-server.log'),
    ready: 'healthz',
  });
  await startAgent(shared, ws, { agentPort }, { agentID: 'tenant-node-1' });
  await waitMetrics(healthPort, { 'kanal_server_agents{tenant="one"}': 1 }, 10_000);
  const s = await httpConnect(await connectUnix(uds), echo.address, 15_000);
  if (!(await echoRoundTrip(s, Buffer.from('tenant one')))) throw new Error('no echo through tenant one');
  s.destroy();
  const get = await rawRequest(uds, 'GET / HTTP/1.1\r\nHost: kanal\r\n\r\n');
  if (get.status !== 405) throw new Error(`GET answered ${get.status}`);
  fs.writeFileSync(file, 'tenants: [not a tenant\n');
  await waitMetrics(
    healthPort,
    { 'kanal_tenants_config_reloads_total{result="invalid"}': 1, 'kanal_refusals_total{reason="frontend_method",tenant="one"}': 1 },
    10_000,
  );
  return metricsText(healthPort);
}

test.before(async (t) => {
  const texts = [...(await singleTenant()), await multiTenant()];
  t.context = { exported: labelsFromExposition(texts) };
});

/** Exported metrics, then Prometheus's own and the list of those not exported yet. */
function lookupOf(exported: Map<string, Set<string>>): LabelLookup {
  return (metric) => {
    const found = exported.get(metric);
    if (found) return found;
    const extra = SYNTHESIZED[metric] ?? NOT_YET_EXPORTED[metric];
    return extra ? new Set(['job', 'instance', ...extra]) : undefined;
  };
}

test('the scrapes hold what the checks rely on: both roles, tenant labels, labelled counters incremented', (t) => {
  const { exported } = t.context;
  const has = (metric: string, label: string): boolean => exported.get(metric)?.has(label) ?? false;
  t.true(has('konnectivity_network_proxy_server_ready_backend_connections', 'tenant'));
  t.true(exported.has('konnectivity_network_proxy_agent_open_server_connections'));
  t.true(has('kanal_dials_total', 'result') && has('kanal_dials_total', 'tenant'));
  t.true(has('kanal_refusals_total', 'reason') && has('kanal_refusals_total', 'tenant'));
  t.true(has('kanal_resumes_total', 'result'));
  t.true(has('kanal_dead_tunnels_total', 'reason'));
  t.true(has('konnectivity_network_proxy_server_dial_failure_count', 'reason'));
  t.true(has('konnectivity_network_proxy_agent_endpoint_dial_failure_total', 'reason'));
  t.true(has('kanal_dial_duration_seconds_bucket', 'le'));
});

test('every dashboard query names exported metrics, with labels they have', (t) => {
  const lookup = lookupOf(t.context.exported);
  const problems = dashboardQueries(loadDashboard()).flatMap(({ where, expr }) =>
    analyse(expr, lookup).problems.map((p) => `${where}: ${p}`),
  );
  t.deepEqual(problems, []);
});

test("every dashboard variable's label_values names an exported metric and one of its labels", (t) => {
  const lookup = lookupOf(t.context.exported);
  const problems = loadDashboard()
    .templating.list.filter((v) => v.type === 'query')
    .flatMap((v) => {
      const { selector, label } = labelValuesQuery(v);
      const a = analyse(selector, lookup);
      const missing = a.selectors.filter((s) => !lookup(s.metric)?.has(label)).map((s) => `${s.metric} has no label ${label}`);
      return [...a.problems, ...missing].map((p) => `variable ${v.name}: ${p}`);
    });
  t.deepEqual(problems, []);
});

test('every alert rule expression names exported metrics, with labels they have', (t) => {
  const lookup = lookupOf(t.context.exported);
  const problems = alerts(loadRules()).flatMap((r) => analyse(r.expr, lookup).problems.map((p) => `${r.alert}: ${p}`));
  t.deepEqual(problems, []);
});

test('the metrics accepted without being exported are not exported yet, and are used', (t) => {
  const { exported } = t.context;
  const used = new Set(
    [...dashboardQueries(loadDashboard()).map((q) => q.expr), ...alerts(loadRules()).map((r) => r.expr)].flatMap((e) =>
      analyse(e, lookupOf(exported)).selectors.map((s) => s.metric),
    ),
  );
  for (const metric of Object.keys(NOT_YET_EXPORTED)) {
    t.false(exported.has(metric), `${metric} is exported now: remove it from NOT_YET_EXPORTED (monitoring-files.ts)`);
    t.true(used.has(metric), `${metric} is not used by the dashboard or the rules`);
  }
  // The check can fail: a metric neither exported nor listed is reported.
  t.deepEqual(analyse('rate(kanal_no_such_metric_total[5m])', lookupOf(exported)).problems, ['kanal_no_such_metric_total: no such metric']);
});
