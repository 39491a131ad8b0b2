// native/sd-notify.ts against a real AF_UNIX datagram socket (Python's, not
// ours), and Type=notify as systemd sees it from the real `kanal server` and
// `kanal agent` processes: READY=1 when they can serve, STATUS= updates,
// WATCHDOG=1 pings, STOPPING=1 on SIGTERM.

import test from 'ava';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';
import { sdNotify, encodeNotifyAddress, watchdogIntervalMs, SystemdNotifier } from '../../native/sd-notify.js';
import { NotifyListener, logField, portOf, startKanal, tempDir, type Started } from '../helpers/packaging.js';

const linuxTest = process.platform === 'linux' ? test : test.skip;
// The tests below start real server and agent processes: one at a time, so a busy machine does not starve them.
const processTest = process.platform === 'linux' ? test.serial : test.skip;

async function listener(t: { teardown: (fn: () => void) => void }, address: string): Promise<NotifyListener> {
  const l = await NotifyListener.start(address);
  t.teardown(() => l.close());
  return l;
}

async function pki(t: { teardown: (fn: () => Promise<void>) => void }): Promise<{ dir: string; pki: ThrowawayPki }> {
  const tmp = await tempDir('kanal-notify-');
  t.teardown(tmp.remove);
  return { dir: tmp.dir, pki: await writeThrowawayPki(path.join(tmp.dir, 'pki')) };
}

function serverArgs(dir: string, p: ThrowawayPki, extra: string[] = []): string[] {
  return [
    'server',
    '--agent-bind-address',
    '127.0.0.1',
    '--agent-port',
    '0',
    '--cluster-cert',
    p.serverCert,
    '--cluster-key',
    p.serverKey,
    '--cluster-ca-cert',
    p.caCert,
    '--uds-name',
    path.join(dir, 'frontend.sock'),
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    '0',
    '--server-id',
    'notify-test-server',
    ...extra,
  ];
}

function agentArgs(p: ThrowawayPki, port: number, extra: string[] = []): string[] {
  return [
    'agent',
    '--proxy-server-host',
    '127.0.0.1',
    '--proxy-server-port',
    String(port),
    '--ca-cert',
    p.caCert,
    '--agent-cert',
    p.agentCert,
    '--agent-key',
    p.agentKey,
    '--health-server-port',
    '0',
    '--agent-id',
    'notify-test-agent',
    ...extra,
  ];
}

function started(t: { teardown: (fn: () => Promise<unknown>) => void }, s: Started): Started {
  t.teardown(() => s.stop(2000));
  return s;
}

// ---------------------------------------------------------------- the function

linuxTest('sdNotify delivers READY=1 to a file-system NOTIFY_SOCKET', async (t) => {
  const tmp = await tempDir('kanal-notify-');
  t.teardown(tmp.remove);
  const l = await listener(t, path.join(tmp.dir, 'notify.sock'));
  t.deepEqual(sdNotify('READY=1', l.address), { sent: true });
  t.is(await l.waitFor((m) => m.startsWith('READY')), 'READY=1');
});

linuxTest('sdNotify delivers to an abstract "@name" socket, multi-line states intact', async (t) => {
  const l = await listener(t, `@kanal-test-${randomBytes(6).toString('hex')}`);
  t.deepEqual(sdNotify('READY=1\nSTATUS=1/1 server tunnel(s) up', l.address), { sent: true });
  t.is(await l.waitFor((m) => m.startsWith('READY')), 'READY=1\nSTATUS=1/1 server tunnel(s) up');
});

linuxTest('sdNotify reads $NOTIFY_SOCKET by default and is a no-op without it', async (t) => {
  const tmp = await tempDir('kanal-notify-');
  t.teardown(tmp.remove);
  const l = await listener(t, path.join(tmp.dir, 'n.sock'));
  const saved = process.env.NOTIFY_SOCKET;
  t.teardown(() => {
    if (saved === undefined) delete process.env.NOTIFY_SOCKET;
    else process.env.NOTIFY_SOCKET = saved;
  });
  delete process.env.NOTIFY_SOCKET;
  t.deepEqual(sdNotify('READY=1'), { sent: false, reason: 'NOTIFY_SOCKET is not set' });
  process.env.NOTIFY_SOCKET = l.address;
  t.deepEqual(sdNotify('STATUS=from env'), { sent: true });
  t.is(await l.waitFor(() => true), 'STATUS=from env');
});

linuxTest('sdNotify reports failures instead of throwing', (t) => {
  const missing = sdNotify('READY=1', '/nonexistent/dir/notify.sock');
  t.false(missing.sent);
  t.regex(missing.reason ?? '', /sendto \/nonexistent\/dir\/notify\.sock failed \(ENOENT\)/);
  const relative = sdNotify('READY=1', 'relative.sock');
  t.false(relative.sent);
  t.regex(relative.reason ?? '', /only absolute paths and @abstract names/);
  const long = sdNotify('READY=1', `/${'x'.repeat(200)}`);
  t.false(long.sent);
  t.regex(long.reason ?? '', /1-107 bytes/);
  const vsock = sdNotify('READY=1', 'vsock:2:1234');
  t.false(vsock.sent);
});

test('sockaddr_un encoding: path with trailing NUL, abstract name with leading NUL and no trailing NUL', (t) => {
  const p = encodeNotifyAddress('/run/systemd/notify');
  t.is(p.length, 2 + '/run/systemd/notify'.length + 1);
  t.is(p.addr.readUInt16LE(0) === 1 || p.addr.readUInt16BE(0) === 1, true, 'AF_UNIX');
  t.is(p.addr.subarray(2, p.length).toString(), '/run/systemd/notify\0');
  const a = encodeNotifyAddress('@abc');
  t.is(a.length, 2 + 1 + 3);
  t.deepEqual([...a.addr.subarray(2, a.length)], [0, 0x61, 0x62, 0x63]);
});

test('watchdog interval: half of WATCHDOG_USEC, only for the process it names', (t) => {
  t.is(watchdogIntervalMs({ WATCHDOG_USEC: '30000000' }, 42), 15_000);
  t.is(watchdogIntervalMs({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '42' }, 42), 15_000);
  t.is(watchdogIntervalMs({ WATCHDOG_USEC: '30000000', WATCHDOG_PID: '43' }, 42), undefined);
  t.is(watchdogIntervalMs({}, 42), undefined);
  t.is(watchdogIntervalMs({ WATCHDOG_USEC: 'junk' }, 42), undefined);
});

linuxTest('SystemdNotifier: inactive without NOTIFY_SOCKET, READY=1 once, failures reported once', async (t) => {
  t.false(new SystemdNotifier(() => t.fail('no error expected'), {}).active);
  const tmp = await tempDir('kanal-notify-');
  t.teardown(tmp.remove);
  const l = await listener(t, path.join(tmp.dir, 'n.sock'));
  const n = new SystemdNotifier(() => t.fail('no error expected'), { NOTIFY_SOCKET: l.address });
  n.ready('first');
  n.ready('second');
  n.status('line one\nline two');
  n.stopping();
  await l.waitFor((m) => m === 'STOPPING=1');
  t.deepEqual(l.messages, ['READY=1\nSTATUS=first', 'STATUS=line one line two', 'STOPPING=1']);
  const errors: string[] = [];
  const broken = new SystemdNotifier((e) => errors.push(e), { NOTIFY_SOCKET: path.join(tmp.dir, 'nobody-listens.sock') });
  broken.status('a');
  broken.status('b');
  t.is(errors.length, 1);
  t.regex(errors[0], /ENOENT/);
});

// ---------------------------------------------------------------- the commands

processTest('kanal server: READY=1 once it listens, WATCHDOG=1 pings, STOPPING=1 on SIGTERM', async (t) => {
  const { dir, pki: p } = await pki(t);
  const l = await listener(t, path.join(dir, 'notify.sock'));
  const server = started(t, startKanal(serverArgs(dir, p), { env: { ...process.env, NOTIFY_SOCKET: l.address, WATCHDOG_USEC: '200000' } }));
  const ready = await l.waitFor((m) => m.startsWith('READY=1'));
  const agentPort = portOf(await logField(server.out, 'agent listener ready', 'address'));
  t.is(ready, `READY=1\nSTATUS=serving agents on port ${agentPort}`);
  await l.waitFor((m) => m === 'WATCHDOG=1');
  const pingsBefore = l.messages.filter((m) => m === 'WATCHDOG=1').length;
  await new Promise((resolve) => setTimeout(resolve, 500));
  t.true(l.messages.filter((m) => m === 'WATCHDOG=1').length > pingsBefore, 'pings keep coming (every 100 ms)');
  t.is(await server.stop(), 0);
  t.true(l.messages.includes('STOPPING=1'));
});

processTest('kanal agent: READY=1 when the tunnel is up, STATUS on tunnel changes, STOPPING=1 on SIGTERM', async (t) => {
  const { dir, pki: p } = await pki(t);
  const server = started(t, startKanal(serverArgs(dir, p)));
  const agentPort = portOf(await logField(server.out, 'agent listener ready', 'address'));
  const l = await listener(t, path.join(dir, 'notify.sock'));
  const agent = started(
    t,
    startKanal(agentArgs(p, agentPort, ['--connect-timeout', '30s']), { env: { ...process.env, NOTIFY_SOCKET: l.address } }),
  );
  const ready = await l.waitFor((m) => m.startsWith('READY=1'));
  t.is(ready, 'READY=1\nSTATUS=1/1 server tunnel(s) up: notify-test-server');
  await agent.out.waitFor((line) => line.includes('"msg":"tunnel up"'));
  // The tunnel goes down with the server: systemd's status says so.
  t.is(await server.stop(), 0);
  const status = await l.waitFor((m) => m.startsWith('STATUS=no tunnel'));
  t.regex(status, /^STATUS=no tunnel to a proxy server/);
  t.is(await agent.stop(), 0);
  t.is(l.messages[l.messages.length - 1], 'STOPPING=1\nSTATUS=draining');
  t.is(l.messages.filter((m) => m.startsWith('READY=1')).length, 1, 'READY=1 exactly once');
});

processTest('kanal agent: an unreachable server delays READY=1 by --connect-timeout at most', async (t) => {
  const tmp = await tempDir('kanal-notify-');
  t.teardown(tmp.remove);
  const p = await writeThrowawayPki(path.join(tmp.dir, 'pki'));
  const l = await listener(t, path.join(tmp.dir, 'notify.sock'));
  const agent = started(t, startKanal(agentArgs(p, 1, ['--connect-timeout', '1s']), { env: { ...process.env, NOTIFY_SOCKET: l.address } }));
  await agent.out.waitFor((line) => line.includes('"msg":"kanal agent started"'));
  const t0 = Date.now();
  const ready = await l.waitFor((m) => m.startsWith('READY=1'));
  t.regex(ready, /^READY=1\nSTATUS=no tunnel to a proxy server/);
  t.true(
    Date.now() - t0 < 1000 + 5000,
    `READY=1 ${Date.now() - t0} ms after start: --connect-timeout 1s plus slack; the kubelet is not held back`,
  );
});

processTest('without NOTIFY_SOCKET the commands run as before (no notification, no warning)', async (t) => {
  const { dir, pki: p } = await pki(t);
  const env = { ...process.env };
  delete env.NOTIFY_SOCKET;
  const server = started(t, startKanal(serverArgs(dir, p), { env }));
  await logField(server.out, 'agent listener ready', 'address');
  t.is(await server.stop(), 0);
  t.false(server.out.lines.some((line) => line.includes('cannot notify systemd')));
});
