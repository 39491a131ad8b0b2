/**
 * Servers by name through the real CLI (docs/ha.md): `--proxy-server-host`
 * repeated, one value per server (host:port, as each server here has a port
 * of its own on 127.0.0.1), with the agent's default reconnect timing. The
 * agent holds a tunnel to each within a sync interval, names each address in
 * /readyz and its logs, and is back on a restarted server within about a sync
 * interval of its listening. A name with several addresses is dialled at each
 * (checked here with `localhost` where it resolves to both 127.0.0.1 and ::1;
 * the same logic with a resolver of the test's is in
 * test/agent/servers-by-name.test.ts).
 */
import { execFileSync } from 'node:child_process';
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import {
  echoesThrough,
  freePort,
  httpGet,
  makeWorkspace,
  restartServer,
  startAgent,
  startEchoBackend,
  startServer,
  withPortRetry,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';

/** The agents' defaults (src/agent/settings.ts) over startAgent's faster test timing. */
const DEFAULT_SYNC = ['--sync-interval', '1s', '--sync-interval-cap', '30s'];
const SYNC_MS = 1000;

/** Polls the agent's /readyz until its detail matches; the ms it took, or throws after timeoutMs. */
async function readyDetail(url: string, pattern: RegExp, timeoutMs: number): Promise<{ ms: number; detail: string }> {
  const started = Date.now();
  let last = '';
  while (Date.now() - started < timeoutMs) {
    last = (await httpGet(url)).body;
    if (pattern.test(last)) return { ms: Date.now() - started, detail: last };
    await sleep(20);
  }
  throw new Error(`readyz never matched ${pattern} within ${timeoutMs} ms; last: ${last.trim()}`);
}

test('--proxy-server-host repeated: a tunnel to each server within a sync interval, and back on a restarted one within about one', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const servers: KanalServerProcess[] = [];
  for (const name of ['server-a', 'server-b', 'server-c']) {
    servers.push(await startServer(t, ws, { name, extraArgs: ['--server-count', '3', '--allowed-destination', backend.address] }));
  }
  // startAgent names server-a (--proxy-server-host 127.0.0.1 --proxy-server-port A); the other two with their own ports.
  const hosts = servers.slice(1).flatMap((s) => ['--proxy-server-host', `127.0.0.1:${s.agentPort}`]);
  const agent = await startAgent(t, ws, servers[0], { extraArgs: [...DEFAULT_SYNC, ...hosts] });
  const all = await readyDetail(agent.readyzUrl(), /^ok: 3\/3 server tunnel\(s\) up/, SYNC_MS);
  t.log(`three tunnels ${all.ms} ms after the first`);
  for (const s of servers) t.true(all.detail.includes(`${s.name} (127.0.0.1:${s.agentPort})`), all.detail);
  for (const s of servers) t.true(await echoesThrough(s, backend.address, randomBytes(4096)), `through ${s.name}`);
  const up = agent.logLines().filter((l) => l.msg === 'tunnel up');
  t.deepEqual(up.map((l) => l.address).sort(), servers.map((s) => `127.0.0.1:${s.agentPort}`).sort());

  // server-b restarts: the agent keeps the others and is back on it about a sync interval after it listens.
  t.is(await servers[1].stop('SIGTERM'), 0);
  const down = await readyDetail(agent.readyzUrl(), /^ok: 2\/3 server tunnel\(s\) up/, 5000);
  t.regex(down.detail, new RegExp(`no tunnel through 127\\.0\\.0\\.1:${servers[1].agentPort} \\(last error: `));
  await sleep(2000);
  servers[1] = await restartServer(t, servers[1]);
  const back = await readyDetail(agent.readyzUrl(), /^ok: 3\/3 server tunnel\(s\) up/, 5000);
  t.log(`back on the restarted server ${back.ms} ms after its /healthz answered (sync interval ${SYNC_MS} ms)`);
  t.true(back.ms <= SYNC_MS + 1000, `${back.ms} ms`);
  t.true(await echoesThrough(servers[1], backend.address, randomBytes(4096)));
});

/**
 * Why the real-resolver test cannot run here, or undefined. Asked of the
 * system's resolver in a child process: ava takes only tests declared
 * synchronously, and dns.lookup answers asynchronously.
 */
function localhostNotDualStack(): string | undefined {
  const script =
    "require('dns').lookup('localhost', { all: true }, (e, a) => console.log(JSON.stringify((a || []).map((x) => x.address))))";
  let found: string[] = [];
  try {
    found = JSON.parse(execFileSync(process.execPath, ['-e', script], { timeout: 10_000, encoding: 'utf8' })) as string[];
  } catch {
    // no answer: not dual-stack as far as this test can tell
  }
  return found.includes('127.0.0.1') && found.includes('::1')
    ? undefined
    : `localhost resolves to ${found.join(', ') || 'nothing'} here, not to both 127.0.0.1 and ::1 (tests do not edit the hosts file)`;
}

const notDualStack = localhostNotDualStack();
if (notDualStack) test.skip(`a name with two addresses (localhost): skipped, ${notDualStack}`, () => undefined);
else
  test('a name with two addresses (localhost: 127.0.0.1 and ::1): a tunnel through each, the certificate checked against the name', async (t) => {
    const ws = await makeWorkspace(t);
    // Both on one freePort() port, which startServer keeps across its retries: when another test file's process
    // took it on either address (EADDRINUSE), both start again on a fresh one.
    const { port, servers } = await withPortRetry(async () => {
      const port = await freePort();
      const servers: KanalServerProcess[] = [];
      try {
        for (const [name, address] of [
          ['server-v4', '127.0.0.1'],
          ['server-v6', '::1'],
        ] as const) {
          servers.push(await startServer(t, ws, { name, extraArgs: ['--agent-bind-address', address, '--agent-port', String(port)] }));
        }
      } catch (err) {
        for (const s of servers) await s.stop();
        throw err;
      }
      return { port, servers };
    });
    const agent = await startAgent(
      t,
      ws,
      { agentPort: port },
      { extraArgs: ['--proxy-server-host', 'localhost', '--proxy-server-port', String(port)] },
    );
    const all = await readyDetail(agent.readyzUrl(), /^ok: 2\/2 server tunnel\(s\) up/, SYNC_MS);
    t.true(all.detail.includes(`server-v4 (127.0.0.1:${port})`), all.detail);
    t.true(all.detail.includes(`server-v6 ([::1]:${port})`), all.detail);
    t.is(servers.length, 2);
  });
