/**
 * Servers by name (docs/ha.md): an agent (ServerTunnels, in this process)
 * given one name that resolves to three addresses holds a tunnel through each,
 * checks each server's certificate against the name, is back on a restarted
 * server within about a sync interval of it listening, and follows the name's
 * addresses as they change. The resolver is the test's (tests do not touch
 * the hosts file); the servers are `kanal server` children on 127.0.0.1,
 * 127.0.0.2 and 127.0.0.3, one port, as three hosts of one service would be.
 */
import fs from 'node:fs';
import test, { type ExecutionContext } from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { ServerTunnels } from '../../src/agent/server-tunnels.js';
import type { LookupAll } from '../../src/agent/server-addresses.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { captureLogger, type CapturedLogger } from '../helpers/memory-stream.js';
import {
  freePort,
  makeWorkspace,
  restartServer,
  startServer,
  waitUntil,
  type KanalServerProcess,
  type Workspace,
} from '../helpers/kanal-processes.js';

const ADDRESSES = ['127.0.0.1', '127.0.0.2', '127.0.0.3'] as const;
/** The name the servers' certificate carries (kit/pki: DNS localhost). */
const NAME = 'localhost';
const SYNC_MS = 1000;

/** `kanal server` children named server-1..3, one on each address, all on `port`. */
async function startServers(t: ExecutionContext, ws: Workspace, port: number, serverCount: number): Promise<KanalServerProcess[]> {
  const servers: KanalServerProcess[] = [];
  for (const [i, address] of ADDRESSES.entries()) {
    const extraArgs = ['--agent-bind-address', address, '--agent-port', String(port), '--server-count', String(serverCount)];
    servers.push(await startServer(t, ws, { name: `server-${i + 1}`, extraArgs }));
  }
  return servers;
}

/** An agent dialling NAME:port, NAME resolved by `lookup`; stopped at teardown. */
async function startAgent(
  t: ExecutionContext,
  ws: Workspace,
  port: number,
  lookup: LookupAll,
  reconnect = { initialMs: SYNC_MS, maxMs: 30_000 },
): Promise<{ agent: ServerTunnels; logs: CapturedLogger }> {
  const own = await issueAgentCertificate(ws.pki, 'node-1');
  const logs = captureLogger('debug');
  const agent = new ServerTunnels({
    agentID: 'node-1',
    agentIdentifiers: '',
    server: {
      hosts: [{ host: NAME, port }],
      tls: { ca: fs.readFileSync(ws.pki.caCert), cert: fs.readFileSync(own.cert), key: fs.readFileSync(own.key) },
    },
    lookup,
    dialTimeoutMs: 5000,
    connectTimeoutMs: 5000,
    reconnect,
    transport: h2Transport,
    log: logs.log,
  });
  t.teardown(() => agent.stop(0));
  await agent.start();
  return { agent, logs };
}

/** The addresses of the tunnels held, sorted. */
function through(agent: ServerTunnels): string[] {
  return agent
    .stats()
    .tunnels.map((s) => s.address)
    .sort();
}

test('a name with three addresses: a tunnel through each within a sync interval, and back within about one after a restart', async (t) => {
  const ws = await makeWorkspace(t);
  const port = await freePort();
  const servers = await startServers(t, ws, port, 3);
  const started = Date.now();
  const { agent, logs } = await startAgent(t, ws, port, () => Promise.resolve([...ADDRESSES]));
  await waitUntil(() => agent.tunnels().length === 3, 'a tunnel through each address', SYNC_MS);
  t.log(`three tunnels ${Date.now() - started} ms after start`);
  t.deepEqual(
    through(agent),
    ADDRESSES.map((a) => `${a}:${port}`),
  );
  const detail = agent.readiness().detail;
  t.regex(detail, /^3\/3 server tunnel\(s\) up: /);
  for (const [i, a] of ADDRESSES.entries()) t.true(detail.includes(`server-${i + 1} (${a}:${port})`), detail);
  t.deepEqual(logs.matching('server count and server addresses disagree'), []);

  // One server restarts: the agent is on it again within about a sync interval of its listening.
  t.is(await servers[1].stop('SIGTERM'), 0);
  await waitUntil(() => agent.tunnels().length === 2, 'the tunnel to server-2 is down', 5000);
  t.regex(agent.readiness().detail, new RegExp(`no tunnel through 127\\.0\\.0\\.2:${port} \\(last error: `));
  await sleep(2000);
  servers[1] = await restartServer(t, servers[1]);
  const listening = Date.now();
  await waitUntil(() => agent.tunnels().length === 3, 'back on server-2', 3000);
  const back = Date.now() - listening;
  t.log(`back on the restarted server ${back} ms after its /healthz answered (sync interval ${SYNC_MS} ms)`);
  t.true(back <= SYNC_MS + 500, `${back} ms`);
  const up = logs.lines.filter((l) => l.msg === 'tunnel up').map((l) => l.address);
  t.deepEqual(up.slice(3), [`127.0.0.2:${port}`]);
});

test('the addresses follow the name: a new one gets a tunnel, a removed one is not dialled again; a count that disagrees is said', async (t) => {
  const ws = await makeWorkspace(t);
  const port = await freePort();
  // The servers count two of themselves; the name will have three addresses for a while.
  const servers = await startServers(t, ws, port, 2);
  let answer: string[] = [ADDRESSES[0], ADDRESSES[1]];
  // Resolved again every cap (2 s here).
  const { agent, logs } = await startAgent(t, ws, port, () => Promise.resolve(answer), { initialMs: 200, maxMs: 2000 });
  await waitUntil(() => agent.tunnels().length === 2, 'two tunnels', 2000);

  answer = [...ADDRESSES];
  await waitUntil(() => agent.tunnels().length === 3, 'a tunnel through the new address', 5000);
  await waitUntil(() => logs.matching('server count and server addresses disagree').length === 1, 'the disagreement logged', 1000);
  t.regex(agent.readiness().detail, /the servers count 2 \(KNP server response headers\), 3 address\(es\) reach distinct servers/);

  // Removed from the name: its tunnel stays while it lasts, and is not opened again.
  answer = [ADDRESSES[0], ADDRESSES[2]];
  await waitUntil(() => logs.matching('proxy server address no longer resolved').length === 1, 'the removal logged', 5000);
  t.is(agent.tunnels().length, 3);
  t.is(await servers[1].stop('SIGTERM'), 0);
  await waitUntil(() => agent.tunnels().length === 2, 'the tunnel to server-2 is down', 5000);
  servers[1] = await restartServer(t, servers[1]);
  await sleep(3000);
  t.deepEqual(through(agent), [`127.0.0.1:${port}`, `127.0.0.3:${port}`]);
  t.true(logs.lines.every((l) => !(l.msg === 'cannot connect to proxy server' && l.server === `127.0.0.2:${port}`)));
  // Two addresses again, two servers counted: nothing to say.
  t.notRegex(agent.readiness().detail, /disagree|count 2/);
});

test('a name that resolves to one address is dialled by name, as one address for every server (a balancer)', async (t) => {
  const ws = await makeWorkspace(t);
  const port = await freePort();
  const [server] = await startServers(t, ws, port, 1);
  const lookups: string[] = [];
  const { agent, logs } = await startAgent(t, ws, port, (name) => {
    lookups.push(name);
    return Promise.resolve([ADDRESSES[0]]);
  });
  await waitUntil(() => agent.tunnels().length === 1, 'a tunnel', 5000);
  t.deepEqual(through(agent), [`${NAME}:${port}`]);
  t.is(agent.readiness().detail, '1/1 server tunnel(s) up: server-1');
  t.like(logs.matching('proxy server addresses')[0], { addresses: [`${NAME}:${port}`], mode: 'one address for every server' });
  t.deepEqual(lookups, [NAME]);
  t.true(server.running());
});
