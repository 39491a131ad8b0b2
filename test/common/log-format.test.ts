/**
 * The log formats on the real CLI (docs/operations.md, "Logs"): JSON lines with
 * level names by default, and `--logging-format text` on server and agent, in
 * which a dial address a peer filled with terminal escapes arrives escaped.
 */
import test from 'ava';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { PacketType } from '../../src/wire/packet.js';
import { agentServiceStream } from '../helpers/agent-service-stream.js';
import { jsonObjects } from '../../kit/launch/log-reader.js';
import { makeWorkspace, runCli, startAgent, startServer } from '../helpers/kanal-processes.js';

/** time, level padded to 5, component, two spaces, message. */
const TEXT_LINE = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (TRACE|DEBUG|INFO |WARN |ERROR|FATAL) (server|agent) {2}\S/;
// eslint-disable-next-line no-control-regex -- what must not reach a terminal
const UNSAFE = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/;

test('default: JSON lines whose level is a name', async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws);
  const agent = await startAgent(t, ws, server);
  await agent.waitForLog((l) => l.msg === 'tunnel up', 10_000, 'tunnel up');
  for (const p of [server, agent]) {
    const records = jsonObjects(p.log());
    t.true(records.length > 3, `${p.name} logged`);
    const levels = new Set(records.map((r) => r.level));
    t.true(
      [...levels].every((l) => typeof l === 'string' && ['trace', 'debug', 'info', 'warn', 'error', 'fatal'].includes(l)),
      `${p.name}: ${[...levels].join(', ')}`,
    );
    t.true(levels.has('info'));
  }
});

test("--logging-format text: one readable line per record on server and agent; a peer's escapes arrive escaped", async (t) => {
  const ws = await makeWorkspace(t);
  const server = await startServer(t, ws, { extraArgs: ['--logging-format', 'text', '--log-level', 'info'] });
  const agent = await startAgent(t, ws, server, { extraArgs: ['--logging-format', 'text'] });
  await agent.waitForLog(/ INFO {2}agent {2}tunnel up .*serverID=server/, 10_000, 'tunnel up, in text');
  await server.waitForLog(/ INFO {2}server {2}agent connected .*agentID=agent-1/, 10_000, 'agent connected, in text');

  // A node agent asks for a dial to an address that would clear the screen, retitle the window and reverse the text.
  const hostile = '\u001b[2J\u001b]0;owned\u0007\r\u009b31m\u202eevil:443';
  const node = agentServiceStream(t, {
    ws,
    server,
    credential: await issueAgentCertificate(ws.pki, 'hostile-node'),
    metadata: { agentid: 'hostile-node', 'kanal-features': 'node-dial' },
  });
  await node.send({ type: PacketType.DIAL_REQ, protocol: 'tcp', address: hostile, random: 1n });
  const refusal = await server.waitForLog(/.* WARN {2}server {2}refused node dial.*\n/, 10_000, 'the refusal, in text');
  t.true(refusal.includes('address="\\u001b[2J\\u001b]0;owned\\u0007\\r\\u009b31m\\u202eevil:443"'), refusal);

  for (const p of [server, agent]) {
    const lines = p.log().split('\n').slice(0, -1);
    t.true(lines.length > 3, `${p.name} logged`);
    t.deepEqual(
      lines.filter((l) => !TEXT_LINE.test(l) || UNSAFE.test(l)),
      [],
      `${p.name}: every line is a text line with nothing unsafe in it`,
    );
  }
});

test('--logging-format refuses what it does not know, naming the choices', async (t) => {
  const r = await runCli(['agent', '--logging-format', 'pretty', '--dry-run']);
  t.is(r.code, 2, r.stderr);
  // Names the flag, the value and both choices (the wording is the CLI's).
  for (const word of [/logging-format/, /pretty/, /\bjson\b/, /\btext\b/]) t.regex(r.stderr, word);
});
