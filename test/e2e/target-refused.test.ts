/**
 * An agent whose --target the server's allow-list refuses says so when its
 * tunnel comes up, naming the target and the server flag to change, and
 * /readyz says it too (the agent names its targets' destinations at
 * connect; the server answers which it refuses: kanal-targets in
 * docs/protocol.md). The allowed target keeps working. Real processes, TLS,
 * loopback only.
 */
import test from 'ava';
import net from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { freePort, httpGet, makeWorkspace, startAgent, startEchoBackend, startServer, levelAtLeast } from '../helpers/kanal-processes.js';

test('a --target off the server allow-list is named at start and on /readyz; the allowed one carries bytes', async (t) => {
  const ws = await makeWorkspace(t);
  const backend = await startEchoBackend(t);
  const refused = '127.0.0.1:9';
  const server = await startServer(t, ws, { extraArgs: ['--allowed-destination', backend.address] });
  const [allowedPort, refusedPort] = [await freePort(), await freePort()];
  const agent = await startAgent(t, ws, server, {
    extraArgs: [
      // An address the host has already: only the listeners are made, no interface.
      '--bind-address=127.0.0.1',
      '--bind-interface-type=none',
      `--target=${allowedPort}:${backend.address}`,
      `--target=${refusedPort}:${refused}`,
    ],
  });
  const says = `refuses --target ${refusedPort}:${refused}: ${refused} is not on its allow-list; add --allowed-destination ${refused} to the server`;
  const warning = await agent.waitForLog((l) => levelAtLeast(l.level, 'warn') && l.msg.includes(says), 10_000, 'the warning');
  t.is(warning.target, refusedPort);
  t.false(
    agent.logLines().some((l) => levelAtLeast(l.level, 'warn') && l.msg.includes(`--target ${allowedPort}:`)),
    'nothing said of the allowed target',
  );
  let body: string;
  const deadline = Date.now() + 10_000;
  for (;;) {
    const r = await httpGet(agent.readyzUrl());
    body = `${r.status} ${r.body}`;
    if ((r.status === 200 && r.body.includes(says)) || Date.now() > deadline) break;
    await sleep(100);
  }
  t.true(body.startsWith('200 ') && body.includes(says), `/readyz names the refused target: ${body}`);
  // The allowed target works: bytes through the node listener, the tunnel, the server, to the backend and back.
  const echoed = await new Promise<string>((resolve, reject) => {
    const s = net.connect(allowedPort, '127.0.0.1', () => s.end('through the allowed target'));
    let got = '';
    s.setEncoding('utf8');
    s.on('data', (d: string) => (got += d));
    s.on('end', () => resolve(got));
    s.on('error', reject);
    s.setTimeout(10_000, () => s.destroy(new Error('no echo within 10 s')));
  });
  t.is(echoed, 'through the allowed target');
});
