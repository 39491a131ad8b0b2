/**
 * Text a peer chose never reaches the operator's terminal raw
 * (src/common/terminal-text.ts): a bare agent announces an agentID carrying
 * a one-character CSI (U+009B), an OSC that retitles the terminal (U+009D),
 * a bidi override and a zero-width space; `kanal status` prints it escaped in
 * its table and in its JSON (which still parses back to the same agentID),
 * and the server's text log escapes it too. Real `kanal server` process.
 */
import test from 'ava';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import type { ServerStatusDocument } from '../../src/domain/status-document.js';
import { makeWorkspace, runCli, startServer, waitUntil } from '../helpers/kanal-processes.js';
import { connectRawAgent } from '../helpers/raw-agent.js';

/** What a terminal would act on or show misleadingly, as terminal-text.ts lists it. */
const RAW_UNSAFE =
  // eslint-disable-next-line no-control-regex -- finding control characters is the point
  /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u00ad\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff]/;

/**
 * HTTP/2 carries a header value as bytes, which the server reads as Latin-1:
 * C1 controls arrive as such, and a bidi override sent as UTF-8 arrives as
 * its bytes (U+202E as "\u00e2\u0080\u00ae", the middle one a C1 control).
 * C0 controls (ESC) never arrive: nghttp2 drops a header value holding one
 * (the stream is refused for want of an agentID); the unit tests cover them.
 */
const HOSTILE_ID = `node-\u009b31m-\u009d0;owned\u009c-${Buffer.from('\u202eevil', 'utf8').toString('latin1')}`;
const ESCAPED_ID = 'node-\\u009b31m-\\u009d0;owned\\u009c-\u00e2\\u0080\u00aeevil';

test.serial(
  'an agentID with C1 controls, an OSC and bidi overrides is escaped in kanal status tables, JSON and the text log',
  async (t) => {
    t.timeout(90_000);
    const ws = await makeWorkspace(t, 'kanal-status-hostile-');
    const server = await startServer(t, ws, { extraArgs: ['--logging-format', 'text'] });
    await connectRawAgent(t, ws, server, await issueAgentCertificate(ws.pki, 'node-1'), HOSTILE_ID);
    const admin = ['--admin-address', `127.0.0.1:${server.adminPort}`];

    let json: ServerStatusDocument | undefined;
    let jsonText = '';
    await waitUntil(
      async () => {
        const r = await runCli(['status', ...admin, '-o', 'json']);
        jsonText = r.stdout;
        json = r.code === 0 ? (JSON.parse(r.stdout) as ServerStatusDocument) : undefined;
        return (json?.agents.length ?? 0) === 1;
      },
      'the agent in /status',
      20_000,
    );
    t.is(json?.agents[0].agentID, HOSTILE_ID, 'the JSON parses back to the agentID as announced');
    t.notRegex(jsonText, RAW_UNSAFE, 'no raw control, bidi or invisible character in the JSON');
    t.true(jsonText.includes(`"agentID": "${ESCAPED_ID}"`), jsonText);

    const table = await runCli(['status', ...admin]);
    t.is(table.code, 0, table.stderr);
    t.notRegex(table.stdout, RAW_UNSAFE, 'no raw control, bidi or invisible character in the table');
    t.regex(table.stdout, /1 agent\(s\), 1 tunnel\(s\):\nAGENT +CREDENTIAL/);
    t.true(table.stdout.includes(`\n${ESCAPED_ID}  `), table.stdout);

    // The server logged the connection with the agentID, escaped the same way.
    await waitUntil(() => server.log().includes(ESCAPED_ID), 'the agentID in the text log', 10_000);
    const lines = server.log().split('\n');
    t.true(lines.length > 1, 'the server logged');
    t.deepEqual(
      lines.filter((l) => RAW_UNSAFE.test(l)),
      [],
      'no raw control, bidi or invisible character in any line of the text log',
    );
  },
);
