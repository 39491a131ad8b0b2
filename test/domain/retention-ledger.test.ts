/**
 * The ledger of what connections hold (src/domain/retention-ledger.ts):
 * charges walk up process -> tenant -> agent -> connection, caps bound what
 * may be retained below them, room coming back wakes who waited, and over
 * the budget the agent holding the most is shed first, then the next, until
 * the process is within it.
 */
import test from 'ava';
import { setImmediate as turn } from 'node:timers/promises';
import { RetentionLedger, type LedgerAccount } from '../../src/domain/retention-ledger.js';

const INF = Number.POSITIVE_INFINITY;

/** A connection account whose shed() gives back what it holds, and records that it was shed. */
function connection(agent: LedgerAccount, shed: string[], name: string): LedgerAccount {
  const c: LedgerAccount = agent.openConnection((reason) => {
    shed.push(`${name}: ${reason}`);
    c.close();
  });
  return c;
}

test('charges add up the chain; room is the tightest cap above; close gives everything back', (t) => {
  const ledger = new RetentionLedger({ budgetBytes: INF });
  const tenant = ledger.tenant('a', 1000);
  const agent = tenant.child('agent', 'cred\0node-1', 300).use();
  const c = connection(agent, [], 'c');
  t.is(c.room(), 300);
  c.retain(200);
  c.buffer(50);
  t.is(agent.retained, 200);
  t.is(tenant.held, 250);
  t.is(ledger.root.held, 250);
  t.is(c.room(), 100, "the agent's cap is the tightest");
  tenant.cap = 150;
  t.is(c.room(), 0, 'over a cap: no room, never negative');
  c.close();
  t.is(ledger.root.held, 0);
  t.is(agent.size, 0);
  t.is(tenant.size, 1, 'an agent a tunnel still uses stays');
  agent.unuse();
  t.is(tenant.size, 0, 'an agent nothing uses and that holds nothing leaves');
});

test('a holder waiting for room is woken once when a charge below the cap frees it', async (t) => {
  const ledger = new RetentionLedger({ budgetBytes: INF });
  const agent = ledger.tenant('a', INF).child('agent', 'x', 100);
  const a = connection(agent, [], 'a');
  const b = connection(agent, [], 'b');
  a.retain(100);
  let woken = 0;
  const wake = (): void => void woken++;
  b.whenRoom(wake);
  b.whenRoom(wake);
  await turn();
  t.is(woken, 0, 'no room yet: still waiting');
  a.retain(-10);
  await turn();
  t.is(woken, 1, 'woken once, however often it asked');
  a.retain(-10);
  await turn();
  t.is(woken, 1, 'and not again unless it asks again');
});

test('over the budget the largest agent is shed first, across tenants, and only as many as needed', async (t) => {
  const ledger = new RetentionLedger({ budgetBytes: 1000 });
  const told: string[] = [];
  const shed: string[] = [];
  const onShed = (agent: LedgerAccount, held: number, connections: number): void =>
    void told.push(`${typeof agent.key === 'string' ? agent.key : '?'} ${held} ${connections}`);
  const small = ledger.tenant('one', INF).child('agent', 'small', INF, onShed);
  const large = ledger.tenant('two', INF).child('agent', 'large', INF, onShed);
  const middle = ledger.tenant('one', INF).child('agent', 'middle', INF, onShed);
  connection(small, shed, 'small-1').retain(100);
  const l1 = connection(large, shed, 'large-1');
  const l2 = connection(large, shed, 'large-2');
  l1.retain(300);
  l2.buffer(300);
  connection(middle, shed, 'middle-1').retain(400);
  t.is(ledger.root.held, 1100);
  await turn();
  await turn();
  t.deepEqual(told, ['large 600 2'], 'the largest holder only: that brought the process within its budget');
  t.is(shed.length, 2);
  t.true(
    shed.every((s) => s.startsWith('large-') && s.includes('memory budget (1000 bytes) is spent and this agent held the most (600 bytes)')),
  );
  t.is(ledger.root.held, 500);
  // A smaller budget sheds the next largest, then the next.
  ledger.configure(50);
  await turn();
  await turn();
  t.deepEqual(told, ['large 600 2', 'middle 400 1', 'small 100 1']);
  t.is(ledger.root.held, 0);
});

test('within the budget nothing is shed', async (t) => {
  const ledger = new RetentionLedger({ budgetBytes: 1000 });
  const shed: string[] = [];
  connection(ledger.tenant('a', INF).child('agent', 'x', INF), shed, 'x').retain(1000);
  await turn();
  t.deepEqual(shed, []);
  t.deepEqual(ledger.shed(), []);
});
