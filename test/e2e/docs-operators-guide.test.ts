/**
 * docs/operators-guide.md's shell blocks work as written: the first run on one
 * machine (2.1) with the files docs/certificates.md makes, the agent dialling
 * 127.0.0.1 with `--tls-server-name` (and refused without it, as the guide
 * says), and the CONNECT check over the server's Unix socket (5), with the
 * answers the guide lists for success and for each failure it names.
 */
import test from 'ava';
import fs from 'node:fs';
import path from 'node:path';
import { freePort, kanalCommand } from '../../kit/launch/kanal-cli.js';
import { makeWorkspace, startAgent, startHttpBackend, startServer, waitMetrics } from '../helpers/kanal-processes.js';
import { markedBlock, runBash, setVariables, shBlocks } from '../helpers/doc-blocks.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';

const GUIDE = 'docs/operators-guide.md';

/** A shell word for `s`, single-quoted. */
function quoted(s: string): string {
  return `'${s.replaceAll("'", "'\\''")}'`;
}

/**
 * `kanal` for the guide's blocks: the built CLI, with free ports appended so
 * that parallel tests do not collide on the defaults; the block's mentions of
 * the agent's default health port 8093 become the agent's. `exec`, so that the
 * block's `kill %1` reaches the process itself.
 */
async function kanalOnFreePorts(): Promise<{ prelude: string; agentHealth: number }> {
  const [agentPort, serverHealth, agentHealth] = [await freePort(), await freePort(), await freePort()];
  const cli = kanalCommand().map(quoted).join(' ');
  const prelude = [
    'kanal() {',
    '  case $1 in',
    `    server) exec ${cli} "$@" --agent-port ${agentPort} --health-port ${serverHealth} --admin-port 0 ;;`,
    `    agent) exec ${cli} "$@" --proxy-server-port ${agentPort} --health-server-port ${agentHealth} --admin-server-port 0 ;;`,
    '  esac',
    '}',
    '',
  ].join('\n');
  return { prelude, agentHealth };
}

/** A temp dir holding what docs/certificates.md's commands make. */
async function certificatesMade(scope: Scope): Promise<string> {
  const ws = await makeWorkspace(scope);
  const dir = path.join(ws.dir, 'guide');
  fs.mkdirSync(dir);
  const run = await runBash(scope, shBlocks('docs/certificates.md').join('\n'), { cwd: dir, timeoutMs: 60_000 });
  if (run.code !== 0) throw new Error(`docs/certificates.md's commands failed:\n${run.output}`);
  return dir;
}

test("the first run on one machine: certificates.md's files, the agent on 127.0.0.1 with --tls-server-name, a CONNECT through it", async (t) => {
  const dir = await certificatesMade(t);
  const { prelude, agentHealth } = await kanalOnFreePorts();
  const block = markedBlock(GUIDE, 'first-run');
  t.true(block.includes('--tls-server-name kanal.cp.example.internal'), 'the block dials 127.0.0.1 with the name the certificate carries');
  const run = await runBash(t, prelude + block.replaceAll('8093', String(agentHealth)), { cwd: dir, timeoutMs: 60_000 });
  t.is(run.code, 0, run.output);
  t.regex(run.output, /ok: 1\/1 server tunnel\(s\) up/);
  t.regex(run.output, /^HTTP\/1\.1 200 Connection Established\r?$/m);
});

test('the first run without --tls-server-name: no tunnel, the reason the guide quotes in agent.log, and the check gets 500', async (t) => {
  const dir = await certificatesMade(t);
  const { prelude, agentHealth } = await kanalOnFreePorts();
  const block = markedBlock(GUIDE, 'first-run')
    .replace('--tls-server-name kanal.cp.example.internal ', '')
    // Waits 2 s instead of 10 for the tunnel that will not come, after the server's socket is there (a busy machine
    // may take longer than those 2 s to start the server: the guide's own 10 s cover it).
    .replace('{1..20}', '{1..4}')
    .replace('for i in {1..4}', 'for i in {1..80}; do [ -S ./kanal.sock ] && break; sleep 0.25; done\nfor i in {1..4}');
  t.false(block.includes('--tls-server-name'));
  const run = await runBash(t, prelude + block.replaceAll('8093', String(agentHealth)), { cwd: dir, timeoutMs: 60_000 });
  t.is(run.code, 0, run.output);
  t.notRegex(run.output, /tunnel\(s\) up/);
  t.regex(run.output, /^HTTP\/1\.1 500 /m);
  t.regex(
    fs.readFileSync(path.join(dir, 'agent.log'), 'utf8'),
    /the server certificate is not valid for 127\.0\.0\.1 \(it carries DNS:kanal\.cp\.example\.internal, IP Address:10\.0\.0\.10\)/,
  );
});

test("the CONNECT check over the Unix socket: 200 through an agent, and the guide's 502, 500 and socket errors", async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const agent = await startAgent(t, ws, server);
  await waitMetrics(server.healthPort, { kanal_server_agents: 1 }, 10_000);
  const backend = await startHttpBackend(t, 'hello from a node\n');
  const block = markedBlock(GUIDE, 'connect-check');
  const check = (vars: { SOCKET: string; NODE_ADDRESS: string }): ReturnType<typeof runBash> =>
    runBash(t, setVariables(block, vars), { cwd: ws.dir, timeoutMs: 30_000 });

  const ok = await check({ SOCKET: server.uds, NODE_ADDRESS: backend.address });
  t.is(ok.code, 0, ok.output);
  t.regex(ok.output, /^HTTP\/1\.1 200 Connection Established\r?$/m);
  t.is(backend.accepted(), 1, 'the agent dialled the node address');

  const closed = await check({ SOCKET: server.uds, NODE_ADDRESS: `127.0.0.1:${await freePort()}` });
  t.regex(closed.output, /^HTTP\/1\.1 502 [\s\S]*ECONNREFUSED/m);

  const noSocket = await check({ SOCKET: path.join(ws.dir, 'no-such.sock'), NODE_ADDRESS: backend.address });
  t.not(noSocket.code, 0);
  t.regex(noSocket.output, /No such file or directory/);

  await agent.stop();
  await waitMetrics(server.healthPort, { kanal_server_agents: 0 }, 10_000);
  const noAgent = await check({ SOCKET: server.uds, NODE_ADDRESS: backend.address });
  t.regex(noAgent.output, /^HTTP\/1\.1 500 [\s\S]*no agent is connected/m);
});
