/**
 * Receive-window growth through the real CLI, seen on /metrics: a bulk
 * transfer grows the windows its receiving side grants (the server for a
 * download, the agent for an upload) and the growth is given back when the
 * connection closes; --max-connection-window 1048576 keeps the first window.
 */
import test, { type ExecutionContext } from 'ava';
import { createHash, randomBytes } from 'node:crypto';
import {
  readExactly,
  receiveAtLeast,
  scrapeMetrics,
  startFirehoseBackend,
  startProxy,
  startSinkBackend,
  tunnelThrough,
  waitMetrics,
  writeAll,
  type KanalServerProcess,
} from '../helpers/kanal-processes.js';

const MiB = 1024 * 1024;
const FIRST_WINDOW = MiB;
const DEFAULT_MAX_WINDOW = 4 * MiB;

/** Downloads 32 MiB from a node-side firehose; returns the server's window growth while the connection is still open. */
async function growthDuringDownload(t: ExecutionContext, server: KanalServerProcess): Promise<number> {
  const firehose = await startFirehoseBackend(t);
  const s = await tunnelThrough(t, server, firehose.address);
  await receiveAtLeast(s, 32 * MiB, 60_000);
  const growth = (await scrapeMetrics(server.healthPort)).get('kanal_server_window_growth_bytes');
  s.destroy();
  await waitMetrics(server.healthPort, { kanal_server_connections_open: 0, kanal_server_window_growth_bytes: 0 }, 10_000);
  return growth ?? Number.NaN;
}

test('a bulk download grows the server-side windows, up to the 4 MiB default, and gives the growth back on close', async (t) => {
  const { server } = await startProxy(t);
  t.is((await scrapeMetrics(server.healthPort)).get('kanal_server_window_growth_bytes'), 0, 'nothing held before');
  const growth = await growthDuringDownload(t, server);
  t.log(`window growth held by the server during a 32 MiB download: ${growth} B`);
  t.true(growth >= FIRST_WINDOW, `the window grew (${growth} B beyond the first window)`);
  t.true(growth <= DEFAULT_MAX_WINDOW - FIRST_WINDOW, `within the default maximum (${growth} B)`);
  t.is(growth % FIRST_WINDOW, 0, 'grown by doubling from 1 MiB');
});

test('--max-connection-window 1048576 on the server keeps every window at 1 MiB', async (t) => {
  const { server } = await startProxy(t, { server: { extraArgs: ['--max-connection-window', '1048576'] } });
  t.is(await growthDuringDownload(t, server), 0);
});

test('a bulk upload grows the agent-side windows; closing gives the growth back', async (t) => {
  const { server, agent } = await startProxy(t);
  const size = 32 * MiB;
  const sink = await startSinkBackend(t, size);
  const s = await tunnelThrough(t, server, sink.address);
  const payload = randomBytes(size);
  const digest = readExactly(s, 64, 60_000);
  await writeAll(s, payload);
  t.is((await digest).toString('latin1'), createHash('sha256').update(payload).digest('hex'), 'the node-side sink got every byte');
  const growth = (await scrapeMetrics(agent.healthPort)).get('kanal_agent_window_growth_bytes') ?? Number.NaN;
  t.log(`window growth held by the agent during a 32 MiB upload: ${growth} B`);
  t.true(growth >= FIRST_WINDOW && growth <= DEFAULT_MAX_WINDOW - FIRST_WINDOW, `the agent's window grew (${growth} B)`);
  s.destroy();
  await waitMetrics(agent.healthPort, { kanal_agent_connections_open: 0, kanal_agent_window_growth_bytes: 0 }, 10_000);
});
