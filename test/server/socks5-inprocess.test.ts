/**
 * SOCKS5 through a real server and agent in this process, to HTTP backends
 * on loopback: curl with `--socks5-hostname` (the name goes to the agent,
 * which dials it by name), `--socks5` to IPv4 and IPv6 literals,
 * `--proxy-user` (RFC 1929, the password is the token); the test's own
 * client over the Unix-socket listener (no authentication: the file's
 * permissions decide), and a dial failure's REP code.
 */
import test from 'ava';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import { closedPort, makeEnv } from '../helpers/in-process.js';
import { connectSocks, readToEnd, socks5Handshake } from '../helpers/socks5-client.js';
import { httpBackend, startWithSocks } from '../helpers/socks5-stand.js';
import { skippedBecause } from '../helpers/skipped.js';

const CURL = '/usr/bin/curl';
const curlMissing = !fs.existsSync(CURL);
if (curlMissing) skippedBecause('SOCKS5 curl tests', `${CURL} not found (scripts/setup.sh installs curl)`);
const curlTest = curlMissing ? test.skip : test;

function curl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(CURL, ['--silent', '--show-error', '--max-time', '20', ...args], { timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

curlTest('curl through SOCKS5: a name resolved on the agent side, IPv4 and IPv6 literals, a token as the password', async (t) => {
  const env = await makeEnv(t);
  const { socksPort } = await startWithSocks(t, env);
  const v4 = await httpBackend(t, '127.0.0.1');
  const v6 = await httpBackend(t, '::1');
  const proxy = `127.0.0.1:${socksPort}`;

  // socks5h: curl sends the name; the agent dials localhost by name.
  const byName = await curl(['--socks5-hostname', proxy, '--proxy-user', 'operator:TOKEN', `http://localhost:${v4}/by-name`]);
  t.is(byName.stderr, '');
  t.is(byName.stdout, 'hello from 127.0.0.1 /by-name');

  const ipv4 = await curl(['--socks5', proxy, '--proxy-user', 'operator:TOKEN', `http://127.0.0.1:${v4}/v4`]);
  t.is(ipv4.stdout, 'hello from 127.0.0.1 /v4', ipv4.stderr);

  const ipv6 = await curl(['--socks5', proxy, '--proxy-user', 'operator:TOKEN', `http://[::1]:${v6}/v6`]);
  t.is(ipv6.stdout, 'hello from ::1 /v6', ipv6.stderr);

  // RFC 1929: the username is informational, the password the token (the KAS-only policy admits any).
  // No authentication over TCP: refused (RFC 1928 method 0xFF), only a Unix socket's permissions may stand in for a credential.
  const noAuth = await curl(['--socks5', proxy, `http://127.0.0.1:${v4}/no-auth`]);
  t.not(noAuth.code, 0);
  t.is(noAuth.stdout, '');

  const withToken = await curl(['--socks5-hostname', proxy, '--proxy-user', 'prometheus:TOKEN', `http://localhost:${v4}/auth`]);
  t.is(withToken.stdout, 'hello from 127.0.0.1 /auth', withToken.stderr);
});

curlTest('curl through SOCKS5 to a closed port: connection refused (REP 5)', async (t) => {
  const env = await makeEnv(t);
  const { socksPort } = await startWithSocks(t, env);
  const closed = await closedPort();
  const r = await curl(['--socks5', `127.0.0.1:${socksPort}`, '--proxy-user', 'operator:TOKEN', `http://127.0.0.1:${closed}/`]);
  t.not(r.code, 0);
  // curl 7.88 prints the REP code; later versions name it ("Connection refused").
  t.regex(r.stderr, /SOCKS5 connection to 127\.0\.0\.1\. \(5\)|Connection refused/);
});

test('the Unix-socket listener: no authentication, owner-only socket file, a name dialled through the agent', async (t) => {
  const env = await makeEnv(t);
  const { socksPath } = await startWithSocks(t, env);
  t.is(fs.statSync(socksPath).mode & 0o777, 0o600);
  const v4 = await httpBackend(t, '127.0.0.1');
  const socket = await connectSocks({ path: socksPath });
  t.teardown(() => socket.destroy());
  const out = await socks5Handshake(socket, 'localhost', v4);
  t.like(out, { kind: 'reply', rep: 0 });
  socket.end(`GET /uds HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n`);
  const answer = (await readToEnd(socket)).toString();
  t.regex(answer, /^HTTP\/1\.1 200 /);
  t.regex(answer, /hello from 127\.0\.0\.1 \/uds$/);
});

test('the frontend listener in `both` mode does not serve SOCKS5 (the kube-apiserver listener is unchanged)', async (t) => {
  const env = await makeEnv(t);
  await startWithSocks(t, env);
  const socket = await connectSocks({ path: env.udsPath });
  t.teardown(() => socket.destroy());
  socket.write(Buffer.from([5, 1, 0]));
  // Not a SOCKS5 answer: HTTP CONNECT's 400 to bytes that are no HTTP request, as before SOCKS5 existed.
  t.regex((await readToEnd(socket)).toString('latin1'), /^HTTP\/1\.1 400 /);
});
