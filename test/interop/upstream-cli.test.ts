/**
 * Upstream Konnectivity's command line and metric names (docs/upstream-flags.md, docs/metrics.md):
 * every flag of upstream v0.36's own `--help` is accepted, the argument lists
 * of Kubernetes' "Set up Konnectivity service" manifests run, the admin port
 * serves /metrics and (only when enabled) profiles, and every upstream
 * metric name is on /metrics.
 */
import test from 'ava';
import fs from 'node:fs';
import tls from 'node:tls';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { serverSettings } from '../../src/server/config/settings.js';
import { agentSettings } from '../../src/agent/settings.js';
import {
  freePort,
  httpGet,
  makeWorkspace,
  runCli,
  spawnKanal,
  startHttpBackend,
  startServer,
  waitHealthy,
  waitStatus,
  warnLine,
  withPortRetry,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { runUpstreamTestClient, upstreamBinaries, upstreamUnavailableReason } from '../helpers/upstream.js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';

const DOCS = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../docs/upstream-flags.md');
const unavailable = upstreamUnavailableReason();

interface UpstreamFlag {
  name: string;
  /** pflag's type word; undefined for a boolean. */
  type: string | undefined;
  default: string | undefined;
}

/** The flags of an upstream binary's --help (pflag layout: `  -v, --v Level   text (default 4)`). */
function upstreamFlags(binary: string): UpstreamFlag[] {
  let out: string;
  try {
    out = execFileSync(binary, ['--help'], { encoding: 'utf8', timeout: 20_000 });
  } catch (err) {
    // Some pflag versions exit non-zero after printing the help.
    out = String((err as { stdout?: string }).stdout ?? '');
  }
  const flags: UpstreamFlag[] = [];
  for (const line of out.split('\n')) {
    const m = /^\s+(?:-[a-zA-Z], )?--([a-z0-9-]+)(?: (\S+))?\s{2,}(.*)$/.exec(line);
    if (!m) continue;
    const d = /\(default ([^)]*)\)\s*$/.exec(m[3]);
    flags.push({ name: m[1], type: m[2], default: d ? d[1].replace(/^"(.*)"$/, '$1') : undefined });
  }
  return flags;
}

/** Values for upstream flags that have no default to copy (paths, addresses, suites). */
function samples(ws: Workspace): Record<string, string> {
  const kubeconfig = path.join(ws.dir, 'kubeconfig');
  fs.writeFileSync(
    kubeconfig,
    [
      'apiVersion: v1',
      'kind: Config',
      'current-context: c',
      'clusters: [{name: k, cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}}]',
      'users: [{name: u, user: {token: sample}}]',
      'contexts: [{name: c, context: {cluster: k, user: u}}]',
      '',
    ].join('\n'),
  );
  const token = path.join(ws.dir, 'token');
  fs.writeFileSync(token, 'sample-token');
  return {
    kubeconfig,
    'service-account-token-path': token,
    // Go's zero values, which pflag's help leaves out: client-go's defaults.
    'kubeconfig-qps': '0',
    'kubeconfig-burst': '0',
    'agent-namespace': 'kube-system',
    'agent-service-account': 'konnectivity-agent',
    'authentication-audience': 'system:konnectivity-server',
    'backend-dial-timeout': '0s',
    'graceful-shutdown-timeout': '0s',
    'cipher-suites': 'TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384',
    'tls-min-version': 'VersionTLS12',
    'server-bind-address': '127.0.0.1',
    'agent-bind-address': '127.0.0.1',
    'health-bind-address': '127.0.0.1',
    'health-server-host': '127.0.0.1',
    'agent-identifiers': 'host=node1&ipv4=10.0.0.5&default-route=true',
    'alpn-proto': 'konnectivity',
    alsologtostderrthreshold: 'ERROR',
    'log-dir': ws.dir,
    'log-file': path.join(ws.dir, 'klog.log'),
    vmodule: 'server*=5',
  };
}

/** `--name=value` for every upstream flag not in `skip`: upstream's own default, else a sample; booleans bare unless defaulting to true. */
function upstreamArgs(flags: UpstreamFlag[], skip: ReadonlySet<string>, sample: Record<string, string>): string[] {
  return flags
    .filter((f) => !skip.has(f.name))
    .map((f) => {
      if (f.type === undefined) return f.default === undefined ? `--${f.name}` : `--${f.name}=${f.default}`;
      const value = sample[f.name] ?? f.default;
      if (value === undefined) throw new Error(`no value for --${f.name}: add one to samples()`);
      return `--${f.name}=${value}`;
    });
}

function ignoredFlags(flags: Readonly<Record<string, object>>): string[] {
  return Object.entries(flags)
    .filter(([, spec]) => 'notice' in spec)
    .map(([name]) => name);
}

const COMMANDS = [
  { command: 'server', binary: () => upstreamBinaries().proxyServer, kanal: serverSettings },
  { command: 'agent', binary: () => upstreamBinaries().proxyAgent, kanal: agentSettings },
] as const;

for (const c of COMMANDS) {
  (unavailable ? test.skip : test)(
    `every flag of upstream's proxy-${c.command} --help is a kanal ${c.command} flag, and is documented`,
    (t) => {
      const flags = upstreamFlags(c.binary());
      t.true(flags.length > 40, `parsed ${flags.length} flags from upstream's help`);
      const known = new Set([...Object.keys(c.kanal), 'help']);
      t.deepEqual(
        flags.map((f) => f.name).filter((n) => !known.has(n)),
        [],
        'upstream flags Kanal neither implements nor ignores',
      );
      const docs = fs.readFileSync(DOCS, 'utf8');
      t.deepEqual(
        flags.map((f) => f.name).filter((n) => n !== 'help' && !docs.includes(`\`--${n}\``)),
        [],
        'upstream flags missing from docs/upstream-flags.md',
      );
    },
  );
}

(unavailable ? test.skip : test)(
  "kanal server --dry-run takes every upstream server flag with upstream's default values; each ignored one is named once",
  async (t) => {
    const ws = await makeWorkspace(t);
    const { pki } = ws;
    const base = [
      `--uds-name=${path.join(ws.dir, 'k.sock')}`,
      `--cluster-cert=${pki.serverCert}`,
      `--cluster-key=${pki.serverKey}`,
      `--cluster-ca-cert=${pki.caCert}`,
      `--server-cert=${pki.frontendCert}`,
      `--server-key=${pki.frontendKey}`,
      `--server-ca-cert=${pki.frontendCaCert}`,
    ];
    const skip = new Set(['help', ...base.map((a) => a.slice(2, a.indexOf('=')))]);
    const args = upstreamArgs(upstreamFlags(upstreamBinaries().proxyServer), skip, samples(ws));
    const r = await runCli(['server', '--dry-run', ...base, ...args], 30_000);
    t.is(r.code, 0, r.stderr);
    const config = JSON.parse(r.stdout) as {
      notices: string[];
      logLevel: string;
      settings: { 'backend-dial-timeout': { ms: number } };
      admin: { host: string; port: number; profiling: boolean };
      tls: { minVersion: string; ciphers: string };
    };
    const given = ignoredFlags(serverSettings).filter((n) => args.some((a) => a.startsWith(`--${n}=`) || a === `--${n}`));
    t.true(given.length >= 15, `${given.length} ignored flags given`);
    for (const n of given) t.is(config.notices.filter((m) => m.startsWith(`--${n} ignored: `)).length, 1, `one notice for --${n}`);
    t.true(
      config.notices.some((m) => m.startsWith('--backend-dial-timeout 0s: ')),
      'upstream\'s "no timeout" is named',
    );
    t.is(config.settings['backend-dial-timeout'].ms, 10_000, 'a dial through an agent stays bounded');
    t.is(config.logLevel, 'debug', "upstream's default -v 4 is debug");
    t.deepEqual(config.admin, { host: '127.0.0.1', port: 8095, profiling: true, limits: { idleTimeoutMs: 10_000, maxConnections: 32 } });
    t.is(config.tls.minVersion, 'TLSv1.2');
    t.regex(config.tls.ciphers, /^ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:TLS_AES_256_GCM_SHA384/);
  },
);

(unavailable ? test.skip : test)(
  "kanal agent --dry-run takes every upstream agent flag with upstream's default values; each ignored one is named once",
  async (t) => {
    const ws = await makeWorkspace(t);
    const { pki } = ws;
    const base = [
      '--proxy-server-host=127.0.0.1',
      `--ca-cert=${pki.caCert}`,
      `--agent-cert=${pki.agentCert}`,
      `--agent-key=${pki.agentKey}`,
    ];
    const skip = new Set(['help', ...base.map((a) => a.slice(2, a.indexOf('=')))]);
    const args = upstreamArgs(upstreamFlags(upstreamBinaries().proxyAgent), skip, samples(ws));
    const r = await runCli(['agent', '--dry-run', ...base, ...args], 30_000);
    t.is(r.code, 0, r.stderr);
    const config = JSON.parse(r.stdout) as {
      notices: string[];
      logLevel: string;
      health: { host: string };
      admin: { host: string; port: number };
      server: { alpnProtocols: string[] };
    };
    const given = ignoredFlags(agentSettings).filter((n) => args.some((a) => a.startsWith(`--${n}=`) || a === `--${n}`));
    t.true(given.length >= 15, `${given.length} ignored flags given`);
    for (const n of given) t.is(config.notices.filter((m) => m.startsWith(`--${n} ignored: `)).length, 1, `one notice for --${n}`);
    t.is(config.logLevel, 'debug');
    t.is(config.health.host, '127.0.0.1', '--health-server-host is the health bind address');
    t.deepEqual(config.admin, { host: '127.0.0.1', port: 8094, profiling: true, limits: { idleTimeoutMs: 10_000, maxConnections: 32 } });
    t.deepEqual(config.server.alpnProtocols, ['konnectivity']);
  },
);

test('unknown flags stay refused; upstream values Kanal will not serve are refused with the flag named', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const base = [
    'server',
    '--dry-run',
    `--uds-name=${path.join(ws.dir, 'k.sock')}`,
    `--cluster-cert=${pki.serverCert}`,
    `--cluster-key=${pki.serverKey}`,
    `--cluster-ca-cert=${pki.caCert}`,
  ];
  const cases: [string[], RegExp][] = [
    [['--no-such-flag=1'], /Unknown argument: no-such-flag/],
    [
      ['--tls-min-version=VersionTLS10'],
      /--tls-min-version "VersionTLS10": Kanal serves TLS 1\.2 or newer only; use VersionTLS12 or VersionTLS13/,
    ],
    [['--cipher-suites=TLS_RSA_WITH_RC4_128_SHA'], /--cipher-suites: "TLS_RSA_WITH_RC4_128_SHA" is not a TLS 1\.2 suite Kanal serves/],
    [['--v=-1'], /--v must be a whole number of at least 0/],
  ];
  for (const [extra, message] of cases) {
    const r = await runCli([...base, ...extra]);
    t.is(r.code, 2, extra.join(' '));
    t.regex(r.stderr, message);
  }
  const explicit = await runCli([...base, '--v=9', '--log-level=warn']);
  t.is((JSON.parse(explicit.stdout) as { logLevel: string }).logLevel, 'warn', '--log-level wins over --v');
  const agentBadAlpn = await runCli(['agent', '--dry-run', '--proxy-server-host=127.0.0.1', `--ca-cert=${pki.caCert}`, '--alpn-proto=a b']);
  t.is(agentBadAlpn.code, 2);
  t.regex(agentBadAlpn.stderr, /--alpn-proto "a b": 1-255 printable characters without spaces/);
});

/** Upstream's metric names (v0.36's pkg/server/metrics and pkg/agent/metrics). */
const SERVER_METRICS = [
  'dial_duration_seconds',
  'frontend_write_duration_seconds',
  'grpc_connections',
  'http_connections',
  'ready_backend_connections',
  'ready_backends',
  'pending_backend_dials',
  'established_connections',
  'full_receive_channels',
  'dial_failure_count',
  'culled_leases_count',
  'lease_delete_total',
  'lease_delete_latency_seconds',
  'lease_list_total',
  'lease_list_latency_seconds',
].map((n) => `konnectivity_network_proxy_server_${n}`);
const AGENT_METRICS = [
  'dial_duration_seconds',
  'server_connection_failure_count',
  'endpoint_dial_failure_total',
  'open_server_connections',
  'known_server_count',
  'open_endpoint_connections',
  'lease_lists_total',
  'lease_watches_total',
  'lease_list_latency_seconds',
].map((n) => `konnectivity_network_proxy_agent_${n}`);

/** Metric families named by # TYPE lines, and the sample lines. */
async function scrape(port: number): Promise<{ families: Set<string>; text: string }> {
  const r = await httpGet(`http://127.0.0.1:${port}/metrics`, 5000);
  if (r.status !== 200) throw new Error(`/metrics on ${port}: ${r.status}`);
  return { families: new Set([...r.body.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1])), text: r.body };
}

function sample(text: string, series: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}

/**
 * The argument lists of Kubernetes' "Set up Konnectivity service" manifests
 * (kubernetes/website content/en/examples/admin/konnectivity/), with this
 * host's paths and free ports, bind addresses kept on loopback, and client
 * certificates in place of the ServiceAccount token flags (token
 * authentication has its own tests: kube-token-auth, kube-upstream-wire).
 */
test('the setup-konnectivity manifests run: agent connects, admin ports serve every upstream metric name, notices once', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const uds = path.join(ws.dir, 'konnectivity-server.socket');
  // freePort() races other test files: a start that dies of EADDRINUSE is retried with fresh ports.
  const { server, agentPort, adminPort, healthPort } = await withPortRetry(async () => {
    const [agentPort, adminPort, healthPort] = [await freePort(), await freePort(), await freePort()];
    const serverArgs = [
      '--logtostderr=true',
      `--uds-name=${uds}`,
      `--cluster-cert=${pki.serverCert}`,
      `--cluster-key=${pki.serverKey}`,
      '--mode=grpc',
      '--server-port=0',
      `--agent-port=${agentPort}`,
      `--admin-port=${adminPort}`,
      `--health-port=${healthPort}`,
      // In place of --agent-namespace, --agent-service-account, --kubeconfig, --authentication-audience:
      `--cluster-ca-cert=${pki.caCert}`,
      // This host, not a control plane node: loopback only.
      '--agent-bind-address=127.0.0.1',
      '--health-bind-address=127.0.0.1',
    ];
    const server = spawnKanal(t, {
      name: 'manifest-server',
      args: ['server', ...serverArgs],
      logFile: path.join(ws.dir, 'manifest-server.log'),
    });
    await waitHealthy(server, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    return { server, agentPort, adminPort, healthPort };
  });
  const own = await issueAgentCertificate(pki, 'manifest-agent');
  const { agent, agentAdmin } = await withPortRetry(async () => {
    const [agentAdmin, agentHealth] = [await freePort(), await freePort()];
    const agentArgs = [
      '--logtostderr=true',
      `--ca-cert=${pki.caCert}`,
      '--proxy-server-host=127.0.0.1',
      `--proxy-server-port=${agentPort}`,
      `--admin-server-port=${agentAdmin}`,
      `--health-server-port=${agentHealth}`,
      // In place of --service-account-token-path:
      `--agent-cert=${own.cert}`,
      `--agent-key=${own.key}`,
      '--health-server-host=127.0.0.1',
      // The kind example's agent flags (kubernetes-sigs/apiserver-network-proxy examples/kind/konnectivity-agent-ds.yaml).
      '--sync-interval=5s',
      '--sync-interval-cap=30s',
      '--probe-interval=5s',
      '--agent-identifiers=ipv4=127.0.0.1',
    ];
    const agent = spawnKanal(t, {
      name: 'manifest-agent',
      args: ['agent', ...agentArgs],
      logFile: path.join(ws.dir, 'manifest-agent.log'),
    });
    await waitHealthy(agent, `http://127.0.0.1:${agentHealth}/readyz`, 20_000);
    return { agent, agentAdmin };
  });
  await waitStatus(`http://127.0.0.1:${healthPort}/readyz`, 200, 20_000);

  if (unavailable) {
    t.log(`no dial through the kube-apiserver's client: ${unavailable}`);
  } else {
    // A dial as the kube-apiserver makes it (konnectivity-client, --mode grpc over the Unix socket).
    const backend = await startHttpBackend(t, 'hello through kanal');
    const r = await runUpstreamTestClient(ws, {
      mode: 'grpc',
      uds,
      host: '127.0.0.1',
      port: backend.port,
      path: '/',
      bodyBytes: 19,
      timeoutMs: 20_000,
    });
    t.is(r.body?.toString(), 'hello through kanal', r.log);
    // And one to a port nobody listens on: the agent's dial fails.
    const closed = await freePort();
    const failed = await runUpstreamTestClient(ws, {
      mode: 'grpc',
      uds,
      host: '127.0.0.1',
      port: closed,
      path: '/',
      bodyBytes: 0,
      timeoutMs: 20_000,
    });
    t.is(failed.body, undefined);
  }

  const s = await scrape(adminPort);
  t.deepEqual(
    SERVER_METRICS.filter((n) => !s.families.has(n)),
    [],
    'upstream server metric names missing on the admin port',
  );
  t.is(sample(s.text, 'konnectivity_network_proxy_server_grpc_connections{service_method="Connect"}'), 1);
  t.is(sample(s.text, 'konnectivity_network_proxy_server_ready_backends{proxy_strategy="default"}'), 1);
  if (!unavailable) {
    t.is(sample(s.text, 'konnectivity_network_proxy_server_dial_duration_seconds_count'), 1, "the dial is in upstream's histogram");
    t.is(
      sample(s.text, 'konnectivity_network_proxy_server_dial_failure_count{reason="error_response"}'),
      1,
      "the failed dial, with upstream's reason",
    );
  }
  t.true(s.families.has('process_cpu_user_seconds_total'), "process metrics under prom-client's own names");
  t.false(s.text.includes('kanal_server_process_'), 'no doubled process prefix');
  const health = await scrape(healthPort);
  t.deepEqual(
    SERVER_METRICS.filter((n) => !health.families.has(n)),
    [],
    'and on the health port',
  );

  const a = await scrape(agentAdmin);
  t.deepEqual(
    AGENT_METRICS.filter((n) => !a.families.has(n)),
    [],
    'upstream agent metric names missing on the admin port',
  );
  t.is(sample(a.text, 'konnectivity_network_proxy_agent_open_server_connections'), 1);
  t.is(sample(a.text, 'konnectivity_network_proxy_agent_known_server_count'), 1);
  if (!unavailable) {
    t.is(sample(a.text, 'konnectivity_network_proxy_agent_dial_duration_seconds_count'), 1);
    t.is(sample(a.text, 'konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason="unknown"}'), 1);
  }

  for (const [proc, flag] of [
    [server, 'logtostderr'],
    [agent, 'logtostderr'],
    [agent, 'probe-interval'],
  ] as const) {
    t.is(
      proc.logLines().filter((l) => typeof l.msg === 'string' && l.msg.startsWith(`--${flag} ignored: `)).length,
      1,
      `${proc.name}: --${flag} named once`,
    );
  }
  const pprof = await httpGet(`http://127.0.0.1:${adminPort}/debug/pprof/`);
  t.is(pprof.status, 404);
  t.regex(pprof.body, /no Go pprof\. With --enable-profiling this port serves \/debug\/kanal\/cpu-profile/);
  const off = await httpGet(`http://127.0.0.1:${adminPort}/debug/kanal/heap-snapshot`);
  t.is(off.status, 404, 'no profiles unless --enable-profiling');
  t.regex(off.body, /profiling is off: start with --enable-profiling/);
  t.is(await agent.stop(), 0);
  t.is(await server.stop(), 0);
});

test('--enable-profiling: a CPU profile and a heap snapshot on the admin port, one at a time, bounded', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'profiled', extraArgs: ['--enable-profiling'] });
  const admin = `http://127.0.0.1:${server.adminPort}`;
  const profile = httpGet(`${admin}/debug/kanal/cpu-profile?seconds=2`, 15_000);
  await server.waitForLog((l) => l.msg === 'taking a CPU profile', 10_000, 'the profile started');
  const busy = await httpGet(`${admin}/debug/kanal/heap-snapshot`, 5000);
  t.is(busy.status, 409, 'one profile at a time');
  t.regex(busy.body, /a cpu profile is being taken/);
  const p = await profile;
  t.is(p.status, 200);
  const cpu = JSON.parse(p.body) as { nodes: unknown[]; startTime: number; endTime: number };
  t.true(cpu.nodes.length > 0);
  t.true(cpu.endTime - cpu.startTime >= 1_900_000, 'two seconds of samples (µs)');
  const heap = await httpGet(`${admin}/debug/kanal/heap-snapshot`, 60_000);
  t.is(heap.status, 200);
  t.true((JSON.parse(heap.body) as { snapshot: { node_count: number } }).snapshot.node_count > 1000);
  for (const bad of ['0', '301', '1.5', 'x']) {
    const r = await httpGet(`${admin}/debug/kanal/cpu-profile?seconds=${bad}`);
    t.is(r.status, 400, `seconds=${bad}`);
  }
  t.is(await server.stop(), 0);
});

test('--alpn-proto: the agent offers the extra protocol before h2 in its TLS handshake', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  // A front that routes by ALPN: it accepts only "konnectivity", so it negotiates it only if the agent offered it.
  const offered: (string | false | null)[] = [];
  const front = tls.createServer(
    { cert: fs.readFileSync(pki.serverCert), key: fs.readFileSync(pki.serverKey), ALPNProtocols: ['konnectivity'] },
    (s) => {
      offered.push(s.alpnProtocol);
      s.destroy();
    },
  );
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => front.close());
  const port = (front.address() as AddressInfo).port;
  const agent = spawnKanal(t, {
    name: 'alpn-agent',
    args: [
      'agent',
      '--proxy-server-host=127.0.0.1',
      `--proxy-server-port=${port}`,
      `--ca-cert=${pki.caCert}`,
      '--alpn-proto=konnectivity',
      // No health port (0 disables it): nothing here asks it, and a freePort() one could be taken before the agent binds it.
      '--health-server-port=0',
      '--admin-server-port=0',
      '--sync-interval=200ms',
      '--sync-interval-cap=1s',
    ],
    logFile: path.join(ws.dir, 'alpn-agent.log'),
  });
  await agent.waitForLog((l) => l.msg === 'cannot connect to proxy server', 20_000, 'a first attempt');
  // The agent may refuse the protocol and log it before this process runs the front's handshake callback (TLS 1.3:
  // the client is done a flight earlier than the server): wait for the front's side too, bounded.
  for (let i = 0; i < 100 && offered.length === 0; i++) await sleep(50);
  t.true(offered.includes('konnectivity'), `negotiated: ${JSON.stringify(offered)}`);
});

test('an agent whose server (or a front before it) negotiates another ALPN protocol, or none, logs it and retries instead of aborting', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  for (const protocols of [undefined, ['konnectivity']]) {
    const front = tls.createServer(
      { cert: fs.readFileSync(pki.serverCert), key: fs.readFileSync(pki.serverKey), ...(protocols ? { ALPNProtocols: protocols } : {}) },
      (s) => s.destroy(),
    );
    await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', () => resolve()));
    const port = (front.address() as AddressInfo).port;
    const name = `alpn-${protocols ? 'other' : 'none'}`;
    const agent = spawnKanal(t, {
      name,
      args: [
        'agent',
        '--proxy-server-host=127.0.0.1',
        `--proxy-server-port=${port}`,
        `--ca-cert=${pki.caCert}`,
        '--alpn-proto=konnectivity',
        // No health port, as above.
        '--health-server-port=0',
        '--admin-server-port=0',
        '--sync-interval=200ms',
        '--sync-interval-cap=400ms',
        '--log-level=debug',
      ],
      logFile: path.join(ws.dir, `${name}.log`),
    });
    // Node's http2 aborted the process (SIGABRT) on a socket destroyed under it.
    // Each attempt is a debug line; the warning, once per cause, names ALPN (connect-diagnosis.ts).
    const refused = (l: { msg: string; err?: unknown }): boolean =>
      l.msg === 'connect attempt failed' && String(l.err).includes('server did not negotiate HTTP/2 via ALPN');
    await agent.waitForLog(
      warnLine('cannot connect to proxy server', (l) => /did not agree on HTTP\/2 in ALPN/.test(String(l.err))),
      20_000,
      'the warning',
    );
    await agent.waitForLog(refused, 20_000, 'a refused attempt');
    const deadline = Date.now() + 20_000;
    while (agent.logLines().filter(refused).length < 2 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    t.true(agent.running(), `${name}: still running after ${agent.logLines().filter(refused).length} refused attempts`);
    t.is(await agent.stop(), 0);
    front.close();
  }
});

test("--tls-min-version and --cipher-suites hold on the agent port; the kind example's server flags pass --dry-run", async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const server = await startServer(t, ws, { name: 'tls13', extraArgs: ['--tls-min-version=VersionTLS13'] });
  const handshake = (agentPort: number, opts: tls.ConnectionOptions): Promise<string> =>
    new Promise((resolve) => {
      // With an agent certificate: the server keeps the connection, so what the client sees is the handshake alone.
      const s = tls.connect(
        {
          host: '127.0.0.1',
          port: agentPort,
          ca: fs.readFileSync(pki.caCert),
          cert: fs.readFileSync(pki.agentCert),
          key: fs.readFileSync(pki.agentKey),
          ALPNProtocols: ['h2'],
          ...opts,
        },
        () => {
          resolve(String(s.getProtocol()));
          s.destroy();
        },
      );
      s.once('error', (err: NodeJS.ErrnoException) => resolve(`refused: ${err.code ?? err.message}`));
      s.setTimeout(10_000, () => s.destroy(new Error('timeout')));
    });
  t.is(await handshake(server.agentPort, {}), 'TLSv1.3');
  t.regex(
    await handshake(server.agentPort, { maxVersion: 'TLSv1.2' }),
    /^refused: /,
    'TLS 1.2 refused below --tls-min-version VersionTLS13',
  );
  t.is(await server.stop(), 0);

  const suites = await startServer(t, ws, { name: 'suites', extraArgs: ['--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384'] });
  t.is(
    await handshake(suites.agentPort, { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-AES256-GCM-SHA384' }),
    'TLSv1.2',
    'the allowed TLS 1.2 suite',
  );
  t.regex(
    await handshake(suites.agentPort, { maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-AES128-GCM-SHA256' }),
    /^refused: /,
    'a TLS 1.2 suite not in --cipher-suites',
  );
  t.is(await handshake(suites.agentPort, {}), 'TLSv1.3', 'TLS 1.3 unaffected');
  t.is(await suites.stop(), 0);

  // kubernetes-sigs/apiserver-network-proxy examples/kind/konnectivity-server.yaml, token flags replaced by a client CA.
  const kind = [
    `--log-file=${path.join(ws.dir, 'konnectivity-server.log')}`,
    '--logtostderr=true',
    '--log-file-max-size=0',
    `--uds-name=${path.join(ws.dir, 'konnectivity-server.socket')}`,
    `--cluster-cert=${pki.serverCert}`,
    `--cluster-key=${pki.serverKey}`,
    '--server-port=0',
    '--agent-port=8091',
    '--health-port=8092',
    '--admin-port=8093',
    '--keepalive-time=1h',
    '--mode=grpc',
    `--cluster-ca-cert=${pki.caCert}`,
  ];
  const r = await runCli(['server', '--dry-run', ...kind]);
  t.is(r.code, 0, r.stderr);
  const c = JSON.parse(r.stdout) as { notices: string[]; settings: { 'keepalive-time': number } };
  t.is(c.settings['keepalive-time'], 3_600_000);
  t.deepEqual(
    c.notices.map((n) => n.slice(0, n.indexOf(' '))),
    ['--logtostderr', '--log-file', '--log-file-max-size'],
  );
});
