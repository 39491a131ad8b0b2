/**
 * Kanal with upstream Konnectivity's own binaries (../shared/upstream), both
 * mixed pairings: an upstream agent under a Kanal server, a Kanal agent under
 * an upstream server. Skips with the reason when the binaries are absent.
 */
import test from 'ava';
import { skippedBecause } from '../helpers/skipped.js';
import { randomBytes } from 'node:crypto';
import {
  connectUnix,
  echoRoundTrip,
  httpConnect,
  makeWorkspace,
  startAgent,
  startEchoBackend,
  startServer,
  waitStatus,
} from '../helpers/kanal-processes.js';
import { startUpstreamAgent, startUpstreamServer, upstreamUnavailableReason } from '../helpers/upstream.js';

const unavailable = upstreamUnavailableReason();
const maybe = unavailable ? test.skip : test.serial;
if (unavailable) skippedBecause('upstream interop', unavailable);

maybe('upstream agent under a Kanal server carries a CONNECT dial', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startServer(t, ws, { extraArgs: ['--mode', 'http-connect'] });
  await startUpstreamAgent(t, ws, server, { agentID: 'upstream-node' });
  await waitStatus(server.readyzUrl(), 200, 10_000);
  const s = await httpConnect(await connectUnix(server.uds), backend.address);
  t.teardown(() => s.destroy());
  t.true(await echoRoundTrip(s, randomBytes(256 * 1024)));
});

maybe('Kanal agent under an upstream server (http-connect mode) carries a CONNECT dial', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const server = await startUpstreamServer(t, ws, { mode: 'http-connect' });
  await startAgent(t, ws, server, { agentID: 'kanal-node' });
  const s = await httpConnect(await connectUnix(server.uds), backend.address);
  t.teardown(() => s.destroy());
  t.true(await echoRoundTrip(s, randomBytes(256 * 1024)));
});
