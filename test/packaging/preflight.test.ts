// `kanal agent --check`: passes against a real server when everything is in
// place, and fails clearly (exit 1, a FAIL line naming the cause) for each
// missing prerequisite. The last tests run the agent the way the systemd unit
// does: as a non-root user holding only CAP_NET_ADMIN.

import test, { type ExecutionContext } from 'ava';
import net from 'node:net';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { chmod, chown, copyFile, mkdir, writeFile } from 'node:fs/promises';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { runPreflight, formatPreflight, preflightPassed, type CheckResult } from '../../src/agent/preflight.js';
import { grpcJsTransport } from '../../src/transport/grpc-js/index.js';
import { createLogger } from '../../src/common/logger.js';
import { createNetns, destroyAllNetns, netnsUnavailableReason } from '../../kit/launch/netns.js';
import { CLI, NotifyListener, kanal, logField, portOf, startKanal, tempDir, type RunResult, type Started } from '../helpers/packaging.js';

const NOBODY = 65534;
const isRoot = process.getuid?.() === 0;
const netnsUnavailable = await netnsUnavailableReason();

/**
 * The non-root runs need the checkout to be reachable by that user; a clone
 * under a 0700 directory (mktemp -d) is not, and nothing here may change
 * permissions outside the checkout. Those tests then skip, saying why.
 */
function nobodyCannotRunCli(): string | undefined {
  if (!isRoot) return 'not root';
  const r = spawnSync('setpriv', [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', process.execPath, CLI, '--version'], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  return r.status === 0
    ? undefined
    : `uid ${NOBODY} cannot run ${CLI} (${(r.stderr || r.error?.message || `exit ${r.status}`).trim().split('\n')[0]})`;
}
const nobodyBlocked = nobodyCannotRunCli();
if (nobodyBlocked && isRoot) console.error(`packaging-preflight: non-root tests skipped: ${nobodyBlocked}`);
const nobodyTest = nobodyBlocked ? test.skip : test.serial;
const nobodyNetnsTest = nobodyBlocked || netnsUnavailable ? test.skip : test.serial;
test.after.always('destroy any namespace a test left behind', destroyAllNetns);

interface Fixture {
  dir: string;
  pki: ThrowawayPki;
  agentPort: number;
  /** A TCP service on loopback the server is allowed to dial (node -> control plane). */
  allowedPort: number;
}

let shared: Promise<Fixture> | undefined;
let sharedServer: Started | undefined;
let sharedCleanup: (() => Promise<void>) | undefined;
let destination: net.Server | undefined;

/** One server for the whole file: throwaway PKI, allow-list = one loopback port. */
function fixture(): Promise<Fixture> {
  shared ??= (async () => {
    const tmp = await tempDir('kanal-check-');
    sharedCleanup = tmp.remove;
    await chmod(tmp.dir, 0o755); // the non-root runs need to reach the files
    const pki = await writeThrowawayPki(path.join(tmp.dir, 'pki'));
    await chmod(pki.dir, 0o755);
    destination = net.createServer((s) => s.end('hello from the control plane\n'));
    await new Promise<void>((resolve) => destination!.listen(0, '127.0.0.1', resolve));
    const allowedPort = (destination.address() as net.AddressInfo).port;
    sharedServer = startKanal([
      'server',
      '--agent-bind-address',
      '127.0.0.1',
      '--agent-port',
      '0',
      '--cluster-cert',
      pki.serverCert,
      '--cluster-key',
      pki.serverKey,
      '--cluster-ca-cert',
      pki.caCert,
      '--uds-name',
      path.join(tmp.dir, 'frontend.sock'),
      '--health-port',
      '0',
      '--server-id',
      'check-server',
      '--allowed-destination',
      `127.0.0.1:${allowedPort}`,
    ]);
    const agentPort = portOf(await logField(sharedServer.out, 'agent listener ready', 'address'));
    return { dir: tmp.dir, pki, agentPort, allowedPort };
  })();
  return shared;
}

test.after.always('stop the shared server', async () => {
  await sharedServer?.stop(2000);
  destination?.close();
  await sharedCleanup?.();
});

function checkArgs(f: Fixture, overrides: Record<string, string> = {}, extra: string[] = []): string[] {
  const flags: Record<string, string> = {
    'proxy-server-host': '127.0.0.1',
    'proxy-server-port': String(f.agentPort),
    'ca-cert': f.pki.caCert,
    'agent-cert': f.pki.agentCert,
    'agent-key': f.pki.agentKey,
    'agent-id': 'check-agent',
    'connect-timeout': '30s', // generous: the machine may be busy
    ...overrides,
  };
  return ['agent', '--check', ...Object.entries(flags).flatMap(([k, v]) => [`--${k}`, v]), ...extra];
}

/** The status of check `name` in the printed list. */
function line(r: RunResult, name: string): { status: string; detail: string } | undefined {
  for (const l of r.stdout.split('\n')) {
    const m = /^\s+(PASS|FAIL|WARN|SKIP)\s+(.+?)\s{2,}(.*)$/.exec(l);
    if (m && m[2] === name) return { status: m[1], detail: m[3] };
  }
  return undefined;
}

function assertFails(t: ExecutionContext, r: RunResult, name: string, detail: RegExp): void {
  t.is(r.code, 1, `exit 1 expected:\n${r.stdout}\n${r.stderr}`);
  const l = line(r, name);
  t.is(l?.status, 'FAIL', `${name} should FAIL:\n${r.stdout}`);
  t.regex(l?.detail ?? '', detail);
  t.regex(r.stdout, /\d+ failed.*NOT ready: fix the FAIL lines above/);
}

const asNobody = ['setpriv', `--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups'];
const asNobodyWithNetAdmin = [
  ...asNobody,
  '--inh-caps=-all,+net_admin',
  '--ambient-caps=-all,+net_admin',
  '--bounding-set=-all,+net_admin',
];

/** Credentials readable by the non-root user (the unit's root-without-DAC_OVERRIDE reads root's own files the same way). */
async function credentialsFor(f: Fixture, uid: number, name: string): Promise<{ ca: string; cert: string; key: string }> {
  const dir = path.join(f.dir, name);
  await mkdir(dir, { recursive: true });
  await chmod(dir, 0o755);
  const files = { ca: path.join(dir, 'ca.crt'), cert: path.join(dir, 'agent.crt'), key: path.join(dir, 'agent.key') };
  await copyFile(f.pki.caCert, files.ca);
  await copyFile(f.pki.agentCert, files.cert);
  await copyFile(f.pki.agentKey, files.key);
  await chmod(files.key, 0o600);
  for (const file of Object.values(files)) await chown(file, uid, uid);
  return files;
}

// ---------------------------------------------------------------- passing

test.serial('passes against a real server: credentials, TLS, agent stream, netlink', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f));
  t.is(r.code, 0, r.stdout + r.stderr);
  for (const name of ['ca-cert', 'agent-cert', 'agent-key', 'server-tls', 'server-accepts-agent', 'netlink'])
    t.is(line(r, name)?.status, 'PASS', `${name}:\n${r.stdout}`);
  t.regex(
    line(r, 'server-accepts-agent')!.detail,
    /accepted as agent check-agent by server check-server \(server count 1\); features: .*node-dial/,
  );
  t.regex(r.stdout, /0 failed.*: ready to run/);
  t.regex(r.stdout, /^kanal agent --check \(agent ID check-agent, server 127\.0\.0\.1:\d+\)/);
});

test.serial('passes with the node direction: negotiation and a real dial of each --target through the server', async (t) => {
  const f = await fixture();
  const r = await kanal(
    checkArgs(f, { 'bind-address': '10.200.0.1', 'bind-interface-type': 'bridge' }, ['--target', `6443:127.0.0.1:${f.allowedPort}`]),
  );
  t.is(r.code, isRoot ? 0 : 1, r.stdout);
  t.is(line(r, 'node-dial')?.status, 'PASS');
  t.regex(line(r, 'target 6443')?.detail ?? '', new RegExp(`dialled 127\\.0\\.0\\.1:${f.allowedPort} in \\d+ ms`));
  if (isRoot) t.is(line(r, 'CAP_NET_ADMIN')?.status, 'PASS');
});

// ---------------------------------------------------------------- each missing prerequisite

test.serial('fails when the CA file is missing, and skips the server checks that need it', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f, { 'ca-cert': path.join(f.dir, 'no-such-ca.crt') }));
  assertFails(t, r, 'ca-cert', /no-such-ca\.crt: cannot read \(ENOENT: no such file\)/);
  t.is(line(r, 'server-tls')?.status, 'SKIP');
  t.regex(line(r, 'server-tls')?.detail ?? '', /needs readable, valid credentials/);
});

test.serial('fails when the CA file holds no certificate', async (t) => {
  const f = await fixture();
  const bogus = path.join(f.dir, 'not-a-cert.crt');
  await writeFile(bogus, 'hello\n');
  assertFails(t, await kanal(checkArgs(f, { 'ca-cert': bogus })), 'ca-cert', /no PEM certificate in the file/);
});

nobodyTest('fails when the key is not readable by the agent user (EACCES)', async (t) => {
  const f = await fixture();
  const creds = await credentialsFor(f, NOBODY, 'unreadable');
  await chown(creds.key, 0, 0); // root's 0600 key, the agent runs as nobody
  const viaSetpriv = await kanal(checkArgs(f, { 'ca-cert': creds.ca, 'agent-cert': creds.cert, 'agent-key': creds.key }), {
    wrapper: asNobody,
  });
  assertFails(t, viaSetpriv, 'agent-key', new RegExp(`agent\\.key: cannot read \\(EACCES: permission denied for uid ${NOBODY}\\)`));
  t.is(line(viaSetpriv, 'agent-cert')?.status, 'PASS');
  t.is(line(viaSetpriv, 'server-tls')?.status, 'SKIP');
});

test.serial('fails when the key does not belong to the certificate', async (t) => {
  const f = await fixture();
  assertFails(
    t,
    await kanal(checkArgs(f, { 'agent-key': f.pki.serverKey })),
    'agent-key',
    /does not belong to .*agent\.crt \(the public keys differ\)/,
  );
});

test.serial('fails when the server is unreachable (a closed loopback port)', async (t) => {
  const f = await fixture();
  const closed = net.createServer();
  await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve));
  const port = (closed.address() as net.AddressInfo).port;
  await new Promise<void>((resolve) => closed.close(() => resolve()));
  const r = await kanal(checkArgs(f, { 'proxy-server-port': String(port) }));
  assertFails(
    t,
    r,
    'server-tls',
    new RegExp(`127\\.0\\.0\\.1:${port}: connection refused, nothing listens there: check --proxy-server-host and --proxy-server-port`),
  );
  t.is(line(r, 'server-accepts-agent')?.status, 'SKIP');
});

test.serial('fails when the server does not trust the agent certificate (other CA)', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f, { 'agent-cert': f.pki.rogueAgentCert, 'agent-key': f.pki.rogueAgentKey }));
  assertFails(t, r, 'server-tls', /closed the connection right after the TLS handshake: it refused the agent certificate/);
});

test.serial('fails when --ca-cert does not verify the server certificate', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f, { 'ca-cert': f.pki.rogueCaCert }));
  assertFails(
    t,
    r,
    'server-tls',
    /the server certificate is not trusted \(.*\): --ca-cert must hold the CA that signed the server's certificate/,
  );
});

test.serial('fails when the server name does not match its certificate', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f, { 'tls-server-name': 'wrong.example' }));
  assertFails(
    t,
    r,
    'server-tls',
    /not valid for wrong\.example \(it carries DNS:localhost.*\); set --tls-server-name to a name it carries/,
  );
});

test.serial('fails for a --target the server is not allowed to dial', async (t) => {
  const f = await fixture();
  const r = await kanal(checkArgs(f, { 'bind-address': '10.200.0.1', 'bind-interface-type': 'bridge' }, ['--target', '6443:127.0.0.1:9']));
  assertFails(
    t,
    r,
    'target 6443',
    /server \S+ refuses --target 6443:127\.0\.0\.1:9: .*add --allowed-destination 127\.0\.0\.1:9 to the server/,
  );
});

nobodyTest('fails when netlink cannot create the interface: no CAP_NET_ADMIN (non-root)', async (t) => {
  const f = await fixture();
  const creds = await credentialsFor(f, NOBODY, 'nobody');
  const r = await kanal(
    checkArgs(
      f,
      {
        'ca-cert': creds.ca,
        'agent-cert': creds.cert,
        'agent-key': creds.key,
        'bind-address': '10.200.0.1',
        'bind-interface-type': 'bridge',
      },
      ['--target', `6443:127.0.0.1:${f.allowedPort}`],
    ),
    { wrapper: asNobody },
  );
  assertFails(t, r, 'CAP_NET_ADMIN', /missing: the agent cannot create bridge interface for 10\.200\.0\.1/);
  t.is(line(r, 'server-accepts-agent')?.status, 'PASS', 'everything else is fine');
});

test.serial('fails when rtnetlink itself is unavailable (probe replaced: no way to break netlink for real here)', async (t) => {
  const f = await fixture();
  const results: CheckResult[] = await runPreflight({
    agentID: 'check-agent',
    agentIdentifiers: '',
    server: { host: '127.0.0.1', port: f.agentPort, caFile: f.pki.caCert, certFile: f.pki.agentCert, keyFile: f.pki.agentKey },
    connectTimeoutMs: 30_000,
    dialTimeoutMs: 5000,
    node: { bindAddress: '10.200.0.1', targets: [{ localPort: 6443, destination: `127.0.0.1:${f.allowedPort}` }], interfaceType: 'bridge' },
    transport: grpcJsTransport,
    log: createLogger('silent', 'test'),
    netlink: () => ({
      ok: false,
      detail: 'rtnetlink unavailable: open netlink socket: socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE) failed (EAFNOSUPPORT)',
    }),
  });
  t.false(preflightPassed(results));
  const nl = results.find((r) => r.name === 'netlink');
  t.is(nl?.status, 'fail');
  t.regex(formatPreflight(results, 'x'), /FAIL\s+netlink\s+rtnetlink unavailable/);
  // Without the node direction the same failure is only a warning.
  const cpOnly = await runPreflight({ ...baseOptions(f), netlink: () => ({ ok: false, detail: 'rtnetlink unavailable' }) });
  t.is(cpOnly.find((r) => r.name === 'netlink')?.status, 'warn');
  t.true(preflightPassed(cpOnly));
});

test.serial('--bind-interface-type none: the agent must be able to listen on the address', async (t) => {
  const f = await fixture();
  const r = await kanal(
    checkArgs(f, { 'bind-address': '10.200.0.77', 'bind-interface-type': 'none' }, ['--target', `16443:127.0.0.1:${f.allowedPort}`]),
  );
  assertFails(
    t,
    r,
    'bind-address',
    /10\.200\.0\.77 is not an address of this host \(EADDRNOTAVAIL\), and --bind-interface-type none means the agent does not add it/,
  );
  t.is(line(r, 'CAP_NET_ADMIN')?.status, 'SKIP');
  // 127.0.0.2 is on no interface (lo carries 127.0.0.1/8), yet the agent serves it with "none".
  for (const address of ['127.0.0.1', '127.0.0.2']) {
    const ok = await kanal(
      checkArgs(f, { 'bind-address': address, 'bind-interface-type': 'none' }, ['--target', `16443:127.0.0.1:${f.allowedPort}`]),
    );
    t.is(line(ok, 'bind-address')?.status, 'PASS', ok.stdout);
    t.regex(line(ok, 'bind-address')?.detail ?? '', new RegExp(`${address.replace(/\./g, '\\.')} can be listened on`));
  }
});

test.serial('--check and --dry-run exclude each other; bad flags are usage errors (exit 2)', async (t) => {
  const f = await fixture();
  const both = await kanal([...checkArgs(f), '--dry-run']);
  t.is(both.code, 2);
  t.regex(both.stderr, /--dry-run and --check exclude each other/);
  const bad = await kanal(['agent', '--check', '--proxy-server-host', 'x']);
  t.is(bad.code, 2);
  t.regex(bad.stderr, /--ca-cert is required/);
});

// ---------------------------------------------------------------- the unit's privileges

nobodyTest('passes as a non-root user holding only CAP_NET_ADMIN (what the unit grants)', async (t) => {
  const f = await fixture();
  const creds = await credentialsFor(f, NOBODY, 'netadmin');
  const r = await kanal(
    checkArgs(
      f,
      {
        'ca-cert': creds.ca,
        'agent-cert': creds.cert,
        'agent-key': creds.key,
        'bind-address': '10.200.0.1',
        'bind-interface-type': 'bridge',
      },
      ['--target', `6443:127.0.0.1:${f.allowedPort}`],
    ),
    { wrapper: asNobodyWithNetAdmin },
  );
  t.is(r.code, 0, r.stdout + r.stderr);
  t.is(line(r, 'CAP_NET_ADMIN')?.status, 'PASS');
});

nobodyNetnsTest('the agent runs with only CAP_NET_ADMIN as a non-root user: interface, READY=1, traffic, clean stop', async (t) => {
  const f = await fixture();
  const creds = await credentialsFor(f, NOBODY, 'netns');
  const ns = await createNetns('kanal-unit');
  t.teardown(() => ns.destroy());
  t.is((await ns.ip(['link', 'set', 'lo', 'up'])).code, 0);
  const inNs = ['ip', 'netns', 'exec', ns.name];
  const server = startKanal(
    [
      'server',
      '--agent-bind-address',
      '127.0.0.1',
      '--agent-port',
      '8091',
      '--cluster-cert',
      f.pki.serverCert,
      '--cluster-key',
      f.pki.serverKey,
      '--cluster-ca-cert',
      f.pki.caCert,
      '--uds-name',
      path.join(f.dir, `frontend-${ns.name}.sock`),
      '--health-bind-address',
      '127.0.0.1',
      '--health-port',
      '8092',
      '--allowed-destination',
      '127.0.0.1:8092',
    ],
    { wrapper: inNs },
  );
  t.teardown(() => server.stop(2000));
  await logField(server.out, 'agent listener ready', 'address');
  const notify = await NotifyListener.start(path.join(f.dir, `notify-${ns.name}.sock`));
  t.teardown(() => notify.close());
  const agent = startKanal(
    [
      'agent',
      '--proxy-server-host',
      '127.0.0.1',
      '--proxy-server-port',
      '8091',
      '--ca-cert',
      creds.ca,
      '--agent-cert',
      creds.cert,
      '--agent-key',
      creds.key,
      '--bind-address',
      '10.200.0.1',
      '--bind-interface',
      'kanal0',
      '--bind-interface-type',
      'bridge',
      '--target',
      '6443:127.0.0.1:8092',
      '--health-bind-address',
      '127.0.0.1',
      '--health-server-port',
      '8093',
      '--shutdown-grace-period',
      '2s',
    ],
    { wrapper: [...inNs, ...asNobodyWithNetAdmin], env: { ...process.env, NOTIFY_SOCKET: notify.address } },
  );
  t.teardown(() => agent.stop(2000));
  const ready = await notify
    .waitFor((m) => m.startsWith('READY=1'))
    .catch((err: Error) => {
      throw new Error(`${err.message}\nagent output:\n${agent.output()}`);
    });
  t.regex(ready, /STATUS=1\/1 server tunnel\(s\) up/);
  const addr = await ns.ip(['-o', 'addr', 'show', 'dev', 'kanal0']);
  t.regex(addr.stdout, /inet 10\.200\.0\.1\/32 scope host/);
  // A client on the node reaches the control plane through the advertise address.
  const curl = await ns.exec(['curl', '-sS', '--max-time', '10', 'http://10.200.0.1:6443/healthz']);
  t.is(curl.stdout, 'ok\n', curl.stderr);
  t.is(await agent.stop(), 0, agent.output());
  t.true(notify.messages.some((m) => m.startsWith('STOPPING=1')));
  const gone = await ns.ip(['link', 'show', 'kanal0']);
  t.not(gone.code, 0, 'the interface is removed on stop');
});

function baseOptions(f: Fixture): Parameters<typeof runPreflight>[0] {
  return {
    agentID: 'check-agent',
    agentIdentifiers: '',
    server: { host: '127.0.0.1', port: f.agentPort, caFile: f.pki.caCert, certFile: f.pki.agentCert, keyFile: f.pki.agentKey },
    connectTimeoutMs: 30_000,
    dialTimeoutMs: 5000,
    transport: grpcJsTransport,
    log: createLogger('silent', 'test'),
  };
}
