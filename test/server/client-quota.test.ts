/**
 * A frontend client's limits (src/server/clients/client-quota.ts): each
 * refusal counted as the client's, naming the client and its setting; what a
 * dial took given back once, when it fails or its connection closes; the
 * defaults for an entry without limits; and the tenant's quota still worded
 * as the tenant's.
 */
import test from 'ava';
import {
  ClientQuota,
  DEFAULT_CLIENT_LIMITS,
  DEFAULT_CLIENT_CONNECTIONS,
  DEFAULT_CLIENT_PENDING_DIALS,
  DEFAULT_CLIENT_DIAL_RATE,
  DEFAULT_CLIENT_DIAL_BURST,
  clientQuotaLimits,
  ClientQuotaBook,
} from '../../src/server/clients/client-quota.js';
import { DialQuota, isQuotaRefusal, type QuotaRefusal, type QuotaTicket } from '../../src/domain/dial-quota.js';
import { REFUSAL_REASONS } from '../../src/domain/refusal-reason.js';

function ticket(t: { fail(m: string): void }, got: QuotaTicket | QuotaRefusal): QuotaTicket {
  if (isQuotaRefusal(got)) {
    t.fail(`refused: ${got.message}`);
    throw new Error(got.message);
  }
  return got;
}

function refusal(t: { fail(m: string): void }, got: QuotaTicket | QuotaRefusal): QuotaRefusal {
  if (!isQuotaRefusal(got)) {
    got.done();
    t.fail('not refused');
    throw new Error('not refused');
  }
  return got;
}

test('the defaults of a client entry without limits', (t) => {
  t.deepEqual(DEFAULT_CLIENT_LIMITS, { connections: 1000, pendingDials: 100, dialRate: 100, dialBurst: 200 });
  t.deepEqual(
    [DEFAULT_CLIENT_CONNECTIONS, DEFAULT_CLIENT_PENDING_DIALS, DEFAULT_CLIENT_DIAL_RATE, DEFAULT_CLIENT_DIAL_BURST],
    [1000, 100, 100, 200],
  );
  t.deepEqual(clientQuotaLimits({ connections: 5 }), { maxConnections: 5, maxPendingDials: 100, dialRate: 100, dialBurst: 200 });
  const quota = new ClientQuota('prometheus');
  const taken: QuotaTicket[] = [];
  for (let i = 0; i < DEFAULT_CLIENT_PENDING_DIALS; i++) taken.push(ticket(t, quota.take()));
  t.is(refusal(t, quota.take()).reason, 'client_pending_dials');
  for (const x of taken) x.done();
  t.deepEqual(quota.stats, { pendingDials: 0, connections: 0 });
});

test('connections: refused at the limit, naming the client and limits.connections; a closed connection gives its place back', (t) => {
  const quota = new ClientQuota('prometheus', { connections: 2, dialRate: 0 });
  const a = ticket(t, quota.take());
  const b = ticket(t, quota.take());
  const conn = {};
  quota.hold(conn, a);
  b.connected();
  t.deepEqual(quota.stats, { pendingDials: 0, connections: 2 });
  const r = refusal(t, quota.take());
  t.is(r.reason, 'client_connections');
  t.is(r.message, 'client prometheus holds its maximum of 2 connections (limits.connections of client prometheus in clients:)');
  quota.release(conn);
  quota.release(conn);
  t.deepEqual(quota.stats, { pendingDials: 0, connections: 1 }, 'released once');
  ticket(t, quota.take()).done();
  b.done();
  b.done();
  t.deepEqual(quota.stats, { pendingDials: 0, connections: 0 });
});

test('pending dials: refused at the limit, naming limits.pending-dials; a failed dial gives its place back', (t) => {
  const quota = new ClientQuota('operator', { pendingDials: 1, dialRate: 0 });
  const a = ticket(t, quota.take());
  const r = refusal(t, quota.take());
  t.is(r.reason, 'client_pending_dials');
  t.regex(r.message, /^client operator has its maximum of 1 dials waiting for an answer \(limits\.pending-dials of client operator/);
  a.done();
  ticket(t, quota.take()).done();
});

test('dial rate: refused beyond the burst, naming limits.dial-rate; a refused dial takes nothing', (t) => {
  // 0.01 dials/s: no token comes back during the test, however slow the machine.
  const quota = new ClientQuota('scraper', { dialRate: 0.01, dialBurst: 2 });
  ticket(t, quota.take()).done();
  ticket(t, quota.take()).done();
  const r = refusal(t, quota.take());
  t.is(r.reason, 'client_dial_rate');
  t.regex(r.message, /^client scraper dials faster than its 0\.01 dials\/s \(limits\.dial-rate, limits\.dial-burst of client scraper/);
  t.deepEqual(quota.stats, { pendingDials: 0, connections: 0 });
  quota.configure({ dialRate: 0 });
  ticket(t, quota.take()).done();
});

test('configure() applies new limits to what comes next; tickets out stay valid', (t) => {
  const quota = new ClientQuota('prometheus', { connections: 3, dialRate: 0 });
  const held = [ticket(t, quota.take()), ticket(t, quota.take())];
  quota.configure({ connections: 1, dialRate: 0 });
  t.is(refusal(t, quota.take()).reason, 'client_connections');
  for (const x of held) x.done();
  ticket(t, quota.take()).done();
});

test("the client reasons are kanal_refusals_total reasons; a tenant's quota keeps its own words", (t) => {
  for (const r of ['client_connections', 'client_pending_dials', 'client_dial_rate'])
    t.true((REFUSAL_REASONS as readonly string[]).includes(r), r);
  const tenant = new DialQuota({ maxConnections: 0, maxPendingDials: 1, dialRate: 0, dialBurst: 1 });
  t.deepEqual(tenant.take(), {
    reason: 'tenant_connections',
    message: 'the tenant holds its maximum of 0 tunnelled connections (max-connections)',
  });
});

test('the book: the kube-apiserver (allow all, no limits) has no quota; others keep theirs by name across a reload', (t) => {
  const book = new ClientQuotaBook();
  t.is(book.of({ name: 'kube-apiserver', allow: 'all' }), undefined);
  t.truthy(book.of({ name: 'kube-apiserver', allow: 'all', limits: { connections: 5 } }));
  const first = book.of({ name: 'prometheus', allow: [], limits: { pendingDials: 1 } });
  const held = ticket(t, first?.take() ?? { reason: 'client_pending_dials', message: 'no quota' });
  const again = book.of({ name: 'prometheus', allow: [], limits: { pendingDials: 1 } });
  t.is(again, first, 'the same quota: the ticket out still counts');
  t.is(refusal(t, again?.take() ?? { reason: 'client_pending_dials', message: 'no quota' }).reason, 'client_pending_dials');
  held.done();
  ticket(t, again?.take() ?? { reason: 'client_pending_dials', message: 'no quota' }).done();
});
