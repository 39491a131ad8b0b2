/**
 * Start-up mistakes an operator makes with credential files (docs/operations.md),
 * through the real CLI, for both commands: each is refused at start with
 * exit code 1 and a message naming the flag, the path and the cause, before
 * anything listens or dials; `--dry-run` checks the same files; an agent
 * whose key does not match its certificate exits instead of retrying.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { freePort, makeWorkspace, readLog, runCli, startServer, type CliResult, type Workspace } from '../helpers/kanal-processes.js';

/** Generous: several test files start processes at once on a small machine. */
const CLI_TIMEOUT_MS = 60_000;

interface Files {
  ws: Workspace;
  /** A file with no PEM block (an operator pasted the wrong thing). */
  notPem: string;
  /** A key that belongs to no certificate here. */
  otherKey: string;
  agentCert: string;
  agentKey: string;
}

async function files(t: ExecutionContext): Promise<Files> {
  const ws = await makeWorkspace(t);
  const notPem = path.join(ws.dir, 'ca-not-pem.crt');
  fs.writeFileSync(notPem, 'this is not a certificate\n');
  const own = await issueAgentCertificate(ws.pki, 'node-1');
  const other = await issueAgentCertificate(ws.pki, 'node-2');
  return { ws, notPem, otherKey: other.key, agentCert: own.cert, agentKey: own.key };
}

function agentArgs(f: Files, over: Record<string, string> = {}): string[] {
  const flags: Record<string, string> = {
    'proxy-server-host': '127.0.0.1',
    'proxy-server-port': '9',
    'ca-cert': f.ws.pki.caCert,
    'agent-cert': f.agentCert,
    'agent-key': f.agentKey,
    'health-server-port': '0',
    ...over,
  };
  return ['agent', ...Object.entries(flags).flatMap(([k, v]) => [`--${k}`, v])];
}

function serverArgs(f: Files, over: Record<string, string> = {}): string[] {
  const { pki } = f.ws;
  const flags: Record<string, string> = {
    'cluster-cert': pki.serverCert,
    'cluster-key': pki.serverKey,
    'cluster-ca-cert': pki.caCert,
    'uds-name': path.join(f.ws.dir, 'never.sock'),
    'agent-bind-address': '127.0.0.1',
    'agent-port': '0',
    'health-port': '0',
    ...over,
  };
  // An empty value drops the flag (the TCP frontend cases have no --uds-name).
  return ['server', ...Object.entries(flags).flatMap(([k, v]) => (v === '' ? [] : [`--${k}`, v]))];
}

/** Exit 1, exactly `message` on stderr, nothing listened (no socket file). */
function refused(t: ExecutionContext, r: CliResult, message: string, f: Files): void {
  t.is(r.code, 1, r.stderr);
  t.is(r.stderr, `kanal: ${message}\n`);
  t.false(fs.existsSync(path.join(f.ws.dir, 'never.sock')), 'the server never listened');
}

test('agent: each credential mistake is refused at start with flag, path and cause', async (t) => {
  const f = await files(t);
  const { pki } = f.ws;
  const cases: [string, Record<string, string>, string][] = [
    [
      'key of another certificate',
      { 'agent-key': f.otherKey },
      `--agent-key ${f.otherKey}: does not belong to --agent-cert ${f.agentCert} (the public keys differ)`,
    ],
    [
      'key file that is a certificate',
      { 'agent-key': f.agentCert },
      `--agent-key ${f.agentCert}: holds a certificate, not a private key (are --agent-cert and --agent-key swapped?)`,
    ],
    [
      'CA file without a PEM certificate',
      { 'ca-cert': f.notPem },
      `--ca-cert ${f.notPem}: no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----")`,
    ],
    [
      'CA file that is a key',
      { 'ca-cert': f.agentKey },
      `--ca-cert ${f.agentKey}: no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----") (found "PRIVATE KEY")`,
    ],
    [
      'missing certificate',
      { 'agent-cert': '/nonexistent/agent.crt' },
      '--agent-cert /nonexistent/agent.crt: cannot read (ENOENT: no such file)',
    ],
    [
      'a server certificate as client certificate',
      { 'agent-cert': pki.serverCert, 'agent-key': pki.serverKey },
      `--agent-cert ${pki.serverCert}: CN=kanal-server is not a client certificate (its extended key usage lacks clientAuth)`,
    ],
    [
      'empty token file',
      { 'service-account-token-path': f.notPem.replace('ca-not-pem.crt', 'empty-token') },
      `--service-account-token-path ${f.notPem.replace('ca-not-pem.crt', 'empty-token')}: the file is empty`,
    ],
  ];
  fs.writeFileSync(f.notPem.replace('ca-not-pem.crt', 'empty-token'), '\n');
  for (const [name, over, message] of cases) {
    t.log(name);
    refused(t, await runCli(agentArgs(f, over), CLI_TIMEOUT_MS), message, f);
  }
});

test('server: each credential mistake is refused at start with flag, path and cause', async (t) => {
  const f = await files(t);
  const { pki } = f.ws;
  const tcp = {
    'server-cert': pki.frontendCert,
    'server-key': pki.frontendKey,
    'server-ca-cert': pki.caCert,
    'server-bind-address': '127.0.0.1',
    'server-port': '0',
  };
  const cases: [string, Record<string, string>, string][] = [
    [
      'agent-port key of another certificate',
      { 'cluster-key': pki.frontendKey },
      `--cluster-key ${pki.frontendKey}: does not belong to --cluster-cert ${pki.serverCert} (the public keys differ)`,
    ],
    [
      'agent-port key file that is a certificate',
      { 'cluster-key': pki.serverCert },
      `--cluster-key ${pki.serverCert}: holds a certificate, not a private key (are --cluster-cert and --cluster-key swapped?)`,
    ],
    [
      'client CA without a PEM certificate',
      { 'cluster-ca-cert': f.notPem },
      `--cluster-ca-cert ${f.notPem}: no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----")`,
    ],
    [
      'a client certificate on the agent port',
      { 'cluster-cert': f.agentCert, 'cluster-key': f.agentKey },
      `--cluster-cert ${f.agentCert}: CN=node-1 is not a server certificate (its extended key usage lacks serverAuth)`,
    ],
    [
      'frontend key of another certificate',
      { 'uds-name': '', ...tcp, 'server-key': pki.serverKey },
      `--server-key ${pki.serverKey}: does not belong to --server-cert ${pki.frontendCert} (the public keys differ)`,
    ],
    [
      'frontend client CA missing',
      { 'uds-name': '', ...tcp, 'server-ca-cert': '/nonexistent/kas-ca.crt' },
      '--server-ca-cert /nonexistent/kas-ca.crt: cannot read (ENOENT: no such file)',
    ],
  ];
  for (const [name, over, message] of cases) {
    t.log(name);
    refused(t, await runCli(serverArgs(f, over), CLI_TIMEOUT_MS), message, f);
  }
});

test('several mistakes are reported together, one line each', async (t) => {
  const f = await files(t);
  const r = await runCli(agentArgs(f, { 'ca-cert': f.notPem, 'agent-key': f.otherKey }), CLI_TIMEOUT_MS);
  refused(
    t,
    r,
    [
      '2 problems with credential files:',
      `  --ca-cert ${f.notPem}: no PEM certificate in the file (expected "-----BEGIN CERTIFICATE-----")`,
      `  --agent-key ${f.otherKey}: does not belong to --agent-cert ${f.agentCert} (the public keys differ)`,
    ].join('\n'),
    f,
  );
});

test('--dry-run checks the files it names: the configuration is printed, the problems make it exit 1', async (t) => {
  const f = await files(t);
  const bad = await runCli([...agentArgs(f, { 'agent-key': f.otherKey }), '--dry-run'], CLI_TIMEOUT_MS);
  t.is(bad.code, 1);
  t.is((JSON.parse(bad.stdout) as { server: { keyFile: string } }).server.keyFile, f.otherKey);
  t.is(bad.stderr, `kanal: --agent-key ${f.otherKey}: does not belong to --agent-cert ${f.agentCert} (the public keys differ)\n`);
  const badServer = await runCli([...serverArgs(f, { 'cluster-ca-cert': f.notPem }), '--dry-run'], CLI_TIMEOUT_MS);
  t.is(badServer.code, 1);
  t.regex(badServer.stderr, /^kanal: --cluster-ca-cert .*ca-not-pem\.crt: no PEM certificate in the file/);
  for (const args of [agentArgs(f), serverArgs(f)]) {
    const r = await runCli([...args, '--dry-run'], CLI_TIMEOUT_MS);
    t.is(r.code, 0, r.stderr);
    t.is(r.stderr, '');
  }
});

test("--dry-run refuses what the start refuses: each of the start's refusals, run both ways, gives the same exit code and message", async (t) => {
  const f = await files(t);
  const { pki } = f.ws;
  const nowhere = path.join(f.ws.dir, 'no-such.kubeconfig');
  const tcpFrontend = (ca: string): Record<string, string> => ({
    'uds-name': '',
    'server-bind-address': '127.0.0.1',
    'server-port': '0',
    'server-cert': pki.frontendCert,
    'server-key': pki.frontendKey,
    'server-ca-cert': ca,
  });
  // Every refusal a start makes before it serves (start-checks.ts and the credential files), with the words that name it.
  const refusals: [string, string[], RegExp][] = [
    ['server: a flag out of range', serverArgs(f, { 'agent-port': '70000' }), /--agent-port must be a port number/],
    ['server: a credential file', serverArgs(f, { 'cluster-ca-cert': f.notPem }), /--cluster-ca-cert .*no PEM certificate/],
    [
      'server: one CA for agents and the kube-apiserver',
      serverArgs(f, tcpFrontend(pki.caCert)),
      /--cluster-ca-cert and --server-ca-cert share a CA/,
    ],
    [
      'server: a kubeconfig that cannot be read',
      serverArgs(f, {
        'agent-namespace': 'kube-system',
        'agent-service-account': 'konnectivity-agent',
        'authentication-audience': 'aud',
        kubeconfig: nowhere,
      }),
      /--kubeconfig .*no-such\.kubeconfig/,
    ],
    ['agent: a flag out of range', agentArgs(f, { 'proxy-server-port': '0' }), /--proxy-server-port must be a port number/],
    ['agent: a key of another certificate', agentArgs(f, { 'agent-key': f.otherKey }), /--agent-key .*does not belong to --agent-cert/],
    [
      'agent: the kubeconfig of --count-server-leases cannot be read',
      [...agentArgs(f, { kubeconfig: nowhere }), '--count-server-leases'],
      /--kubeconfig .*no-such\.kubeconfig/,
    ],
  ];
  for (const [what, args, says] of refusals) {
    const start = await runCli(args, CLI_TIMEOUT_MS);
    t.not(start.code, 0, `${what}: the start refuses`);
    t.regex(start.stderr, says, what);
    const dry = await runCli([...args, '--dry-run'], CLI_TIMEOUT_MS);
    t.is(dry.code, start.code, `${what}: --dry-run exits as the start does (${dry.stderr})`);
    t.is(dry.stderr, start.stderr, `${what}: in the same words`);
  }
  t.false(fs.existsSync(path.join(f.ws.dir, 'never.sock')), 'no start got as far as listening');
});

test('an agent whose key does not match its certificate exits at start instead of retrying against a live server', async (t) => {
  const f = await files(t);
  const server = await startServer(t, f.ws);
  const health = await freePort();
  const started = Date.now();
  const r = await runCli(
    agentArgs(f, {
      'proxy-server-port': String(server.agentPort),
      'agent-key': f.otherKey,
      'health-server-port': String(health),
      'health-bind-address': '127.0.0.1',
    }),
    CLI_TIMEOUT_MS,
  );
  t.is(r.code, 1, `exit code (stderr: ${r.stderr})`);
  t.regex(r.stderr, /--agent-key .*: does not belong to --agent-cert/);
  t.log(`exited ${Date.now() - started} ms after start`);
  // It never reached the server: no TLS attempt was logged there.
  await sleep(200);
  t.deepEqual(
    readLog(server.logFile).filter((l) => /^refused agent|TLS handshake/.test(l.msg)),
    [],
    'the server saw no connection attempt',
  );
});
