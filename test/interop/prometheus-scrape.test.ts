/**
 * A real Prometheus (Debian's prometheus package, 2.42) scraping targets
 * behind an agent through Kanal (docs/frontends.md, "Prometheus"): with
 * `proxy_url: http://` on the plain-TCP listener (--http-proxy-port), an
 * http:// target is scraped through the forward proxy (absolute form, which
 * upstream's server answers with 405) and an https:// one through CONNECT;
 * with `proxy_url: https://` on the mTLS frontend, the scrape's tls_config
 * (its client certificate) is what Go's transport presents to the proxy as
 * well as to the target, and the frontend's ALPN must choose http/1.1
 * although Go offers h2 first. Each waits, bounded, until Prometheus's own
 * API says up == 1 and shows the scraped series.
 */
import { auditRecords } from '../helpers/audit-log.js';
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import path from 'node:path';
import net from 'node:net';
import { spawn, spawnSync } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { closedPort, makeEnv, startAgent, startServer, waitFor, captureLogger, type TestEnv } from '../helpers/in-process.js';
import { startServerInProcess } from '../../kit/launch/in-process.js';
import { scopedTempDir } from '../../kit/launch/cleanup-scope.js';
import { skippedBecause } from '../helpers/skipped.js';

const PROMETHEUS = '/usr/bin/prometheus';
const HAVE_PROMETHEUS = fs.existsSync(PROMETHEUS) && spawnSync(PROMETHEUS, ['--version']).status === 0;
/** How long Prometheus may take to start and scrape (1 s interval; a busy machine). */
const SCRAPED_WITHIN_MS = 60_000;

/** A node-exporter-like page: one gauge naming its target. */
function metricsPage(name: string): string {
  return `# HELP kanal_test_scraped A series the test looks for.\n# TYPE kanal_test_scraped gauge\nkanal_test_scraped{target="${name}"} 42\n`;
}

async function listen(t: ExecutionContext, server: http.Server | https.Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  );
  return (server.address() as net.AddressInfo).port;
}

function exporter(name: string): http.RequestListener {
  return (req, res) => {
    if (req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'Content-Type': 'text/plain; version=0.0.4' }).end(metricsPage(name));
  };
}

/** Prometheus on a free loopback port, its data in a temp dir; stopped (by its pid) at teardown. */
async function startPrometheus(t: ExecutionContext, config: string): Promise<{ port: number; logs: () => string }> {
  const dir = scopedTempDir(t, 'kanal-prometheus-');
  const configFile = path.join(dir, 'prometheus.yml');
  fs.writeFileSync(configFile, config);
  const port = await closedPort();
  let output = '';
  const child = spawn(
    PROMETHEUS,
    [
      `--config.file=${configFile}`,
      `--storage.tsdb.path=${path.join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=debug',
    ],
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const keep = (c: Buffer): void => {
    output = (output + c.toString('utf8')).slice(-20_000);
  };
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  t.teardown(async () => {
    child.kill('SIGTERM');
    await Promise.race([exited, sleep(10_000)]);
    if (child.exitCode === null) child.kill('SIGKILL');
  });
  return { port, logs: () => output };
}

interface Sample {
  metric: Record<string, string>;
  value: [number, string];
}

async function query(port: number, promql: string): Promise<Sample[]> {
  const res = await fetch(`http://127.0.0.1:${port}/api/v1/query?query=${encodeURIComponent(promql)}`);
  const body = (await res.json()) as { status: string; data?: { result: Sample[] } };
  return body.status === 'success' ? (body.data?.result ?? []) : [];
}

/** Waits until every job in `jobs` has up == 1 and its scraped series; fails with Prometheus's last words otherwise. */
async function waitScraped(t: ExecutionContext, prom: { port: number; logs: () => string }, jobs: string[]): Promise<void> {
  const deadline = Date.now() + SCRAPED_WITHIN_MS;
  let last: string | undefined;
  for (;;) {
    try {
      const up = await query(prom.port, 'up');
      const series = await query(prom.port, 'kanal_test_scraped');
      const upOf = (job: string): string | undefined => up.find((s) => s.metric.job === job)?.value[1];
      const scraped = (job: string): boolean => series.some((s) => s.metric.job === job && s.value[1] === '42');
      last = JSON.stringify(jobs.map((j) => ({ job: j, up: upOf(j), scraped: scraped(j) })));
      if (jobs.every((j) => upOf(j) === '1' && scraped(j))) {
        t.log(`scraped through Kanal: ${last}`);
        return;
      }
    } catch (err) {
      last = String(err);
    }
    if (Date.now() > deadline) {
      const lines = prom
        .logs()
        .split('\n')
        .filter((l) => /scrape|error|warn/i.test(l))
        .slice(-15)
        .join('\n');
      throw new Error(`not scraped within ${SCRAPED_WITHIN_MS} ms: ${last ?? 'no answer'}\n${lines}`);
    }
    await sleep(500);
  }
}

/** An http:// and an https:// target (the server certificate of `env`'s PKI), behind the agent. */
async function targets(t: ExecutionContext, env: TestEnv, cert: { cert: string; key: string }) {
  const plain = await listen(t, http.createServer(exporter('http')));
  const tls = await listen(t, https.createServer({ cert: fs.readFileSync(cert.cert), key: fs.readFileSync(cert.key) }, exporter('https')));
  void env;
  return { plain, tls };
}

const promTest = HAVE_PROMETHEUS
  ? test
  : (title: string): void => skippedBecause(title, `${PROMETHEUS} is not installed (Debian package prometheus)`);

promTest('Prometheus with proxy_url http:// scrapes an http:// target (forward proxy) and an https:// one (CONNECT)', async (t) => {
  const env = await makeEnv(t);
  const proxyPort = await closedPort();
  const { server, logs } = await startServer(t, env, { extraFlags: ['--http-proxy-port', String(proxyPort)] });
  t.is(logs.matching('plain TCP listener without a clients: list').length, 1, 'an open plain listener is said at start');
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  const { plain, tls } = await targets(t, env, { cert: env.pki.serverCert, key: env.pki.serverKey });
  const prom = await startPrometheus(
    t,
    `global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: through-kanal-http
  proxy_url: http://127.0.0.1:${proxyPort}
  static_configs: [{ targets: ['127.0.0.1:${plain}'] }]
- job_name: through-kanal-https
  scheme: https
  proxy_url: http://127.0.0.1:${proxyPort}
  tls_config: { ca_file: ${JSON.stringify(env.pki.caCert)} }
  static_configs: [{ targets: ['127.0.0.1:${tls}'] }]
`,
  );
  await waitScraped(t, prom, ['through-kanal-http', 'through-kanal-https']);
  t.pass();
});

promTest('Prometheus with proxy_url https:// (the mTLS frontend, enable_http2 on) scrapes through it: ALPN picks http/1.1', async (t) => {
  const env = await makeEnv(t);
  const { pki } = env;
  const frontendPort = await closedPort();
  const logs = captureLogger('debug');
  // The mTLS TCP frontend (no --uds-name): the client certificate Prometheus presents is its tls_config's.
  const { server, close } = await startServerInProcess(
    [
      '--server-id',
      'prometheus-test',
      '--cluster-cert',
      pki.serverCert,
      '--cluster-key',
      pki.serverKey,
      '--cluster-ca-cert',
      pki.caCert,
      '--agent-bind-address',
      '127.0.0.1',
      '--agent-port',
      '0',
      '--server-cert',
      pki.frontendCert,
      '--server-key',
      pki.frontendKey,
      '--server-ca-cert',
      pki.frontendCaCert,
      '--server-bind-address',
      '127.0.0.1',
      '--server-port',
      String(frontendPort),
      '--health-port',
      '0',
      '--admin-port',
      '0',
    ],
    { log: logs.log, ephemeralHealthHost: '127.0.0.1' },
  );
  t.teardown(close);
  const { agent } = await startAgent(t, env, server.agentPort);
  await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
  // One CA for the proxy and the target: Go's transport uses the scrape's tls_config for both.
  const { plain, tls } = await targets(t, env, { cert: pki.frontendCert, key: pki.frontendKey });
  const tlsConfig = `{ ca_file: ${JSON.stringify(pki.frontendCaCert)}, cert_file: ${JSON.stringify(pki.frontendClientCert)}, key_file: ${JSON.stringify(pki.frontendClientKey)} }`;
  const prom = await startPrometheus(
    t,
    `global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: mtls-http
  proxy_url: https://127.0.0.1:${frontendPort}
  enable_http2: true
  tls_config: ${tlsConfig}
  static_configs: [{ targets: ['127.0.0.1:${plain}'] }]
- job_name: mtls-https
  scheme: https
  proxy_url: https://127.0.0.1:${frontendPort}
  enable_http2: true
  tls_config: ${tlsConfig}
  static_configs: [{ targets: ['127.0.0.1:${tls}'] }]
`,
  );
  await waitScraped(t, prom, ['mtls-http', 'mtls-https']);
  t.pass();
});

// A clients rule per port: Prometheus, known by its token, scrapes the port its rule allows (up == 1) and not the
// other (up == 0), and the refusal is audited with the client's name.
if (!HAVE_PROMETHEUS) {
  skippedBecause(
    'Prometheus: a clients rule allows one target and denies the other: up 1 and 0, the refusal audited',
    'prometheus is not installed',
  );
} else {
  test('Prometheus: a clients rule allows one target and denies the other: up 1 and 0, the refusal audited', async (t) => {
    const env = await makeEnv(t);
    const proxyPort = await closedPort();
    const { plain, tls } = await targets(t, env, { cert: env.pki.serverCert, key: env.pki.serverKey });
    const clientsFile = path.join(env.dir, 'clients.yaml');
    const auditFile = path.join(env.dir, 'audit.log');
    fs.writeFileSync(path.join(env.dir, 'prometheus.token'), 'prometheus-token\n');
    fs.writeFileSync(
      clientsFile,
      `clients:
- name: prometheus
  token-file: ${JSON.stringify(path.join(env.dir, 'prometheus.token'))}
  allow:
  - cidr: 127.0.0.0/8
    port: ${plain}
- name: kube-apiserver
  uid: ${process.getuid?.() ?? 0}
  allow: all
`,
    );
    const { server, logs } = await startServer(t, env, {
      extraFlags: ['--http-proxy-port', String(proxyPort), '--frontend-clients-config', clientsFile, '--audit-log-path', auditFile],
    });
    t.deepEqual(logs.matching('plain TCP listener without a clients: list'), [], 'with a clients: list it is not open');
    const { agent } = await startAgent(t, env, server.agentPort);
    await waitFor(() => server.registry.size === 1 && agent.tunnels().length === 1, 'agent connected');
    const prom = await startPrometheus(
      t,
      `global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
- job_name: allowed
  # An http:// target goes in absolute form: Go sends the proxy URL's user information as Basic (the token the password).
  proxy_url: http://prometheus:prometheus-token@127.0.0.1:${proxyPort}
  static_configs: [{ targets: ['127.0.0.1:${plain}'] }]
- job_name: denied
  scheme: https
  proxy_url: http://prometheus:prometheus-token@127.0.0.1:${proxyPort}
  tls_config: { insecure_skip_verify: true }
  static_configs: [{ targets: ['127.0.0.1:${tls}'] }]
`,
    );
    await waitScraped(t, prom, ['allowed']);
    const deadline = Date.now() + SCRAPED_WITHIN_MS;
    let up: string | undefined;
    while (Date.now() < deadline && up !== '0') {
      up = (await query(prom.port, 'up{job="denied"}'))[0]?.value[1];
      if (up !== '0') await sleep(500);
    }
    t.is(up, '0', 'the denied target is down');
    const records = (): Record<string, unknown>[] => auditRecords(auditFile);
    await waitFor(() => records().some((r) => r.refusal === 'client_forbidden'), 'the refused dial audited');
    t.like(
      records().find((r) => r.refusal === 'client_forbidden'),
      { destination: `127.0.0.1:${tls}`, client: { name: 'prometheus' }, dial: { result: 'forbidden' } },
    );
  });
}
