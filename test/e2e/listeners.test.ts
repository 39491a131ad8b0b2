/**
 * The server's listeners as an operator meets them, on the real CLI:
 * - the frontend Unix socket never exists with more than its final mode and
 *   group (--uds-mode, --uds-group), whatever the umask;
 * - --delete-existing-uds-file removes a stale socket and nothing else;
 * - start-up failures name the flag, the address or directory, exit
 *   non-zero, log nothing after the fatal line and release everything: the
 *   socket file is gone and the next start needs no cleanup;
 * - an aborted TLS handshake is logged with the peer's real address.
 */
import test from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { newServerFromFlags } from '../../kit/launch/in-process.js';
import {
  freePort,
  loopbackServerArgs,
  makeWorkspace,
  readLog,
  runCli,
  spawnKanal,
  startServer,
  type LogLine,
  type Workspace,
} from '../helpers/kanal-processes.js';
import { captureLogger, makeEnv, oneClusterFlags } from '../helpers/in-process.js';

function baseArgs(ws: Workspace, agentPort: number, healthPort: number): string[] {
  return loopbackServerArgs({ pki: ws.pki, agentPort, healthPort });
}

function logLines(stdout: string): LogLine[] {
  return stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as LogLine);
}

async function blockPort(t: { teardown(fn: () => void): void }): Promise<number> {
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => void blocker.close());
  return (blocker.address() as net.AddressInfo).port;
}

interface FileState {
  mode: number;
  gid: number;
}

/** Records every mode and group seen at `file` until `until` settles (bounded by that promise). */
function watchFile(file: string, until: Promise<unknown>): Promise<Map<string, FileState>> {
  const seen = new Map<string, FileState>();
  let done = false;
  void until.finally(() => {
    done = true;
  });
  return new Promise((resolve) => {
    const poll = (): void => {
      try {
        const st = fs.lstatSync(file);
        const state = { mode: st.mode & 0o777, gid: st.gid };
        seen.set(`${state.mode.toString(8)}:${state.gid}`, state);
      } catch {
        // not there yet
      }
      if (done) resolve(seen);
      else setImmediate(poll);
    };
    poll();
  });
}

const UMASKS = [0o000, 0o022, 0o077];

for (const umask of UMASKS) {
  test(`under umask ${umask.toString(8).padStart(4, '0')} the frontend socket never exists with more than its final mode and group`, async (t) => {
    const ws = await makeWorkspace(t);
    const cases: { name: string; args: string[]; mode: number; gid: number }[] = [
      { name: 'default', args: [], mode: 0o660, gid: process.getgid?.() ?? 0 },
      { name: 'owner-only', args: ['--uds-mode', '0600'], mode: 0o600, gid: process.getgid?.() ?? 0 },
    ];
    // Giving the socket another group needs root (or membership in that group).
    if (process.getuid?.() === 0) cases.push({ name: 'group', args: ['--uds-mode', '660', '--uds-group', '4242'], mode: 0o660, gid: 4242 });
    for (const c of cases) {
      const file = path.join(ws.dir, `${c.name}.sock`);
      const starting = startServer(t, ws, { name: c.name, umask, extraArgs: c.args });
      const seen = await watchFile(file, starting);
      const server = await starting;
      const st = fs.lstatSync(server.uds);
      t.true(st.isSocket());
      t.is((st.mode & 0o777).toString(8), c.mode.toString(8), `${c.name}: mode`);
      t.is(st.gid, c.gid, `${c.name}: group`);
      for (const [name, state] of seen) {
        // Nobody gains access the final mode and group do not give: no extra bit, and no group or other bit with another group.
        t.is(state.mode & ~c.mode, 0, `${c.name}: seen as ${name}`);
        if (state.gid !== c.gid) t.is(state.mode & 0o077, 0, `${c.name}: seen as ${name}`);
      }
      t.log(`umask ${umask.toString(8).padStart(4, '0')}, ${c.name}: seen as ${[...seen.keys()].join(', ')}`);
      await server.stop();
      t.false(fs.existsSync(server.uds), `${c.name}: the socket is removed at stop`);
    }
  });
}

test('--delete-existing-uds-file removes a stale socket, never a regular file, directory or link, nor a socket a live server holds', async (t) => {
  const ws = await makeWorkspace(t);
  const [agentPort, healthPort] = [await freePort(), await freePort()];
  const start = (file: string, ...extra: string[]): ReturnType<typeof runCli> =>
    runCli([...baseArgs(ws, agentPort, healthPort), '--uds-name', file, '--delete-existing-uds-file', ...extra], 30_000);

  const regular = path.join(ws.dir, 'regular.sock');
  fs.writeFileSync(regular, 'precious');
  const dir = path.join(ws.dir, 'dir.sock');
  fs.mkdirSync(dir);
  const link = path.join(ws.dir, 'link.sock');
  fs.symlinkSync(regular, link);
  for (const [file, kind] of [
    [regular, 'regular file'],
    [dir, 'directory'],
    [link, 'symbolic link'],
  ] as const) {
    const r = await start(file);
    t.is(r.code, 1, `${kind}: ${r.stderr}`);
    t.is(
      r.stderr.trim(),
      `kanal: --uds-name ${file} is a ${kind}, not a socket; Kanal removes only a stale socket there (--delete-existing-uds-file), so move it away or choose another path`,
    );
  }
  t.is(fs.readFileSync(regular, 'utf8'), 'precious', 'the regular file is untouched');
  t.true(fs.statSync(dir).isDirectory());
  t.true(fs.lstatSync(link).isSymbolicLink());

  // A socket a live process serves: refused.
  const live = path.join(ws.dir, 'live.sock');
  const holder = net.createServer((s) => s.destroy());
  await new Promise<void>((resolve) => holder.listen(live, () => resolve()));
  const refused = await start(live);
  t.is(refused.code, 1);
  t.is(refused.stderr.trim(), `kanal: --uds-name ${live}: another process is serving on this socket; stop it first`);
  // The same socket once nobody serves it (a server killed with SIGKILL leaves one): replaced.
  const stale = path.join(ws.dir, 'stale.sock');
  fs.linkSync(live, stale);
  await new Promise<void>((resolve) => holder.close(() => resolve()));
  t.true(fs.lstatSync(stale).isSocket(), 'a stale socket is there');
  const noFlag = await runCli([...baseArgs(ws, agentPort, healthPort), '--uds-name', stale, '--delete-existing-uds-file=false'], 30_000);
  t.is(noFlag.code, 1);
  t.is(
    noFlag.stderr.trim(),
    `kanal: --uds-name ${stale} already exists; pass --delete-existing-uds-file (the default) to replace a stale socket`,
  );
  const server = await startServer(t, ws, { name: 'stale' });
  t.true(fs.lstatSync(server.uds).isSocket(), 'a server starts over a stale socket with --delete-existing-uds-file');
});

test('a missing socket directory is reported as such, not as a permission problem', async (t) => {
  const ws = await makeWorkspace(t);
  const file = path.join(ws.dir, 'no-such-dir', 'kanal.sock');
  const r = await runCli([...baseArgs(ws, await freePort(), await freePort()), '--uds-name', file], 30_000);
  t.is(r.code, 1);
  t.is(
    r.stderr.trim(),
    `kanal: --uds-name ${file}: directory ${path.dirname(file)} does not exist; create it first (systemd: RuntimeDirectory=)`,
  );
});

const IN_USE = 'the address is already in use (another process listens there: stop it or choose another port); EADDRINUSE';

test('a port in use: the error names the flags and the address; the failed start releases the socket file and logs nothing after its fatal line', async (t) => {
  const ws = await makeWorkspace(t);
  const { pki } = ws;
  const uds = path.join(ws.dir, 'frontend.sock');
  const busy = await blockPort(t);
  const cases: { what: string; args: (free: () => Promise<number>) => Promise<string[]>; flags: string }[] = [
    {
      what: 'agent port',
      args: async (free) => [...baseArgs(ws, busy, await free()), '--uds-name', uds],
      flags: '--agent-bind-address, --agent-port',
    },
    {
      what: 'health port',
      args: async (free) => [...baseArgs(ws, await free(), busy), '--uds-name', uds],
      flags: '--health-bind-address, --health-port',
    },
    {
      what: 'frontend port',
      args: async (free) => [
        ...baseArgs(ws, await free(), await free()),
        '--server-bind-address',
        '127.0.0.1',
        '--server-port',
        String(busy),
        '--server-cert',
        pki.frontendCert,
        '--server-key',
        pki.frontendKey,
        '--server-ca-cert',
        pki.frontendCaCert,
      ],
      flags: '--server-bind-address, --server-port',
    },
  ];
  for (const c of cases) {
    const r = await runCli(await c.args(freePort), 30_000);
    const message = `cannot listen on 127.0.0.1:${busy} (${c.flags}): ${IN_USE}`;
    t.is(r.code, 1, `${c.what}: ${r.stderr}`);
    t.is(r.stderr.trim(), `kanal: ${message}`, c.what);
    const lines = logLines(r.stdout);
    const fatal = lines.findIndex((l) => l.level === 'fatal');
    t.is(lines[fatal]?.err, message, `${c.what}: the fatal log line`);
    t.is(fatal, lines.length - 1, `${c.what}: nothing is logged after the fatal line`);
    t.false(
      lines.some((l) => l.msg === 'kanal server started'),
      `${c.what}: never "started"`,
    );
    // Nothing left behind: the next start needs no --delete-existing-uds-file.
    t.false(fs.existsSync(uds), `${c.what}: the socket file was released`);
  }
});

test("the agent's ports in use name their flags as the server's do: health and node listeners stop the start, the admin port is a warning", async (t) => {
  const ws = await makeWorkspace(t);
  const busy = await blockPort(t);
  const agent = (...more: string[]): string[] => [
    'agent',
    '--proxy-server-host=127.0.0.1',
    '--proxy-server-port=9',
    `--ca-cert=${ws.pki.caCert}`,
    '--health-bind-address=127.0.0.1',
    '--health-server-port=0',
    '--admin-bind-address=127.0.0.1',
    '--admin-server-port=0',
    ...more,
  ];
  const fatal: [string, string[], string][] = [
    ['health port', agent(`--health-server-port=${busy}`), '--health-bind-address, --health-server-port'],
    [
      'node listener',
      // An address already on the host (loopback): no interface is made, only the listener is bound.
      agent('--bind-address=127.0.0.1', '--bind-interface-type=none', `--target=${busy}:127.0.0.1:6443`),
      `--bind-address, --target ${busy}:127.0.0.1:6443`,
    ],
  ];
  for (const [what, args, flags] of fatal) {
    const r = await runCli(args, 30_000);
    t.is(r.code, 1, `${what}: ${r.stderr}`);
    t.is(r.stderr.trim(), `kanal: cannot listen on 127.0.0.1:${busy} (${flags}): ${IN_USE}`, what);
  }
  // The admin port is optional: the agent runs on without it (admin-server.ts) and says which flags to change.
  const running = spawnKanal(t, {
    name: 'admin-busy',
    args: agent(`--admin-server-port=${busy}`),
    logFile: path.join(ws.dir, 'admin-busy.log'),
  });
  const line = await running.waitForLog((l) => l.msg === 'admin port not served; running without it', 20_000, 'the admin warning');
  t.is(line.err, `cannot listen on 127.0.0.1:${busy} (--admin-bind-address, --admin-server-port): ${IN_USE}`);
  t.true(running.running());
});

test('in process: a start that fails at its last listener frees the ports and the socket file it had taken', async (t) => {
  const env = await makeEnv(t);
  const busy = await blockPort(t);
  // Assembled from flags as `kanal server` is; its health port is the one in use.
  const { server: failing, close } = await newServerFromFlags(
    [...oneClusterFlags(env.pki, env.udsPath), '--health-bind-address', '127.0.0.1', '--health-port', String(busy)],
    { log: captureLogger('silent').log },
  );
  t.teardown(close);
  const err = await t.throwsAsync(failing.start());
  t.is(err?.message, `cannot listen on 127.0.0.1:${busy} (--health-bind-address, --health-port): ${IN_USE}`);
  t.false(fs.existsSync(env.udsPath), 'the socket file is gone');
  // The agent port it had opened is free again.
  const probe = net.createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', reject);
    probe.listen(failing.agentPort, '127.0.0.1', () => resolve());
  });
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  t.pass();
});

/** A TLS record header announcing 4 KiB of handshake, and only 100 bytes of it. */
const HALF_A_RECORD = Buffer.concat([Buffer.from([0x16, 0x03, 0x01, 0x10, 0x00]), Buffer.alloc(100, 0x42)]);

test("a TLS handshake aborted by a reset is logged with the peer's address", async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { name: 'tls', frontend: 'tcp' });
  for (const [what, port] of [
    ['agent', server.agentPort],
    ['frontend', server.frontendPort],
  ] as const) {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('error', () => undefined);
    await new Promise<void>((resolve) => s.once('connect', () => resolve()));
    const local = `127.0.0.1:${s.localPort}`;
    s.write(HALF_A_RECORD);
    await sleep(100);
    s.resetAndDestroy();
    const line = await server.waitForLog(
      (l) => l.msg === `refused ${what} connection: TLS handshake failed`,
      10_000,
      `${what} handshake refusal`,
    );
    t.is(line.peer, local, what);
    t.is(line.err, 'ECONNRESET', what);
  }
  const unnamed = readLog(server.logFile).filter((l) => 'peer' in l && String(l.peer).includes('undefined'));
  t.deepEqual(unnamed, [], 'no line names an undefined peer');
});
