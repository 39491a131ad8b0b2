/**
 * How `kanal status` picks its admin port (src/cli/status-command.ts): the
 * first address where something listens answers, whatever it says; with
 * none, the error lists each address tried. Real loopback sockets.
 */
import test from 'ava';
import http from 'node:http';
import net from 'node:net';
import { findStatus } from '../../src/cli/status-command.js';
import { freePort } from '../../kit/launch/kanal-cli.js';

/** An HTTP server on 127.0.0.1 answering every request with `status` and `body`; closed by the test. */
async function answering(t: { teardown(fn: () => Promise<void>): void }, status: number, body: string): Promise<number> {
  const s = http.createServer((_req, res) => res.writeHead(status, { 'content-type': 'application/json' }).end(body));
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', () => resolve()));
  t.teardown(() => new Promise<void>((resolve) => (s.closeAllConnections(), s.close(() => resolve()))));
  return (s.address() as net.AddressInfo).port;
}

const AGENT_DOC = { kind: 'kanal-status', version: 2, component: 'agent', agent: { agentID: 'node-1' } };
const at = (port: number, what: string): { address: { host: string; port: number }; what: string } => ({
  address: { host: '127.0.0.1', port },
  what,
});

test('the first address where nothing listens is skipped for the next (the server default, then the agent)', async (t) => {
  const agent = await answering(t, 200, JSON.stringify(AGENT_DOC));
  const doc = await findStatus([at(await freePort(), 'server'), at(agent, 'agent')], 5000);
  t.is(doc.component, 'agent');
});

test('an address that answers with something else ends the search with what it is', async (t) => {
  const other = await answering(t, 404, 'nope');
  const agent = await answering(t, 200, JSON.stringify(AGENT_DOC));
  const err = await t.throwsAsync(findStatus([at(other, 'server'), at(agent, 'agent')], 5000));
  t.regex(err.message, new RegExp(`^127\\.0\\.0\\.1:${other} answered HTTP 404`));
});

test('with nothing listening anywhere, the error lists every address tried and names --admin-address', async (t) => {
  const [a, b] = [await freePort(), await freePort()];
  const err = await t.throwsAsync(findStatus([at(a, "the server's default admin port"), at(b, "the agent's default admin port")], 5000));
  t.is(
    err.message,
    `no Kanal admin port answers: 127.0.0.1:${a} (the server's default admin port): nothing listens there; ` +
      `127.0.0.1:${b} (the agent's default admin port): nothing listens there. ` +
      'Is a kanal server or agent running on this host with its admin port on? Name its address with --admin-address host:port',
  );
});
