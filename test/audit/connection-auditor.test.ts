/**
 * The records the connection auditor writes (src/audit/connection-auditor.ts)
 * and the log line each ended connection gets: every field, who closed it
 * (closedBy from each side's role), failed and forbidden dials, refused
 * peers, the tenant on every kind, and strings a peer chose cut to size.
 */
import test from 'ava';
import { ConnectionAuditor, directionOf, type ConnectionAuditorOptions } from '../../src/audit/connection-auditor.js';
import type { AuditRecord } from '../../src/audit/audit-record.js';
import { AUDIT_VERSION } from '../../src/audit/audit-record.js';
import { MAX_LOG_STRING, truncateForLog } from '../../src/common/log-safety.js';
import { DialError } from '../../src/tunnel/errors.js';
import type { TunnelConnection } from '../../src/tunnel/connection.js';
import { captureLogger } from '../helpers/memory-stream.js';

/** What the auditor reads of a connection that left its tunnel's table. */
type Ended = Pick<
  TunnelConnection,
  'role' | 'dialID' | 'connectID' | 'address' | 'dialMs' | 'bytesIn' | 'bytesOut' | 'openedAt' | 'endedBy' | 'closeReason' | 'client'
>;

function ended(o: Partial<Ended> = {}): TunnelConnection {
  const conn: Ended = {
    role: 'dialer',
    dialID: 7n,
    connectID: 3,
    address: '10.0.0.5:10250',
    dialMs: 12.34,
    bytesIn: 2000,
    bytesOut: 100,
    openedAt: Date.now() - 50,
    endedBy: 'local',
    closeReason: 'EOF',
    client: { address: 'unix:/run/kas.sock', subject: 'CN=kube-apiserver' },
    ...o,
  };
  return conn as unknown as TunnelConnection;
}

function auditor(o: Partial<ConnectionAuditorOptions> = {}): {
  auditor: ConnectionAuditor;
  records: AuditRecord[];
  log: ReturnType<typeof captureLogger>;
} {
  const records: AuditRecord[] = [];
  const log = captureLogger('info');
  const a = new ConnectionAuditor({ side: 'server', log: log.log, sink: { write: (r) => records.push(r) }, ...o });
  return { auditor: a, records, log };
}

const PARTY = { agent: { id: 'node-1', credential: 'CN=node-1' }, server: { id: 'server-a', address: '127.0.0.1:8091' } };

test('directionOf: the server dials to the node, the agent from it', (t) => {
  t.is(directionOf('server', 'dialer'), 'cp_to_node');
  t.is(directionOf('server', 'performer'), 'node_to_cp');
  t.is(directionOf('agent', 'performer'), 'cp_to_node');
  t.is(directionOf('agent', 'dialer'), 'node_to_cp');
});

test('an ended connection: one record with every field, and a log line with the same values', (t) => {
  const { auditor: a, records, log } = auditor({ tenant: 'beta' });
  a.connectionEnded(ended(), PARTY);
  t.is(records.length, 1);
  const r = records[0];
  t.like(r, {
    auditVersion: AUDIT_VERSION,
    side: 'server',
    tenant: 'beta',
    event: 'connection',
    dialID: '7',
    connectID: 3,
    direction: 'cp_to_node',
    agent: PARTY.agent,
    server: PARTY.server,
    client: { address: 'unix:/run/kas.sock', subject: 'CN=kube-apiserver' },
    destination: '10.0.0.5:10250',
    dial: { result: 'ok', ms: 12.3 },
    // The dialer's bytes out go to the destination.
    bytes: { toDestination: 100, toClient: 2000 },
    closedBy: 'client',
    reason: 'EOF',
  });
  if (r.event !== 'connection') throw new Error('not a connection record');
  t.true(r.durationMs >= 50, `durationMs ${r.durationMs}`);
  t.false(Number.isNaN(Date.parse(r.time)), r.time);

  const [line] = log.matching('connection ended');
  t.like(line, {
    dialID: '7',
    connectID: 3,
    direction: 'cp_to_node',
    agentID: 'node-1',
    credential: 'CN=node-1',
    serverID: 'server-a',
    client: 'unix:/run/kas.sock',
    destination: '10.0.0.5:10250',
    dialMs: 12.3,
    toDestination: 100,
    toClient: 2000,
    closedBy: 'client',
    reason: 'EOF',
  });
});

test("closedBy: this side's end is the client for a dialer and the destination for a performer; proxy and tunnel as they are", (t) => {
  const cases = [
    ['dialer', 'local', 'client'],
    ['dialer', 'peer', 'destination'],
    ['performer', 'local', 'destination'],
    ['performer', 'peer', 'client'],
    ['dialer', 'proxy', 'proxy'],
    ['performer', 'tunnel', 'tunnel'],
    ['dialer', undefined, 'proxy'],
  ] as const;
  for (const [role, endedBy, want] of cases) {
    const { auditor: a, records } = auditor({ side: 'agent' });
    a.connectionEnded(ended({ role, endedBy }), { agent: { id: 'node-1' } });
    const r = records[0];
    t.is(r.event === 'connection' ? r.closedBy : undefined, want, `${role} ended by ${endedBy}`);
  }
  // A performer's bytes in go to the destination.
  const { auditor: a, records } = auditor({ side: 'agent' });
  a.connectionEnded(ended({ role: 'performer' }), { agent: { id: 'node-1' } });
  t.like(records[0], { direction: 'cp_to_node', bytes: { toDestination: 2000, toClient: 100 } });
});

test("strings a peer chose are cut to the log's bound", (t) => {
  const { auditor: a, records, log } = auditor();
  const long = `${'x'.repeat(2 * MAX_LOG_STRING)}:1`;
  a.connectionEnded(ended({ address: long, closeReason: 'y'.repeat(3 * MAX_LOG_STRING) }), PARTY);
  const r = records[0];
  if (r.event !== 'connection') throw new Error('not a connection record');
  t.is(r.destination, truncateForLog(long));
  t.true(r.destination.startsWith('x'.repeat(MAX_LOG_STRING)) && r.destination.length < long.length);
  t.is(r.reason, truncateForLog('y'.repeat(3 * MAX_LOG_STRING)));
  // The log line carries the same cut value (the logger's own field bound may cut its marker once more).
  const logged = String(log.matching('connection ended')[0].destination);
  t.true(logged.startsWith('x'.repeat(MAX_LOG_STRING)) && logged.length <= r.destination.length, logged);
});

test('no audit log: the log line alone; neither at a level without info', (t) => {
  const log = captureLogger('info');
  new ConnectionAuditor({ side: 'server', log: log.log }).connectionEnded(ended(), PARTY);
  t.is(log.matching('connection ended').length, 1);
  const quiet = captureLogger('warn');
  const records: AuditRecord[] = [];
  const a = new ConnectionAuditor({ side: 'server', log: quiet.log, sink: { write: (r) => records.push(r) } });
  a.connectionEnded(ended(), PARTY);
  t.deepEqual(quiet.lines, []);
  t.is(records.length, 1, 'the record is written whatever the log level');
});

test('a failed dial: its result, refusal and dialID from the DialError; the tenant only when the auditor has one', (t) => {
  const { auditor: a, records } = auditor({ tenant: 'alpha' });
  const err = new DialError('forbidden', 'destination 10.0.0.9:22 is not allowed', 'destination_not_allowed');
  err.dialID = 42n;
  a.dialFailed({ direction: 'node_to_cp', party: PARTY, destination: '10.0.0.9:22', error: err, startedAt: performance.now() - 5 });
  t.like(records[0], {
    side: 'server',
    tenant: 'alpha',
    event: 'dial',
    dialID: '42',
    direction: 'node_to_cp',
    agent: PARTY.agent,
    server: PARTY.server,
    destination: '10.0.0.9:22',
    dial: { result: 'forbidden', error: 'destination 10.0.0.9:22 is not allowed' },
    refusal: 'destination_not_allowed',
  });
  const r = records[0];
  t.true(r.event === 'dial' && r.dial.ms >= 5, JSON.stringify(r));

  // No DialError, no tenant: refused by default, and no tenant key at all.
  const plain = auditor();
  plain.auditor.dialFailed({ direction: 'cp_to_node', destination: 'a:1', error: new Error('ECONNREFUSED'), startedAt: performance.now() });
  t.like(plain.records[0], { event: 'dial', dial: { result: 'refused', error: 'ECONNREFUSED' } });
  t.false('tenant' in plain.records[0]);
  t.false('dialID' in plain.records[0]);
  t.false('agent' in plain.records[0]);
  t.false('refusal' in plain.records[0]);
});

test('a dial the peer asked for: its direction from the role, its DIAL_REQ ID, result and reason', (t) => {
  const { auditor: a, records } = auditor({ side: 'agent', tenant: 'beta' });
  a.inboundDialFailed(
    'performer',
    { agent: { id: 'node-1' } },
    {
      dialID: 9n,
      address: '10.0.0.1:443',
      result: 'timeout',
      error: 'dial timeout',
      reason: 'destination_not_allowed',
      ms: 500,
    },
  );
  t.like(records[0], {
    side: 'agent',
    tenant: 'beta',
    event: 'dial',
    dialID: '9',
    direction: 'cp_to_node',
    destination: '10.0.0.1:443',
    dial: { result: 'timeout', error: 'dial timeout' },
    refusal: 'destination_not_allowed',
  });
  const r = records[0];
  t.true(r.event === 'dial' && r.dial.ms >= 500, JSON.stringify(r));
});

test('a refused peer: its reason, peer, message and detail, its agent when known, and the tenant', (t) => {
  const { auditor: a, records } = auditor({ tenant: 'alpha' });
  a.refused(
    {
      reason: 'agent_certificate',
      peer: '127.0.0.1:5000',
      fields: { secret: 'not written' },
      message: 'untrusted certificate',
      detail: 'x'.repeat(1000),
    },
    { id: 'node-9' },
  );
  t.like(records[0], {
    side: 'server',
    tenant: 'alpha',
    event: 'refused',
    refusal: 'agent_certificate',
    peer: '127.0.0.1:5000',
    agent: { id: 'node-9' },
    message: 'untrusted certificate',
  });
  const r = records[0];
  if (r.event !== 'refused') throw new Error('not a refused record');
  t.is(r.detail, truncateForLog('x'.repeat(1000)), 'the detail is cut');
  t.false('fields' in r, "the log's fields stay in the log");

  const bare = auditor();
  bare.auditor.refused({ reason: 'agent_tls_handshake', peer: '[::1]:1', fields: {}, message: 'handshake failed' });
  t.false('tenant' in bare.records[0]);
  t.false('agent' in bare.records[0]);
  t.false('detail' in bare.records[0]);
});
