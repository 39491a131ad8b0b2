/**
 * kit/launch/listener-holder.ts: /proc/net/tcp's hex addresses read in the
 * kernel's byte order, and the holder of a loopback listener told apart: this
 * process, a child it spawned, a child below a forking wrapper, nobody, and a
 * listener in another network namespace (seen only from that namespace).
 */
import test from 'ava';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { CleanupStack, scopedTempDir, type Scope } from '../../kit/launch/cleanup-scope.js';
import { spawnChild, type Child } from '../../kit/launch/child.js';
import { listenerHolder, listenerInodes, parseSocketTable, processTree } from '../../kit/launch/listener-holder.js';
import { createNetns, netnsUnavailableReason } from '../../kit/launch/netns.js';

// Asked before any test is declared: ava wants every test declared synchronously once the file starts.
const netnsUnavailable = await netnsUnavailableReason();
const withNetns = netnsUnavailable === undefined ? test : test.skip;

/** A child that listens on 127.0.0.1 (a port of the kernel's choice), says which, and ends by itself after 60 s at the latest. */
const LISTENER = `const s = require('net').createServer().listen(0, '127.0.0.1', () => console.log(JSON.stringify({ event: 'ready', port: s.address().port })));
setTimeout(() => process.exit(0), 60000);`;

async function listenHere(t: Scope): Promise<number> {
  const server = net.createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return (server.address() as net.AddressInfo).port;
}

async function listeningChild(
  scope: Scope,
  name: string,
  wrapper: readonly string[] = [],
  netns?: string,
): Promise<{ child: Child; port: number }> {
  const dir = scopedTempDir(scope, 'kanal-holder-');
  const child = spawnChild(scope, {
    name,
    argv: [process.execPath, '-e', LISTENER],
    wrapper,
    netns,
    logFile: path.join(dir, `${name}.log`),
  });
  const ready = await child.waitForLine((l) => l.event === 'ready', 10_000, 'listening');
  return { child, port: Number(ready.port) };
}

const littleEndian = os.endianness() === 'LE' ? test : test.skip;

littleEndian("a /proc/net/tcp row is read in the kernel's byte order: 32-bit words in host order, the port as it is", (t) => {
  const header = '  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n';
  const v4 = parseSocketTable(
    `${header}   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0\n`,
  );
  t.deepEqual(
    v4.map((r) => ({ ...r, address: [...r.address].join('.') })),
    [{ address: '127.0.0.1', port: 8080, state: '0A', inode: '4242' }],
  );
  const v6 = parseSocketTable(
    `${header}   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1\n` +
      `   1: 0000000000000000FFFF00000100007F:0051 00000000000000000000000000000000:0000 01 00000000:00000000 00:00000000 00000000     0        0 78 1\n`,
  );
  t.deepEqual(
    v6.map((r) => [r.address.toString('hex'), r.port, r.state, r.inode]),
    [
      ['00000000000000000000000000000001', 80, '0A', '77'],
      ['00000000000000000000ffff7f000001', 81, '01', '78'],
    ],
    '::1 and ::ffff:127.0.0.1, word by word',
  );
});

test('a listener of this process is its own, and not that of a child it spawned', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const port = await listenHere(t);
  t.is(listenerInodes('127.0.0.1', port).length, 1, 'one LISTEN socket on 127.0.0.1:port');
  t.deepEqual(listenerHolder('127.0.0.1', port, process.pid), { kind: 'own', pid: process.pid });
  const { child } = await listeningChild(scope, 'bystander');
  t.deepEqual(listenerHolder('127.0.0.1', port, child.pid), { kind: 'other', pids: [process.pid] }, 'the child does not hold it');
});

test("a child's listener is the child's, and this process's only as the child's parent", async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const { child, port } = await listeningChild(scope, 'listener');
  t.deepEqual(listenerHolder('127.0.0.1', port, child.pid), { kind: 'own', pid: child.pid });
  t.deepEqual(listenerHolder('127.0.0.1', port, process.pid), { kind: 'own', pid: child.pid }, 'a descendant counts');
  const other = await listeningChild(scope, 'other');
  t.deepEqual(
    listenerHolder('127.0.0.1', port, other.child.pid),
    { kind: 'other', pids: [child.pid] },
    "a sibling's listener is not its own",
  );
});

test('below a wrapper that forks rather than execs, the program holding the listener is a descendant of the child', async (t) => {
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  // `sh -c '"$@"; exit $?'` waits for the program instead of becoming it.
  const { child, port } = await listeningChild(scope, 'wrapped', ['/bin/sh', '-c', '"$@"; exit $?', 'wrapper']);
  const program = processTree(child.pid).filter((pid) => pid !== child.pid);
  t.is(program.length, 1, 'the program runs below the shell');
  // The shell's SIGTERM at teardown would leave the program running: end it first.
  t.teardown(() => {
    try {
      process.kill(program[0], 'SIGKILL');
    } catch {
      // ended by itself
    }
  });
  t.deepEqual(listenerHolder('127.0.0.1', port, child.pid), { kind: 'own', pid: program[0] });
});

test('a port nobody listens on has no holder', async (t) => {
  // Nobody can listen on 127.0.0.2:port or the wildcard while this process listens on 127.0.0.1:port.
  const port = await listenHere(t);
  t.deepEqual(listenerInodes('127.0.0.2', port), []);
  t.deepEqual(listenerHolder('127.0.0.2', port, process.pid), { kind: 'none' });
});

withNetns("a listener inside a network namespace is seen from that namespace's /proc view, not from this one's", async (t) => {
  t.timeout(30_000);
  const scope = new CleanupStack();
  t.teardown(() => scope.run());
  const ns = await createNetns('kanal-holder');
  scope.teardown(() => ns.destroy());
  const up = await ns.ip(['link', 'set', 'lo', 'up'], 5000);
  t.is(up.code, 0, up.stderr);
  const { child, port } = await listeningChild(scope, 'in-netns', [], ns.name);
  t.deepEqual(listenerHolder('127.0.0.1', port, child.pid, child.pid), { kind: 'own', pid: child.pid });
  // From this namespace 127.0.0.1:port is some other socket or none: never the child's.
  t.not(listenerHolder('127.0.0.1', port, child.pid).kind, 'own');
});
