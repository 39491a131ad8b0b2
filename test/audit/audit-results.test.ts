/**
 * Audit lines that must agree across the two sides and name their tenant:
 * an agent reads `forbidden` from a Kanal server's allow-list answer (the
 * server's own line says `forbidden`), and a refusal made before a tenant's
 * room carries the tenant the peer was recognised as or named.
 */
import test from 'ava';
import { pino } from 'pino';
import { ConnectionAuditor } from '../../src/audit/connection-auditor.js';
import type { AuditRecord } from '../../src/audit/audit-record.js';
import { answeredFailure, NOT_ALLOWED_BY_SERVER } from '../../src/domain/dial-result.js';
import { DialError } from '../../src/tunnel/errors.js';

function auditor(tenant?: string): { auditor: ConnectionAuditor; records: AuditRecord[] } {
  const records: AuditRecord[] = [];
  const a = new ConnectionAuditor({
    side: 'server',
    log: pino({ level: 'silent' }),
    sink: { write: (r) => records.push(r) },
    ...(tenant ? { tenant } : {}),
  });
  return { auditor: a, records };
}

test("a requester reads forbidden from the server's allow-list answer, and refused from any other", (t) => {
  t.is(answeredFailure(`destination 10.0.0.1:443 ${NOT_ALLOWED_BY_SERVER}`), 'forbidden');
  t.is(answeredFailure('dial tcp 10.0.0.1:443: connect: connection refused'), 'refused');
  t.is(answeredFailure(`${NOT_ALLOWED_BY_SERVER}, or so a peer says in the middle`), 'refused');
});

test("the agent's dial line for an allow-list refusal says forbidden, as the server's does", (t) => {
  const { auditor: a, records } = auditor();
  const error = new DialError(
    answeredFailure(`destination 10.0.0.1:443 ${NOT_ALLOWED_BY_SERVER}`),
    `destination 10.0.0.1:443 ${NOT_ALLOWED_BY_SERVER}`,
  );
  a.dialFailed({ direction: 'node_to_cp', destination: '10.0.0.1:443', error, startedAt: performance.now() });
  t.like(records[0], { event: 'dial', dial: { result: 'forbidden' } });
});

test("a refused line names the tenant: the room's own, else the one the refusal names, else none", (t) => {
  const refusal = { reason: 'agent_tenant_unknown', peer: '127.0.0.1:5000', message: 'refused agent stream' } as const;
  const server = auditor();
  server.auditor.refused({ ...refusal, fields: { tenant: 'blue' } });
  server.auditor.refused({ ...refusal, fields: { tenants: ['blue', 'green'] } });
  t.like(server.records[0], { event: 'refused', tenant: 'blue', refusal: 'agent_tenant_unknown' });
  t.false('tenant' in server.records[1], 'several tenants fit: none is named');
  const room = auditor('green');
  room.auditor.refused({ ...refusal, fields: {} });
  t.like(room.records[0], { event: 'refused', tenant: 'green' });
});
