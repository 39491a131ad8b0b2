/**
 * The SOCKS5 listener flags: off by default, plain TCP on loopback, a Unix
 * socket owner-only, either or both, mapped into ServerOptions.frontend.extra;
 * refused with --tenants-config, naming the flag.
 */
import test from 'ava';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import yargs from 'yargs';
import { loadServerCredentials, serverBuilder, validateServerArgs, type ServerArgs } from '../../src/cli/server-command.js';
import { buildServerOptions } from '../../src/server/assembly/server-assembly.js';
import { UsageError } from '../../src/common/usage-error.js';
import { writeThrowawayPki } from '../../kit/pki/throwaway-pki.js';

function parseServer(argv: string[]): ServerArgs {
  return serverBuilder(yargs(argv))
    .strict()
    .exitProcess(false)
    .parserConfiguration({ 'camel-case-expansion': false, 'strip-aliased': true })
    .fail((message, err) => {
      throw err ?? new Error(message);
    })
    .parseSync();
}

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

test('SOCKS5 listeners are off by default; the defaults are loopback and an owner-only socket', (t) => {
  const c = validateServerArgs(parseServer(SERVER_OK));
  t.is(c.frontend.extra, undefined);
  t.is(c.settings['socks5-port'], 0);
  t.is(c.settings['socks5-bind-address'], '127.0.0.1');
  t.is(c.settings['socks5-uds-mode'], 0o600);
});

test('--socks5-port and --socks5-uds-name each make a socks5 listener, both together two', (t) => {
  const tcp = validateServerArgs(parseServer([...SERVER_OK, '--socks5-port', '1080']));
  t.deepEqual(tcp.frontend.extra, [
    { mode: 'socks5', flags: '--socks5-bind-address, --socks5-port', plain: { host: '127.0.0.1', port: 1080 } },
  ]);
  const both = validateServerArgs(
    parseServer([
      ...SERVER_OK,
      '--socks5-port',
      '1080',
      '--socks5-bind-address',
      '::1',
      '--socks5-uds-name',
      '/tmp/kanal-socks.sock',
      '--socks5-uds-mode',
      '0660',
      '--socks5-uds-group',
      '0',
    ]),
  );
  t.deepEqual(both.frontend.extra, [
    { mode: 'socks5', flags: '--socks5-bind-address, --socks5-port', plain: { host: '::1', port: 1080 } },
    { mode: 'socks5', flags: '--socks5-uds-name', uds: { path: '/tmp/kanal-socks.sock', deleteExisting: true, mode: 0o660, gid: 0 } },
  ]);
});

test('SOCKS5 flag mistakes are usage errors naming the flag', (t) => {
  for (const [argv, message] of [
    [['--socks5-uds-mode', '0400'], /--socks5-uds-mode 0400 leaves the owner without write permission/],
    [['--socks5-uds-mode', 'rw'], /--socks5-uds-mode must be octal/],
    [['--socks5-port', '70000'], /--socks5-port/],
    [['--socks5-uds-name', '/tmp/kanal-test.sock'], /--socks5-uds-name .* is the frontend's --uds-name/],
  ] as const) {
    t.throws(() => validateServerArgs(parseServer([...SERVER_OK, ...argv])), { message }, argv.join(' '));
  }
});

test('with --tenants-config the SOCKS5 flags are refused, naming each', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-socks5-flags-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'tenants.yaml');
  fs.writeFileSync(file, 'tenants: []\n');
  const base = ['--cluster-cert', '/nonexistent/a.crt', '--cluster-key', '/nonexistent/a.key', '--tenants-config', file];
  for (const flag of ['--socks5-port', '--socks5-uds-name']) {
    const value = flag === '--socks5-port' ? '1080' : path.join(dir, 's.sock');
    const err = t.throws(() => validateServerArgs(parseServer([...base, flag, value])), { instanceOf: UsageError });
    t.regex(err?.message ?? '', new RegExp(`${flag} is not offered with --tenants-config`));
  }
});

test('the SOCKS5 listeners reach ServerOptions.frontend.extra', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-socks5-opts-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const pki = await writeThrowawayPki(dir);
  const config = validateServerArgs(
    parseServer([
      '--cluster-cert',
      pki.serverCert,
      '--cluster-key',
      pki.serverKey,
      '--cluster-ca-cert',
      pki.caCert,
      '--uds-name',
      path.join(dir, 'f.sock'),
      '--socks5-uds-name',
      path.join(dir, 's.sock'),
    ]),
  );
  const options = await buildServerOptions(config, loadServerCredentials(config));
  t.deepEqual(options.frontend.extra, [
    { mode: 'socks5', flags: '--socks5-uds-name', uds: { path: path.join(dir, 's.sock'), deleteExisting: true, mode: 0o600 } },
  ]);
  t.is(options.frontend.mode, 'both');
});
