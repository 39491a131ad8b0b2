/**
 * The `kanal` command as an operator meets it (the real CLI, run as a child
 * process): help, usage errors with exit code 2, and start-up failures that
 * say what is wrong instead of hanging.
 */
import test from 'ava';
import net from 'node:net';
import path from 'node:path';
import { freePort, loopbackServerArgs, makeWorkspace, runCli } from '../helpers/kanal-processes.js';

test('kanal --help lists the commands and exits 0', async (t) => {
  const r = await runCli(['--help']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /kanal server\s+Run the proxy server/);
  t.regex(r.stdout, /kanal agent\s+Run the proxy agent/);
  t.regex(r.stdout, /--version/);
});

test('kanal server --help documents the upstream flag names', async (t) => {
  const r = await runCli(['server', '--help']);
  t.is(r.code, 0, r.stderr);
  for (const flag of [
    '--server-port',
    '--server-bind-address',
    '--server-cert',
    '--server-key',
    '--server-ca-cert',
    '--uds-name',
    '--agent-port',
    '--cluster-ca-cert',
    '--backend-dial-timeout',
    '--health-port',
    '--max-message-size',
  ]) {
    t.true(r.stdout.includes(flag), `${flag} in server --help`);
  }
});

test('kanal agent --help documents the upstream flag names', async (t) => {
  const r = await runCli(['agent', '--help']);
  t.is(r.code, 0, r.stderr);
  for (const flag of [
    '--proxy-server-host',
    '--proxy-server-port',
    '--ca-cert',
    '--agent-cert',
    '--agent-key',
    '--agent-id',
    '--health-server-port',
  ]) {
    t.true(r.stdout.includes(flag), `${flag} in agent --help`);
  }
});

test('kanal --version prints the package version', async (t) => {
  const r = await runCli(['--version']);
  t.is(r.code, 0);
  t.regex(r.stdout.trim(), /^\d+\.\d+\.\d+/);
});

test('an unknown flag exits 2 and names the flag', async (t) => {
  const cases: [string[], string][] = [
    [['server', '--bogus-flag', '1'], 'bogus-flag'],
    [['agent', '--nonexistent-flag'], 'nonexistent-flag'],
    [['server', '--dry-run', '--frobnicate'], 'frobnicate'],
  ];
  for (const [args, flag] of cases) {
    const r = await runCli(args);
    t.is(r.code, 2, args.join(' '));
    t.regex(r.stderr, /Unknown argument/, args.join(' '));
    t.true(r.stderr.includes(flag), `${args.join(' ')}: ${r.stderr}`);
    t.regex(r.stderr, /kanal --help/);
  }
});

test('no command, or an unknown command, exits 2 with a hint', async (t) => {
  const none = await runCli([]);
  t.is(none.code, 2);
  t.regex(none.stderr, /name a command/);
  const unknown = await runCli(['frobnicate']);
  t.is(unknown.code, 2);
  t.regex(unknown.stderr, /frobnicate/);
  const flagOnly = await runCli(['--frobnicate']);
  t.is(flagOnly.code, 2);
  t.regex(flagOnly.stderr, /kanal --help/);
});

test('invalid flag values exit 2 with a clear message', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const base = [
    'server',
    '--uds-name',
    path.join(ws.dir, 'x.sock'),
    '--cluster-cert',
    pki.serverCert,
    '--cluster-key',
    pki.serverKey,
    '--cluster-ca-cert',
    pki.caCert,
    '--health-port',
    '0',
    '--agent-port',
    '0',
  ];
  const cases: [string[], RegExp][] = [
    [[...base, '--backend-dial-timeout', '5parsecs'], /--backend-dial-timeout: invalid duration/],
    [[...base, '--agent-port', '70000'], /--agent-port must be a port number/],
    [[...base, '--max-message-size', '100'], /--max-message-size must be at least 65536/],
    [
      ['server', '--uds-name', path.join(ws.dir, 'x.sock'), '--cluster-cert', pki.serverCert, '--cluster-key', pki.serverKey],
      /--cluster-ca-cert is required/,
    ],
    [['agent', '--ca-cert', pki.caCert], /--proxy-server-host is required/],
    [
      ['agent', '--proxy-server-host', '127.0.0.1', '--ca-cert', pki.caCert, '--agent-cert', pki.agentCert],
      /--agent-cert and --agent-key go together/,
    ],
  ];
  for (const [args, message] of cases) {
    const r = await runCli(args);
    t.is(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    t.regex(r.stderr, message);
  }
  // Nothing was left behind by the refused starts.
  t.false((await import('node:fs')).existsSync(path.join(ws.dir, 'x.sock')));
});

test('a server whose agent port is taken exits non-zero and says so', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => void blocker.close());
  const port = (blocker.address() as net.AddressInfo).port;
  const r = await runCli([
    ...loopbackServerArgs({ pki, agentPort: port, healthPort: await freePort() }),
    '--uds-name',
    path.join(ws.dir, 'busy.sock'),
  ]);
  t.not(r.code, 0);
  t.not(r.code, null, 'exited by itself instead of hanging');
  t.regex(r.stderr + r.stdout, /EADDRINUSE/);
});
