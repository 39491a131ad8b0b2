/**
 * Command-line validation: the pure validateServerArgs/validateAgentArgs
 * (flags parsed by yargs exactly as the CLI declares them), and the real
 * `kanal` process for exit codes and messages (2 on usage errors).
 */
import test, { type ExecutionContext } from 'ava';
import os from 'node:os';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import yargs, { type Argv } from 'yargs';
import fs from 'node:fs';
import { loadServerCredentials, serverBuilder, validateServerArgs, type ServerArgs } from '../../src/cli/server-command.js';
import { buildServerOptions } from '../../src/server/assembly/server-assembly.js';
import { agentBuilder, loadAgentCredentials, validateAgentArgs, type AgentArgs } from '../../src/cli/agent-command.js';
import { buildAgentOptions } from '../../src/agent/assembly.js';
import type { ServerConfig } from '../../src/server/config/config.js';
import type { AgentConfig } from '../../src/agent/config.js';

/** The options of the settings alone, with the credentials the flags name (as the CLI reads them). */
const serverOptionsOf = (c: ServerConfig): ReturnType<typeof buildServerOptions> => buildServerOptions(c, loadServerCredentials(c));
const agentOptionsOf = (c: AgentConfig): ReturnType<typeof buildAgentOptions> => buildAgentOptions(c, loadAgentCredentials(c));
import { DEFAULT_CP_TO_NODE_CONNECTIONS, DEFAULT_LIMITS, DEFAULT_NODE_TO_CP_CONNECTIONS } from '../../src/tunnel/limits.js';
import { defaultAgentID } from '../../src/agent/settings.js';
import { logLevelFrom } from '../../src/settings/process-settings.js';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { UsageError } from '../../src/common/usage-error.js';

const here = path.dirname(fileURLToPath(import.meta.url));
const MAIN = path.resolve(here, '..', '..', 'src', 'cli', 'main.js');

/** Parses with the commands' own builders (flags and middleware), but throws instead of exiting. */
function parse<T>(builder: (y: Argv) => Argv<T>, argv: string[]): T {
  return builder(yargs(argv))
    .strict()
    .exitProcess(false)
    .parserConfiguration({ 'camel-case-expansion': false, 'strip-aliased': true })
    .fail((message, err) => {
      throw err ?? new Error(message);
    })
    .parseSync() as unknown as T;
}

const parseServer = (argv: string[]): ServerArgs => parse<ServerArgs>(serverBuilder, argv);
const parseAgent = (argv: string[]): AgentArgs => parse<AgentArgs>(agentBuilder, argv);

// Files are never read by validation, so these need not exist (--dry-run reads them: see realPki).
const SERVER_OK = [
  '--cluster-cert',
  '/nonexistent/agent-port.crt',
  '--cluster-key',
  '/nonexistent/agent-port.key',
  '--cluster-ca-cert',
  '/nonexistent/ca.crt',
  '--uds-name',
  '/tmp/kanal-test.sock',
];
const AGENT_OK = ['--proxy-server-host', 'cp.example', '--ca-cert', '/nonexistent/ca.crt'];
const NODE = ['--bind-address', '10.200.0.1'];

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function kanal(args: string[]): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [MAIN, ...args], { timeout: 20_000, env: { ...process.env, NODE_OPTIONS: '' } }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

// ---------- pure validation: server ----------

test('validateServerArgs accepts a minimal UDS configuration and fills upstream defaults', (t) => {
  const c = validateServerArgs(parseServer(SERVER_OK));
  t.is(c.settings['agent-port'], 8091);
  t.is(c.settings['agent-bind-address'], '0.0.0.0');
  t.is(c.settings['cluster-ca-cert'], '/nonexistent/ca.crt');
  t.false(c.settings['allow-unauthenticated-agents']);
  t.is(c.settings.mode, 'both');
  t.is(c.settings['frontend-header-timeout'], 30_000);
  t.deepEqual(c.frontend, { uds: { path: '/tmp/kanal-test.sock', deleteExisting: true, mode: 0o660 } });
  const limits = { maxConnections: 32, idleTimeoutMs: 10_000 };
  t.deepEqual(c.health, { host: '0.0.0.0', port: 8092, limits, metrics: 'any' }, 'one cluster: /metrics to any caller, as upstream');
  t.deepEqual(c.admin, { host: '127.0.0.1', port: 8095, profiling: false, limits }, "upstream's admin port, loopback only, no profiling");
  t.is(c.logLevel, 'info');
  t.deepEqual(c.notices, []);
  t.is(c.settings['backend-dial-timeout'].ms, 10_000);
  t.deepEqual(c.settings['proxy-strategies'], ['default']);
  t.deepEqual(c.settings['allowed-destination'], []);
  t.is(c.settings['server-count'], 1);
  t.true(c.settings['server-id'].length > 0);
});

test('validateServerArgs: durations, TCP frontend, allow-list, health 0 disables', (t) => {
  const c = validateServerArgs(
    parseServer([
      '--cluster-cert',
      'a',
      '--cluster-key',
      'b',
      '--cluster-ca-cert',
      'c',
      '--server-cert',
      'fc',
      '--server-key',
      'fk',
      '--server-ca-cert',
      'fca',
      '--server-port',
      '0',
      '--backend-dial-timeout',
      '1m30s',
      '--destination-dial-timeout',
      '500ms',
      '--allowed-destination',
      '10.0.0.1:6443',
      '--allowed-destination',
      '[fd00::1]:443',
      '--allowed-destination',
      'kas.internal:6443',
      '--health-port',
      '0',
      '--server-count',
      '3',
      '--server-id',
      'cp-1',
      '--frontend-client-subject',
      'CN=kube-apiserver',
      '--agent-client-eku',
      '1.3.6.1.4.1.55555.1',
      '--max-agents-per-credential',
      '50',
      '--keepalive-time',
      '5s',
      '--keepalive-timeout',
      '15s',
      '--proxy-strategies',
      'destHost,,defaultRoute,default',
    ]),
  );
  t.deepEqual(c.settings['proxy-strategies'], ['destHost', 'defaultRoute', 'default']);
  t.is(c.settings['backend-dial-timeout'].ms, 90_000);
  t.is(c.settings['destination-dial-timeout'], 500);
  t.deepEqual(c.frontend.tcp, {
    host: '0.0.0.0',
    port: 0,
    certFile: 'fc',
    keyFile: 'fk',
    caFile: 'fca',
    clientPins: { subjects: [{ attribute: 'CN', value: 'kube-apiserver', prefix: false, text: 'CN=kube-apiserver' }], ekus: [] },
  });
  t.deepEqual(c.agent.clientPins, { subjects: [], ekus: ['1.3.6.1.4.1.55555.1'] });
  t.is(c.settings['max-agents-per-credential'], 50);
  t.deepEqual([c.settings['keepalive-time'], c.settings['keepalive-timeout']], [5000, 15_000]);
  t.is(c.frontend.uds, undefined);
  t.deepEqual(c.settings['allowed-destination'], ['10.0.0.1:6443', '[fd00::1]:443', 'kas.internal:6443']);
  t.is(c.health, undefined);
  t.is(c.settings['server-count'], 3);
  t.is(c.settings['server-id'], 'cp-1');
});

const serverRefusals: [string, string[], RegExp][] = [
  ['no agent-port certificate', ['--cluster-ca-cert', 'c', '--uds-name', 's'], /--cluster-cert and --cluster-key/],
  [
    'no client CA and not explicitly insecure',
    ['--cluster-cert', 'a', '--cluster-key', 'b', '--uds-name', 's'],
    /--cluster-ca-cert is required.*--allow-unauthenticated-agents/,
  ],
  ['no frontend', ['--cluster-cert', 'a', '--cluster-key', 'b', '--cluster-ca-cert', 'c'], /--uds-name, or --server-cert and --server-key/],
  [
    'TCP frontend without client CA',
    ['--cluster-cert', 'a', '--cluster-key', 'b', '--cluster-ca-cert', 'c', '--server-cert', 'x', '--server-key', 'y'],
    /--server-ca-cert is required/,
  ],
  ['agent port out of range', [...SERVER_OK, '--agent-port', '70000'], /--agent-port must be a port number 0-65535, got 70000/],
  ['agent port not a number', [...SERVER_OK, '--agent-port', 'abc'], /--agent-port must be a port number/],
  ['negative health port', [...SERVER_OK, '--health-port', '-1'], /--health-port must be a port number/],
  ['fractional port', [...SERVER_OK, '--agent-port', '80.5'], /--agent-port must be a port number/],
  ['server count 0', [...SERVER_OK, '--server-count', '0'], /--server-count must be a positive integer/],
  ['duration without unit', [...SERVER_OK, '--backend-dial-timeout', '10'], /--backend-dial-timeout: duration "10" needs a unit/],
  ['garbage duration', [...SERVER_OK, '--backend-dial-timeout', '5x'], /--backend-dial-timeout: invalid duration "5x"/],
  ['zero duration', [...SERVER_OK, '--destination-dial-timeout', '0s'], /--destination-dial-timeout: must be positive/],
  [
    'allowed destination without port',
    [...SERVER_OK, '--allowed-destination', 'kas.internal'],
    /--allowed-destination: .*expected host:port/,
  ],
  [
    'allowed destination with bare IPv6',
    [...SERVER_OK, '--allowed-destination', 'fd00::1:443'],
    /--allowed-destination: .*IPv6 hosts must be in brackets/,
  ],
  ['keepalive below 1 s', [...SERVER_OK, '--keepalive-time', '500ms'], /--keepalive-time must be at least 1s/],
  [
    'agents per credential not a whole number',
    [...SERVER_OK, '--max-agents-per-credential', '1.5'],
    /--max-agents-per-credential must be a whole number of at least 1, got 1.5/,
  ],
  ['allowed destination port 0', [...SERVER_OK, '--allowed-destination', '10.0.0.1:0'], /--allowed-destination: .*out of range/],
  ['tiny max message size', [...SERVER_OK, '--max-message-size', '100'], /--max-message-size must be at least 65536/],
  ['too few health and admin connections', [...SERVER_OK, '--http-max-connections', '2'], /--http-max-connections must be .*4/],
  ['idle timeout without unit', [...SERVER_OK, '--http-idle-timeout', '10'], /--http-idle-timeout/],
  [
    'connection window below the first window',
    [...SERVER_OK, '--max-connection-window', '65536'],
    /--max-connection-window must be a whole number of bytes from 1048576 .* to 67108864, got 65536/,
  ],
  [
    'connection window above the ceiling',
    [...SERVER_OK, '--max-connection-window', String(128 * 1024 * 1024)],
    /--max-connection-window .*got 134217728/,
  ],
  [
    'connection window not a number',
    [...SERVER_OK, '--max-connection-window', '4MiB'],
    /--max-connection-window .*got a value that is not a number/,
  ],
  [
    'socket mode not octal',
    [...SERVER_OK, '--uds-mode', '0x1b6'],
    /--uds-mode must be octal permission bits such as 0660 or 0600, got "0x1b6"/,
  ],
  ['socket mode with special bits', [...SERVER_OK, '--uds-mode', '4660'], /--uds-mode must be octal permission bits/],
  [
    'socket mode the owner cannot connect with',
    [...SERVER_OK, '--uds-mode', '0460'],
    /--uds-mode 0460 leaves the owner without write permission/,
  ],
  [
    'socket group unknown',
    [...SERVER_OK, '--uds-group', 'no-such-group-kanal'],
    /--uds-group: no group "no-such-group-kanal" in \/etc\/group; pass an existing group or its numeric ID/,
  ],
  [
    'unknown proxy strategy',
    [...SERVER_OK, '--proxy-strategies', 'destHost,nearest'],
    /--proxy-strategies: unknown proxy strategy "nearest" \(known: destHost, defaultRoute, default\)/,
  ],
  [
    'proxy strategy twice',
    [...SERVER_OK, '--proxy-strategies', 'default,default'],
    /--proxy-strategies: proxy strategy default is listed twice/,
  ],
  ['no proxy strategy', [...SERVER_OK, '--proxy-strategies', ','], /--proxy-strategies: proxy strategies cannot be empty/],
];

test("validateServerArgs: --uds-mode and --uds-group set the socket's mode and group (names looked up, numbers taken as they are)", (t) => {
  const c = validateServerArgs(parseServer([...SERVER_OK, '--uds-mode', '600', '--uds-group', 'root']));
  t.deepEqual(c.frontend.uds, { path: '/tmp/kanal-test.sock', deleteExisting: true, mode: 0o600, gid: 0 });
  t.is(validateServerArgs(parseServer([...SERVER_OK, '--uds-group', '4242'])).frontend.uds?.gid, 4242);
});

for (const [name, argv, message] of serverRefusals) {
  test(`validateServerArgs refuses: ${name}`, (t) => {
    const err = t.throws(() => validateServerArgs(parseServer(argv)), { instanceOf: UsageError });
    t.regex(err?.message ?? '', message);
  });
}

test('--max-connection-window: 4 MiB unless set; accepted from 1 MiB (no growth) on both commands', (t) => {
  t.is(validateServerArgs(parseServer(SERVER_OK)).settings['max-connection-window'], 4 * 1024 * 1024);
  t.is(validateAgentArgs(parseAgent(AGENT_OK)).settings['max-connection-window'], 4 * 1024 * 1024);
  t.is(
    validateServerArgs(parseServer([...SERVER_OK, '--max-connection-window', '1048576'])).settings['max-connection-window'],
    1024 * 1024,
  );
  t.is(
    validateAgentArgs(parseAgent([...AGENT_OK, '--max-connection-window', '8388608'])).settings['max-connection-window'],
    8 * 1024 * 1024,
  );
});

test('--max-connection-window reaches the options the server and agent build their tunnels from', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-cli-window-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const pki = await writeThrowawayPki(dir, { serverIps: ['127.0.0.1'] });
  const server = await serverOptionsOf(
    validateServerArgs(
      parseServer([
        '--cluster-cert',
        pki.serverCert,
        '--cluster-key',
        pki.serverKey,
        '--cluster-ca-cert',
        pki.caCert,
        '--uds-name',
        path.join(dir, 's.sock'),
        '--max-connection-window',
        '2097152',
      ]),
    ),
  );
  t.deepEqual(server.tenant.limits, { maxWindowBytes: 2 * 1024 * 1024, peerReadTimeoutMs: 60_000 });
  const agent = await agentOptionsOf(
    validateAgentArgs(parseAgent(['--proxy-server-host', 'cp.example', '--ca-cert', pki.caCert, '--max-connection-window', '1048576'])),
  );
  t.deepEqual(agent.limits, {
    maxWindowBytes: 1024 * 1024,
    peerReadTimeoutMs: 60_000,
    maxInboundConnections: DEFAULT_CP_TO_NODE_CONNECTIONS,
    maxOutboundConnections: DEFAULT_NODE_TO_CP_CONNECTIONS,
    maxPendingDials: DEFAULT_LIMITS.maxPendingDials,
    dialRate: 0,
    dialBurst: DEFAULT_LIMITS.dialBurst,
  });
});

test('the per-agent caps, the server-wide cap and --peer-read-timeout reach the server options; the server-wide cap defaults to half the open-files limit', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-cli-caps-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const pki = await writeThrowawayPki(dir, { serverIps: ['127.0.0.1'] });
  const base = [...serverPkiFlags(pki), '--uds-name', path.join(dir, 's.sock')];
  const server = await serverOptionsOf(
    validateServerArgs(
      parseServer([
        ...base,
        '--max-node-to-cp-connections-per-agent',
        '10',
        '--max-cp-to-node-connections-per-agent',
        '20',
        '--max-pending-dials-per-agent',
        '30',
        '--max-node-to-cp-connections',
        '40',
        '--peer-read-timeout',
        '5s',
        '--dial-rate-per-agent',
        '50',
        '--dial-burst-per-agent',
        '60',
      ]),
    ),
  );
  t.deepEqual(server.tenant.agentLimits, {
    maxInboundConnections: 10,
    maxOutboundConnections: 20,
    maxPendingDials: 30,
    dialRate: 50,
    dialBurst: 60,
  });
  t.is(server.maxNodeToCpConnections, 40);
  t.is(server.tenant.limits?.peerReadTimeoutMs, 5000);
  const defaults = validateServerArgs(parseServer(base));
  const d = defaults.settings;
  t.deepEqual(
    [d['max-node-to-cp-connections-per-agent'], d['max-cp-to-node-connections-per-agent'], d['max-pending-dials-per-agent']],
    [1024, 8192, 1024],
  );
  const nofile = Number(/^Max open files\s+(\d+)/m.exec(fs.readFileSync('/proc/self/limits', 'utf8'))![1]);
  t.is(defaults.maxNodeToCpConnections, Math.floor(nofile / 2));
  t.throws(() => validateServerArgs(parseServer([...base, '--max-node-to-cp-connections-per-agent', '0'])), {
    message: '--max-node-to-cp-connections-per-agent must be a whole number of at least 1, got 0',
  });
  t.throws(() => validateServerArgs(parseServer([...base, '--peer-read-timeout', '0s'])), { message: /--peer-read-timeout: .*positive/ });
});

test('validateServerArgs: --allow-unauthenticated-agents replaces the client CA requirement', (t) => {
  const c = validateServerArgs(
    parseServer(['--cluster-cert', 'a', '--cluster-key', 'b', '--uds-name', 's', '--allow-unauthenticated-agents']),
  );
  t.true(c.settings['allow-unauthenticated-agents']);
  t.is(c.settings['cluster-ca-cert'], undefined);
});

test('validateServerArgs: a plain TCP listener beyond loopback needs --frontend-clients-config; on loopback it does not', (t) => {
  for (const [flags, named] of [
    [['--http-proxy-port', '3128', '--http-proxy-bind-address', '10.0.0.5'], '--http-proxy-bind-address 10.0.0.5'],
    [['--socks5-port', '1080', '--socks5-bind-address', '0.0.0.0'], '--socks5-bind-address 0.0.0.0'],
    [['--socks5-port', '1080', '--socks5-bind-address', '::'], '--socks5-bind-address ::'],
  ] as const) {
    const err = t.throws(() => validateServerArgs(parseServer([...SERVER_OK, ...flags])), { instanceOf: UsageError });
    t.is(
      err?.message,
      `${named}: a plain TCP listener beyond loopback needs --frontend-clients-config: without a clients: list, whoever reaches it is the kube-apiserver and may dial every destination`,
    );
    t.notThrows(() => validateServerArgs(parseServer([...SERVER_OK, ...flags, '--frontend-clients-config', 'clients.yaml'])));
  }
  t.notThrows(() => validateServerArgs(parseServer([...SERVER_OK, '--http-proxy-port', '3128', '--socks5-port', '1080'])));
  t.notThrows(() => validateServerArgs(parseServer([...SERVER_OK, '--socks5-port', '1080', '--socks5-bind-address', '::1'])));
});

// yargs checks `choices` on the command line; each setting's own parser checks them again, typed, for callers that bypass yargs (kanal install-node, tests).
test('a choice outside its list is refused naming the flag and every choice', (t) => {
  const server = parseServer(SERVER_OK);
  const agent = parseAgent(AGENT_OK);
  const node = parseAgent([...AGENT_OK, ...NODE, '--target', '80:a:1']);
  const cases: [() => unknown, string][] = [
    [() => validateServerArgs({ ...server, mode: 'udp' }), '--mode "udp": use both, grpc, socks5, http-connect'],
    [() => validateServerArgs({ ...server, transport: 'quic' }), '--transport "quic": use h2, grpc-js'],
    [
      () => validateServerArgs({ ...server, 'log-level': 'loud' }),
      '--log-level "loud": use trace, debug, info, warn, error, fatal, silent',
    ],
    [() => validateAgentArgs({ ...agent, transport: 'quic' }), '--transport "quic": use h2, grpc-js'],
    [() => validateAgentArgs({ ...agent, 'log-level': 'loud' }), '--log-level "loud": use trace, debug, info, warn, error, fatal, silent'],
    [() => validateAgentArgs({ ...node, 'bind-interface-type': 'tun' }), '--bind-interface-type "tun": use dummy, bridge, none'],
    [() => validateAgentArgs({ ...agent, 'server-count-source': 'min' }), '--server-count-source "min": use default or max'],
    [() => logLevelFrom('loud', undefined), '--log-level "loud": use trace, debug, info, warn, error, fatal, silent'],
  ];
  for (const [validate, message] of cases) t.throws(validate, { instanceOf: UsageError, message });
});

// ---------- pure validation: agent ----------

test('validateAgentArgs accepts a minimal configuration and fills upstream defaults', (t) => {
  const c = validateAgentArgs(parseAgent(AGENT_OK));
  t.deepEqual(c.server.addresses, [{ host: 'cp.example', port: 8091 }]);
  t.is(c.settings['agent-id'], defaultAgentID());
  t.is(c.settings['dial-timeout'], 10_000);
  t.deepEqual(c.reconnect, { initialMs: 1000, maxMs: 30_000 });
  t.deepEqual(c.health, { host: '0.0.0.0', port: 8093, limits: { maxConnections: 32, idleTimeoutMs: 10_000 } });
  t.is(c.node, undefined);
  t.is(c.settings['shutdown-grace-period'], 30_000);
});

test('validateAgentArgs parses --target mappings (IPv4, IPv6 in brackets, names)', (t) => {
  const c = validateAgentArgs(
    parseAgent([
      ...AGENT_OK,
      ...NODE,
      '--target',
      '6443:10.0.0.10:6443',
      '--target',
      '443:[fd00::10]:6443',
      '--target',
      '8132:kas.internal:8132',
      '--bind-interface-type',
      'none',
    ]),
  );
  t.deepEqual(c.node?.targets, [
    { localPort: 6443, destination: '10.0.0.10:6443' },
    { localPort: 443, destination: '[fd00::10]:6443' },
    { localPort: 8132, destination: 'kas.internal:8132' },
  ]);
  t.is(c.node?.bindAddress, '10.200.0.1');
  t.is(c.node?.interfaceType, 'none');
  t.is(c.node?.tunnelWaitMs, 10_000);
});

const agentRefusals: [string, string[], RegExp][] = [
  ['no server host', ['--ca-cert', 'ca'], /--proxy-server-host is required/],
  ['no CA', ['--proxy-server-host', 'cp'], /--ca-cert is required/],
  ['cert without key', [...AGENT_OK, '--agent-cert', 'a.crt'], /--agent-cert and --agent-key go together/],
  [
    'target local port out of range',
    [...AGENT_OK, ...NODE, '--target', '70000:a:1'],
    /--target: "70000:a:1": local port 70000 is out of range/,
  ],
  ['target local port 0', [...AGENT_OK, ...NODE, '--target', '0:a:1'], /--target: .*local port 0 is out of range/],
  [
    'target with unclosed IPv6 bracket',
    [...AGENT_OK, ...NODE, '--target', '80:[::1:443'],
    /--target: address "\[::1:443": expected \[ipv6\]:port/,
  ],
  ['target without destination port', [...AGENT_OK, ...NODE, '--target', '80:host'], /--target: address "host": expected host:port/],
  [
    'target without anything after the local port',
    [...AGENT_OK, ...NODE, '--target', '80'],
    /--target: "80": expected local_port:dst_host:dst_port/,
  ],
  ['target with bare IPv6 destination', [...AGENT_OK, ...NODE, '--target', '80:fd00::1:443'], /--target: .*IPv6 hosts must be in brackets/],
  ['target with non-numeric local port', [...AGENT_OK, ...NODE, '--target', 'http:a:1'], /--target: .*local port "http" is not a number/],
  ['target destination port out of range', [...AGENT_OK, ...NODE, '--target', '80:a:65536'], /--target: .*out of range/],
  ['target with a bad host name', [...AGENT_OK, ...NODE, '--target', '80:bad host:1'], /--target: .*is not a valid host/],
  ['the same local port twice', [...AGENT_OK, ...NODE, '--target', '80:a:1', '--target', '80:b:2'], /local port 80 is used twice/],
  ['target without bind address', [...AGENT_OK, '--target', '80:a:1'], /--target needs --bind-address/],
  ['bind address without target', [...AGENT_OK, ...NODE], /--bind-address needs at least one --target/],
  ['bind address not an IP', [...AGENT_OK, '--bind-address', 'kas', '--target', '80:a:1'], /--bind-address "kas" is not an IP address/],
  [
    'interface name too long',
    [...AGENT_OK, ...NODE, '--target', '80:a:1', '--bind-interface', 'a-very-long-interface-name'],
    /--bind-interface .*1-15/,
  ],
  [
    'unknown agent identifier',
    [...AGENT_OK, '--agent-identifiers', 'planet=mars'],
    /--agent-identifiers: unknown agent identifier "planet"/,
  ],
  [
    'ipv4 identifier not an IPv4 address',
    [...AGENT_OK, '--agent-identifiers', 'host=node-1&ipv4=10.0.0.256'],
    /--agent-identifiers: ipv4 "10.0.0.256" is not an IPv4 address/,
  ],
  [
    "ipv6 identifier as in upstream's help text",
    [...AGENT_OK, '--agent-identifiers', 'ipv6=:::::'],
    /--agent-identifiers: ipv6 ":::::" is not an IPv6 address/,
  ],
  [
    'cidr identifier without a prefix length',
    [...AGENT_OK, '--agent-identifiers', 'cidr=10.0.0.0'],
    /--agent-identifiers: cidr "10.0.0.0" is not an address block such as 10.0.0.0\/24/,
  ],
  [
    'cidr identifier with a prefix too long',
    [...AGENT_OK, '--agent-identifiers', 'cidr=10.0.0.0/33'],
    /--agent-identifiers: cidr "10.0.0.0\/33" is not an address block/,
  ],
  [
    'host identifier with a space',
    [...AGENT_OK, '--agent-identifiers', 'host=node+1'],
    /--agent-identifiers: host "node 1" is not a host name/,
  ],
  [
    'default-route not a boolean',
    [...AGENT_OK, '--agent-identifiers', 'default-route=yes'],
    /--agent-identifiers: default-route "yes" is neither true nor false/,
  ],
  [
    'too many identifiers',
    [...AGENT_OK, '--agent-identifiers', Array.from({ length: 65 }, (_, i) => `host=n${i}`).join('&')],
    /--agent-identifiers: more than 64 identifiers/,
  ],
  ['agent ID with spaces', [...AGENT_OK, '--agent-id', 'node 1'], /--agent-id must be non-empty without spaces/],
  ['server port 0', [...AGENT_OK, '--proxy-server-port', '0'], /--proxy-server-port must be a port number 1-65535, got 0/],
  ['server port not a number', [...AGENT_OK, '--proxy-server-port', 'https'], /--proxy-server-port must be a port number/],
  ['duration without unit', [...AGENT_OK, '--dial-timeout', '10'], /--dial-timeout: duration "10" needs a unit/],
  ['negative duration', [...AGENT_OK, '--connect-timeout=-5s'], /--connect-timeout: invalid duration/],
  [
    'cap shorter than interval',
    [...AGENT_OK, '--sync-interval', '5s', '--sync-interval-cap', '1s'],
    /--sync-interval-cap must not be shorter than --sync-interval/,
  ],
  [
    'tunnel wait without unit',
    [...AGENT_OK, ...NODE, '--target', '80:a:1', '--tunnel-wait-timeout', '3'],
    /--tunnel-wait-timeout: duration "3" needs a unit/,
  ],
  [
    'fractional connection window',
    [...AGENT_OK, '--max-connection-window', '2000000.5'],
    /--max-connection-window must be a whole number of bytes/,
  ],
  [
    'no control plane -> node connections',
    [...AGENT_OK, '--max-cp-to-node-connections', '0'],
    /--max-cp-to-node-connections must be a whole number of at least 1, got 0/,
  ],
  [
    'connection cap not a number',
    [...AGENT_OK, '--max-cp-to-node-connections', 'lots'],
    /--max-cp-to-node-connections must be a whole number/,
  ],
];

for (const [name, argv, message] of agentRefusals) {
  test(`validateAgentArgs refuses: ${name}`, (t) => {
    const err = t.throws(() => validateAgentArgs(parseAgent(argv)), { instanceOf: UsageError });
    t.regex(err?.message ?? '', message);
  });
}

test('a repeated scalar flag keeps its last value (as Go flags do); repeatable flags accumulate (--proxy-server-host too)', (t) => {
  const s = validateServerArgs(
    parseServer([...SERVER_OK, '--agent-port', '8091', '--agent-port', '9000', '--mode', 'grpc', '--mode', 'http-connect']),
  );
  t.is(s.settings['agent-port'], 9000);
  t.is(s.settings.mode, 'http-connect');
  const a = validateAgentArgs(
    parseAgent([...AGENT_OK, '--proxy-server-host', 'cp2.example', ...NODE, '--target', '1:a:1', '--target', '2:b:2']),
  );
  t.deepEqual(a.server.addresses, [
    { host: 'cp.example', port: 8091 },
    { host: 'cp2.example', port: 8091 },
  ]);
  t.is(a.node?.targets.length, 2);
});

// ---------- the real process ----------

test('kanal: unknown flags exit 2 with a message naming the flag', async (t) => {
  const server = await kanal(['server', ...SERVER_OK, '--bogus-flag', '1']);
  t.is(server.code, 2);
  t.regex(server.stderr, /Unknown argument.*bogus-flag/);
  t.regex(server.stderr, /kanal --help/);
  const agent = await kanal(['agent', ...AGENT_OK, '--proxy-server-hots', 'x']);
  t.is(agent.code, 2);
  t.regex(agent.stderr, /Unknown argument.*proxy-server-hots/);
});

test('kanal: a mistyped flag gets "did you mean", upstream-compatible flags included; one dash before a long flag names the two-dash form', async (t) => {
  const cases: [string[], string][] = [
    [
      ['agent', ...AGENT_OK, '--proxy-server-hots', 'x'],
      'Unknown argument: proxy-server-hots\n  --proxy-server-hots: did you mean --proxy-server-host?',
    ],
    [['agent', ...AGENT_OK, '--logtostder'], 'Unknown argument: logtostder\n  --logtostder: did you mean --logtostderr?'],
    [
      ['server', ...SERVER_OK, '--cluster-ca-crt', 'x', '--frobnicate'],
      'Unknown arguments: cluster-ca-crt, frobnicate\n  --cluster-ca-crt: did you mean --cluster-ca-cert?\n  --frobnicate: no such flag',
    ],
    [
      ['agent', ...AGENT_OK, '-proxy-server-port=8132'],
      'Unknown argument: -proxy-server-port\n  -proxy-server-port: long flags take two dashes (one reads as the short flags p, r, o, …): write --proxy-server-port',
    ],
    [
      ['server', ...SERVER_OK, '-agent-prot', '8091'],
      'Unknown argument: -agent-prot\n  -agent-prot: long flags take two dashes; did you mean --agent-port?',
    ],
    [['version', '--outptu', 'json'], 'Unknown argument: outptu\n  --outptu: did you mean --output?'],
  ];
  for (const [args, message] of cases) {
    const r = await kanal(args);
    t.is(r.code, 2, args.join(' '));
    t.is(r.stderr, `kanal: ${message}\nRun "kanal --help" or "kanal <command> --help" for usage.\n`, args.join(' '));
  }
  // Short flags and --no- forms of known flags stay what they were.
  const short = await kanal(['agent', ...AGENT_OK, '-v', '4', '--no-sync-forever', '--dry-run']);
  t.regex(short.stderr, /^kanal: --ca-cert \/nonexistent\/ca\.crt: cannot read/);
});

test('kanal: no command or an unknown command exits 2', async (t) => {
  const none = await kanal([]);
  t.is(none.code, 2);
  t.regex(none.stderr, /name a command/);
  const unknown = await kanal(['frobnicate']);
  t.is(unknown.code, 2);
  t.regex(unknown.stderr, /frobnicate/);
});

test('kanal: malformed targets, ports and durations exit 2 with the reason', async (t) => {
  const cases: [string[], RegExp][] = [
    [
      ['agent', ...AGENT_OK, ...NODE, '--target', '70000:a:1'],
      /^kanal: --target: "70000:a:1": local port 70000 is out of range 1-65535\n$/,
    ],
    [['agent', ...AGENT_OK, ...NODE, '--target', '80:[::1:443'], /^kanal: --target: address "\[::1:443": expected \[ipv6\]:port\n$/],
    [['agent', ...AGENT_OK, ...NODE, '--target', '80:host'], /^kanal: --target: address "host": expected host:port\n$/],
    [['server', ...SERVER_OK, '--agent-port', '99999'], /--agent-port must be a port number 0-65535, got 99999/],
    [['agent', ...AGENT_OK, '--dial-timeout', '10'], /--dial-timeout: duration "10" needs a unit/],
    [['server', ...SERVER_OK, '--mode', 'telepathy'], /Invalid values[\s\S]*mode/],
  ];
  const runs = await Promise.all(cases.map(([args]) => kanal(args)));
  for (const [i, r] of runs.entries()) {
    t.is(r.code, 2, cases[i][0].join(' '));
    t.regex(r.stderr, cases[i][1]);
    t.is(r.stdout, '');
  }
});

test('kanal: missing required flags exit 2 with a clear message', async (t) => {
  const [server, agent] = await Promise.all([kanal(['server', '--uds-name', '/tmp/x.sock']), kanal(['agent', '--ca-cert', 'ca.crt'])]);
  t.is(server.code, 2);
  t.regex(server.stderr, /^kanal: the agent port needs a certificate/);
  t.is(agent.code, 2);
  t.regex(agent.stderr, /^kanal: --proxy-server-host is required/);
});

/** The server's credential flags of `pki`. */
function serverPkiFlags(pki: ThrowawayPki): string[] {
  return ['--cluster-cert', pki.serverCert, '--cluster-key', pki.serverKey, '--cluster-ca-cert', pki.caCert];
}

/** Real credential files (--dry-run checks them), removed when the test ends. */
async function realPki(t: ExecutionContext): Promise<ThrowawayPki> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-cli-pki-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  return writeThrowawayPki(dir);
}

test('kanal --dry-run prints the validated configuration as JSON and exits 0 without touching anything', async (t) => {
  const pki = await realPki(t);
  const uds = path.join(os.tmpdir(), `kanal-dry-run-${process.pid}.sock`);
  const [server, agent] = await Promise.all([
    kanal(['server', ...serverPkiFlags(pki), '--uds-name', uds, '--allowed-destination', '10.0.0.1:6443', '--dry-run']),
    kanal([
      'agent',
      '--proxy-server-host',
      'cp.example',
      '--ca-cert',
      pki.caCert,
      ...NODE,
      '--target',
      '6443:[fd00::1]:6443',
      '--agent-id',
      'node-7',
      '--dry-run',
    ]),
  ]);
  t.is(server.code, 0, server.stderr);
  const sc = JSON.parse(server.stdout) as {
    frontend: { uds: { path: string } };
    settings: { 'allowed-destination': string[]; 'agent-port': number };
  };
  t.is(sc.frontend.uds.path, uds);
  t.deepEqual(sc.settings['allowed-destination'], ['10.0.0.1:6443']);
  t.is(sc.settings['agent-port'], 8091);
  t.is(agent.code, 0, agent.stderr);
  const ac = JSON.parse(agent.stdout) as { settings: { 'agent-id': string }; node: { bindAddress: string; targets: unknown[] } };
  t.is(ac.settings['agent-id'], 'node-7');
  t.deepEqual(ac.node.targets, [{ localPort: 6443, destination: '[fd00::1]:6443' }]);
  t.is(ac.node.bindAddress, '10.200.0.1');
  // Nothing was created.
  const { existsSync } = await import('node:fs');
  t.false(existsSync(uds));
});

test('kanal server --dry-run reads --frontend-clients-config as a start does: a file with mistakes exits 2 naming each', async (t) => {
  const pki = await realPki(t);
  const dir = path.dirname(pki.caCert);
  const good = path.join(dir, 'clients.yaml');
  fs.writeFileSync(good, 'clients:\n- name: prom\n  uid: 1000\n  allow: [{ cidr: 10.0.0.0/8, port: 9100 }]\n');
  const bad = path.join(dir, 'bad-clients.yaml');
  fs.writeFileSync(bad, 'clients:\n- name: prom\n  token-file: /nonexistent/kanal-token\n');
  const flags = ['server', ...serverPkiFlags(pki), '--uds-name', '/tmp/kanal-dry.sock'];
  const [ok, refused] = await Promise.all([
    kanal([...flags, '--frontend-clients-config', good, '--dry-run']),
    kanal([...flags, '--frontend-clients-config', bad, '--dry-run']),
  ]);
  t.is(ok.code, 0, ok.stderr);
  t.is(refused.code, 2, refused.stdout);
  t.regex(refused.stderr, /--frontend-clients-config .*bad-clients\.yaml: .*kanal-token/);
});

test('kanal: a repeated flag keeps the last value in the printed configuration', async (t) => {
  const pki = await realPki(t);
  const r = await kanal([
    'server',
    ...serverPkiFlags(pki),
    '--uds-name',
    '/tmp/kanal-test.sock',
    '--agent-port',
    '8091',
    '--agent-port',
    '9000',
    '--dry-run',
  ]);
  t.is(r.code, 0, r.stderr);
  t.is((JSON.parse(r.stdout) as { settings: { 'agent-port': number } }).settings['agent-port'], 9000);
});

test('kanal --help exits 0 and lists the commands and upstream flag names', async (t) => {
  const [top, server, agent] = await Promise.all([kanal(['--help']), kanal(['server', '--help']), kanal(['agent', '--help'])]);
  t.is(top.code, 0);
  t.regex(top.stdout, /server/);
  t.regex(top.stdout, /agent/);
  t.is(server.code, 0);
  for (const flag of ['--agent-port', '--uds-name', '--cluster-ca-cert', '--allowed-destination', '--health-port'])
    t.true(server.stdout.includes(flag), flag);
  t.is(agent.code, 0);
  for (const flag of [
    '--proxy-server-host',
    '--proxy-server-port',
    '--ca-cert',
    '--agent-cert',
    '--agent-key',
    '--target',
    '--bind-address',
  ])
    t.true(agent.stdout.includes(flag), flag);
});

test('without --help the flags are hidden and undescribed (yargs renders the help text on every run), yet parsed and checked as with it', async (t) => {
  const quiet = (builder: (y: Argv, forHelp: boolean) => Argv, forHelp: boolean): Promise<string> => builder(yargs([]), forHelp).getHelp();
  for (const builder of [serverBuilder, agentBuilder] as const) {
    const shown = await quiet(builder, true);
    const hidden = await quiet(builder, false);
    t.regex(shown, /--log-level\s+\S/, 'with --help: every flag with its description');
    t.notRegex(hidden, /--log-level|--transport/, 'without: no flag rows at all');
    t.true(hidden.length < shown.length / 10, `${hidden.length} against ${shown.length} characters`);
  }
  // Hidden flags are still parsed, defaulted and refused like the described ones.
  const agent = (args: string[]): AgentArgs =>
    agentBuilder(yargs(args), false)
      .strict()
      .exitProcess(false)
      .fail((m, err) => {
        throw err ?? new Error(m);
      })
      .parseSync();
  t.is(agent(['--proxy-server-host', 'cp.example'])['proxy-server-port'], 8091);
  t.throws(() => agent(['--log-level', 'loud']), { message: /Invalid values:[\s\S]*log-level/ });
  t.throws(() => agent(['--bogus-flag']), { message: /Unknown arguments?: bogus-flag/ });
});
