/**
 * `kanal server` and `kanal agent` keep V8's young generation at its initial
 * size (src/cli/young-generation.ts, #15): start-up and connection set-up
 * used to grow it to 16 MiB, pages an idle proxy then held for good. Read
 * from each process's own /metrics (prom-client's heap space gauges) after a
 * start and a few hundred tunnelled connections.
 */
import test from 'ava';
import { connectThrough, echoRoundTrip, makeWorkspace, scrapeMetrics, startEchoBackend, startPair } from '../helpers/kanal-processes.js';

const NEW_SPACE = 'nodejs_heap_space_size_total_bytes{space="new"}';
/** V8's initial young generation is 1 MiB per semi-space; it used to reach 16. */
const MAX_NEW_SPACE_BYTES = 4 * 1024 * 1024;
const CONNECTIONS = 300;

test('the young generation stays small through start-up and connection set-up, in the server and the agent', async (t) => {
  const ws = await makeWorkspace(t);
  const echo = await startEchoBackend(t);
  const { server, agent } = await startPair(t, ws);
  for (let i = 0; i < CONNECTIONS; i++) {
    const socket = await connectThrough(server, echo.address);
    t.true(await echoRoundTrip(socket, Buffer.from(`ping ${i}`)));
    socket.destroy();
  }
  for (const [name, port] of [['server', server.healthPort], ['agent', agent.adminPort]] as const) {
    const newSpace = (await scrapeMetrics(port)).get(NEW_SPACE);
    t.truthy(newSpace, `${name} exposes ${NEW_SPACE}`);
    t.true(newSpace! <= MAX_NEW_SPACE_BYTES, `${name}: young generation ${((newSpace ?? 0) / 1048576).toFixed(1)} MiB (at most ${MAX_NEW_SPACE_BYTES / 1048576} MiB)`);
  }
});
