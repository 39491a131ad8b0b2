/**
 * The `connection ended` line written by hand (src/common/fixed-log-line.ts,
 * used by src/audit/connection-auditor.ts) is the line pino writes for the
 * same fields, byte for byte, with the production logger's options
 * (logger.ts) and a child's bindings, including strings a peer chose
 * (quotes, control characters, lone surrogates, beyond the field bound);
 * loggers it cannot write for as pino would get pino's own path.
 */
import test from 'ava';
import { pino, type Logger } from 'pino';
import { ConnectionAuditor } from '../../src/audit/connection-auditor.js';
import { FixedLogLine, isoNow } from '../../src/common/fixed-log-line.js';
import { MAX_LOG_STRING, truncateForLog } from '../../src/common/log-safety.js';
import { loggerOptions } from '../../src/common/logger.js';
import type { TunnelConnection } from '../../src/tunnel/connection.js';
import type { AuditRecord } from '../../src/audit/audit-record.js';

function rawLogger(options: pino.LoggerOptions): { log: Logger; raw: string[] } {
  const raw: string[] = [];
  return { log: pino(options, { write: (s: string) => raw.push(s) }), raw };
}

/** The line with its time and duration replaced: the two paths run a millisecond apart at most. */
const timeless = (line: string): string => line.replace(/"time":"[^"]*"/, '"time":"T"').replace(/"durationMs":\d+/, '"durationMs":0');

const HOSTILE = `a"b\\c\n\u0001\ud800${'z'.repeat(2 * MAX_LOG_STRING)}`;

function conn(o: Partial<Record<keyof TunnelConnection, unknown>> = {}): TunnelConnection {
  return {
    role: 'dialer',
    dialID: 12345678901234567890n,
    connectID: 3,
    address: HOSTILE,
    dialMs: 1.26,
    bytesIn: 2000,
    bytesOut: 100,
    openedAt: Date.now() - 5,
    endedBy: 'peer',
    closeReason: `reset "${HOSTILE}"`,
    client: { address: 'unix:/run/kas.sock' },
    ...o,
  } as unknown as TunnelConnection;
}

/** What the auditor logged before it wrote the line by hand: the same object through pino. */
function pinoLine(log: Logger, c: TunnelConnection, party: { agent: { id: string; credential?: string }; server?: { id: string } }): void {
  log.info(
    {
      dialID: String(c.dialID),
      connectID: c.connectID,
      direction: 'cp_to_node',
      agentID: party.agent.id,
      credential: party.agent.credential,
      serverID: party.server?.id,
      client: c.client?.address,
      destination: truncateForLog(c.address),
      dialMs: Math.round(c.dialMs * 10) / 10,
      toDestination: c.bytesOut,
      toClient: c.bytesIn,
      durationMs: Date.now() - c.openedAt,
      closedBy: 'destination',
      reason: truncateForLog(c.closeReason),
    },
    'connection ended',
  );
}

test('the line is the one pino writes for the same fields: production options, a child, hostile strings', (t) => {
  const { log, raw } = rawLogger(loggerOptions('info', 'server'));
  const child = log.child({ tenant: 'beta', agentID: HOSTILE });
  t.truthy(FixedLogLine.info(child, 'connection ended'), 'the production logger gets the written line');
  const parties = [{ agent: { id: HOSTILE, credential: 'CN="node-1"' }, server: { id: 'server-a' } }, { agent: { id: 'node-1' } }];
  for (const party of parties) {
    for (const c of [conn(), conn({ client: undefined, dialMs: Number.NaN })]) {
      raw.length = 0;
      new ConnectionAuditor({ side: 'server', log: child }).connectionEnded(c, party);
      pinoLine(child, c, party);
      t.is(raw.length, 2);
      t.is(timeless(raw[0]), timeless(raw[1]));
      t.notThrows(() => JSON.parse(raw[0]) as unknown);
    }
  }
});

test('the line and the audit record share their time, the time of the line pino would write', (t) => {
  const { log, raw } = rawLogger(loggerOptions('info', 'agent'));
  const records: AuditRecord[] = [];
  const before = Date.now();
  new ConnectionAuditor({ side: 'agent', log, sink: { write: (r) => records.push(r) } }).connectionEnded(conn({ role: 'performer' }), {
    agent: { id: 'node-1' },
  });
  const line = JSON.parse(raw[0]) as { time: string; level: string; component: string };
  t.is(line.time, records[0].time);
  t.true(Date.parse(line.time) >= before && Date.parse(line.time) <= Date.now());
  t.like(line, { level: 'info', component: 'agent' });
  t.regex(isoNow(), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
});

test("loggers whose lines it cannot write as pino would get pino's path, with the same line", (t) => {
  const options: pino.LoggerOptions[] = [
    { mixin: () => ({ extra: 1 }) },
    { hooks: { streamWrite: (s) => s.replace('connection', 'CONNECTION') } },
    { formatters: { log: (o) => ({ ...o, wrapped: true }) } },
    { nestedKey: 'payload' },
    { msgPrefix: '[kanal] ' },
  ];
  for (const o of options) {
    const { log, raw } = rawLogger(o);
    t.is(FixedLogLine.info(log, 'connection ended'), undefined, JSON.stringify(Object.keys(o)));
    new ConnectionAuditor({ side: 'server', log }).connectionEnded(conn(), { agent: { id: 'node-1' } });
    t.is(raw.length, 1);
    t.true(raw[0].includes('connection ended') || raw[0].includes('CONNECTION ended'));
  }
  // Pino's defaults (numeric level, epoch time, pid and hostname) are still written as pino would.
  const { log, raw } = rawLogger({ timestamp: () => ',"time":42' });
  const plain = conn({ address: '10.0.0.5:10250', closeReason: 'EOF' });
  new ConnectionAuditor({ side: 'server', log }).connectionEnded(plain, { agent: { id: 'node-1' } });
  pinoLine(log, plain, { agent: { id: 'node-1' } });
  t.regex(raw[0], /^\{"level":30,"time":42,"pid":\d+,"hostname":/);
  t.is(timeless(raw[0]), timeless(raw[1]));
});

test("isoNow is toISOString's text of the millisecond it runs in", (t) => {
  for (let i = 0; i < 2000; i++) {
    const before = Date.now();
    const text = isoNow();
    const after = Date.now();
    const ms = Date.parse(text);
    t.true(ms >= before && ms <= after);
    t.is(text, new Date(ms).toISOString());
  }
});

test.serial('isoNow pads the milliseconds and moves on with each second and millisecond', (t) => {
  const realNow = Date.now;
  t.teardown(() => (Date.now = realNow));
  const base = Date.UTC(2026, 11, 31, 23, 59, 59);
  for (const v of [base, base + 5, base + 5, base + 50, base + 999, base + 1000, base + 1007, 0, 253402300799999]) {
    Date.now = () => v;
    t.is(isoNow(), new Date(v).toISOString(), String(v));
  }
});
