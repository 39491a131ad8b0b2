// A Go client through Kanal's SOCKS5 door: golang.org/x/net/proxy (Debian's
// golang-golang-x-net-dev, in the GOPATH /usr/share/gocode as a dependency of
// golang-google-grpc-dev), which Go programs use for socks5:// proxies.
// test/socks5-go-client/main.go fetches a URL through the proxy with net/http.

import test from 'ava';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { closedPort, makeEnv } from '../helpers/in-process.js';
import { httpBackend, startWithSocks } from '../helpers/socks5-stand.js';
import { skippedBecause } from '../helpers/skipped.js';

const GO = '/usr/bin/go';
const GO_PATH = '/usr/share/gocode';
const CLIENT_SOURCE = fileURLToPath(new URL('../../../test/socks5-go-client/', import.meta.url));

const goMissing = [GO, path.join(GO_PATH, 'src/golang.org/x/net/proxy')]
  .filter((p) => !fs.existsSync(p))
  .map((p) => `${p} not found (scripts/setup.sh installs golang-go and golang-google-grpc-dev, which brings golang-golang-x-net-dev)`)[0];
if (goMissing) skippedBecause('SOCKS5 Go client tests', goMissing);
const goTest = goMissing ? test.skip : test.serial;

let buildDir = '';
let client = '';

test.before(async () => {
  if (goMissing) return;
  buildDir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-socks5-go-'));
  removeOnExit.add(buildDir);
  client = path.join(buildDir, 'socks5-go-client');
  // Debian's Go libraries live in a GOPATH, not in a module cache (as test/interop/grpc-go.test.ts builds).
  const env = { ...process.env, GO111MODULE: 'off', GOPATH: GO_PATH, GOCACHE: path.join(buildDir, 'cache'), GOFLAGS: '' };
  await new Promise<void>((resolve, reject) =>
    execFile(GO, ['build', '-o', client, '.'], { cwd: CLIENT_SOURCE, env, timeout: 300_000 }, (err, _out, stderr) =>
      err ? reject(new Error(`go build failed: ${stderr || err.message}`)) : resolve(),
    ),
  );
});

test.after.always(() => {
  if (buildDir) fs.rmSync(buildDir, { recursive: true, force: true });
  removeOnExit.delete(buildDir);
});

function run(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(client, args, { timeout: 30_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

goTest('Go x/net/proxy through SOCKS5: a name, an IPv6 literal, a token, the Unix socket; a closed port is refused', async (t) => {
  const env = await makeEnv(t);
  const { socksPort, socksPath } = await startWithSocks(t, env);
  const v4 = await httpBackend(t, '127.0.0.1');
  const v6 = await httpBackend(t, '::1');
  const proxy = `127.0.0.1:${socksPort}`;

  const byName = await run(['-proxy', proxy, '-user', 'operator', '-password', 'TOKEN', '-url', `http://localhost:${v4}/go-name`]);
  t.is(byName.stdout, 'hello from 127.0.0.1 /go-name', byName.stderr);

  const ipv6 = await run(['-proxy', proxy, '-user', 'operator', '-password', 'TOKEN', '-url', `http://[::1]:${v6}/go-v6`]);
  t.is(ipv6.stdout, 'hello from ::1 /go-v6', ipv6.stderr);

  const noAuth = await run(['-proxy', proxy, '-url', `http://127.0.0.1:${v4}/go-no-auth`]);
  t.is(noAuth.code, 1, 'no authentication over TCP is refused');

  const token = await run(['-proxy', proxy, '-user', 'operator', '-password', 'TOKEN', '-url', `http://127.0.0.1:${v4}/go-auth`]);
  t.is(token.stdout, 'hello from 127.0.0.1 /go-auth', token.stderr);

  const uds = await run(['-network', 'unix', '-proxy', socksPath, '-url', `http://localhost:${v4}/go-uds`]);
  t.is(uds.stdout, 'hello from 127.0.0.1 /go-uds', uds.stderr);

  const closed = await closedPort();
  const refused = await run(['-proxy', proxy, '-user', 'operator', '-password', 'TOKEN', '-url', `http://127.0.0.1:${closed}/`]);
  t.is(refused.code, 1);
  // x/net/internal/socks names the REP code (RFC 1928 section 6).
  t.regex(refused.stderr, /connection refused/);
});
