/**
 * `kanal status` and `kanal agent --check` show what a peer chose escaped
 * (src/common/terminal-text.ts): an agent's status whose server error texts
 * and IDs carry ESC, CSI, OSC and bidi overrides prints none of them raw,
 * in tables and JSON, with its columns still aligned.
 */
import test from 'ava';
import { formatStatus, formatStatusJson } from '../../src/cli/status-format.js';
import { formatPreflight } from '../../src/agent/preflight.js';
import type { AgentStatusDocument } from '../../src/domain/status-document.js';
import { hasUnsafeForTerminal } from '../../src/common/terminal-text.js';

const EVIL = '\u001b[2J\u009b31m\u009d0;title\u0007\u202eevil\u2066';
const EVIL_ESCAPED = '\\u001b[2J\\u009b31m\\u009d0;title\\u0007\\u202eevil\\u2066';

const tunnel = {
  state: 'open' as const,
  since: '2026-12-01T00:00:00.000Z',
  ageSeconds: 5,
  features: ['window'],
  peerDraining: false,
  readPaused: false,
  connections: { cpToNode: 0, nodeToCp: 0 },
  pendingDials: { cpToNode: 0, nodeToCp: 0 },
  bytes: { toPeer: 0, fromPeer: 0 },
};

const DOC: AgentStatusDocument = {
  kind: 'kanal-status',
  version: 2,
  generatedAt: '2026-12-01T00:00:05.000Z',
  process: { version: '1', commit: 'c', pid: 1, uptimeSeconds: 5 },
  recent: { refusals: {}, throttles: {} },
  component: 'agent',
  agent: { agentID: 'node-1', state: 'running', expectedServers: { count: 1, from: 'serverCount' } },
  servers: [{ address: '127.0.0.1:8091', name: '127.0.0.1', state: 'backing-off', serverIDs: [`s${EVIL}`], lastError: `refused: ${EVIL}` }],
  tunnels: [{ ...tunnel, serverID: `s${EVIL}`, address: '127.0.0.1:8091' }],
};

/** Whether any line but its line breaks holds a character a terminal acts on. */
const raw = (text: string): boolean => text.split('\n').some(hasUnsafeForTerminal);

test('status tables: a server ID and error text with ESC, CSI, OSC and bidi overrides print escaped, columns aligned', (t) => {
  const out = formatStatus(DOC);
  t.false(raw(out), out);
  t.true(out.includes(`refused: ${EVIL_ESCAPED}`.slice(0, 40)), out);
  const lines = out.split('\n');
  const header = lines.findIndex((l) => l.startsWith('SERVER ID'));
  t.true(header > 0, out);
  // The ADDRESS column starts where its header does: widths were measured on the escaped text.
  t.is(lines[header + 1].indexOf('127.0.0.1:8091'), lines[header].indexOf('ADDRESS'), out);
});

test('status JSON: escaped as \\uXXXX and parses back to the document as served', (t) => {
  const out = formatStatusJson(DOC);
  t.false(raw(out), out);
  t.true(out.includes(`"lastError": "refused: ${EVIL_ESCAPED}"`), out);
  t.deepEqual(JSON.parse(out), DOC);
});

test('--check: a server certificate subject and error text from the server print escaped', (t) => {
  const out = formatPreflight(
    [
      { name: 'server-tls', status: 'pass', detail: `server CN=${EVIL} verified` },
      { name: 'server-accepts-agent', status: 'fail', detail: `AgentService/Connect failed: ${EVIL}\nsecond line` },
    ],
    `kanal agent --check (agent ID node${EVIL})`,
  );
  t.false(raw(out), out);
  t.true(out.includes(`server CN=${EVIL_ESCAPED} verified`), out);
  t.true(out.includes(`${EVIL_ESCAPED}\\nsecond line`), 'a line break in a detail stays on its line');
  t.is(out.split('\n').length, 5, 'heading, two checks, summary, final newline');
});
