/**
 * A tenant shared by several workers (its tenants-file `tenant-workers`,
 * docs/multi-tenant.md "A busy tenant on several workers"): which workers
 * own it (workers/owner.ts), what it announces on each
 * (workers/worker-server.ts), and which owner takes each of its
 * connections (workers/tenant-steering.ts).
 */
import test from 'ava';
import { ownerOf, ownersOf } from '../../../src/server/workers/owner.js';
import { sharedTenantServer } from '../../../src/server/workers/worker-server.js';
import { TenantSteering } from '../../../src/server/workers/tenant-steering.js';

const NAMES = Array.from({ length: 200 }, (_, i) => `tenant-${i}`);

test('a tenant of K workers is owned by K distinct workers, the first the one it has alone; more than --workers is every worker', (t) => {
  for (const name of NAMES) {
    const three = ownersOf(name, 3, 5);
    t.is(new Set(three).size, 3, `${name}: ${three.join(',')}`);
    t.true(three.every((w) => w >= 0 && w < 5));
    t.is(three[0], ownerOf(name, 5), 'its first owner is its owner with workers: 1');
    t.deepEqual(ownersOf(name, 2, 5), three.slice(0, 2), 'one worker fewer drops the last owner, moves no other');
    t.deepEqual([...ownersOf(name, 9, 4)].sort(), [0, 1, 2, 3]);
  }
  t.deepEqual(ownersOf('x', 0, 3).length, 1, 'never none');
});

test('owners spread: no worker is the first owner of far more tenants than the others', (t) => {
  const first = [0, 0, 0, 0];
  for (const name of NAMES) first[ownerOf(name, 4)]++;
  // 200 over 4: 50 each expected; a hash that ignored the name would give one worker all of them.
  t.true(
    first.every((n) => n > 25 && n < 75),
    `first owners per worker: ${first.join(', ')}`,
  );
});

test('on each of its workers a shared tenant is a server of its own; a tenant of one worker keeps the server ID', (t) => {
  const shared = { workers: 2, options: { serverCount: 3 } } as const;
  t.deepEqual(sharedTenantServer('cp-1', shared, { index: 1, count: 4 }), { shared: true, serverID: 'cp-1-w1', serverCount: 6 });
  t.deepEqual(sharedTenantServer('cp-1', { workers: 1, options: { serverCount: 3 } }, { index: 1, count: 4 }), {
    shared: false,
    serverID: 'cp-1',
    serverCount: 3,
  });
  t.deepEqual(
    sharedTenantServer('cp-1', { workers: 8, options: { serverCount: 1 } }, { index: 0, count: 2 }),
    { shared: true, serverID: 'cp-1-w0', serverCount: 2 },
    'more workers than --workers: every worker, counted as many as there are',
  );
  t.deepEqual(
    sharedTenantServer('cp-1', shared, { index: 0, count: 1 }),
    { shared: false, serverID: 'cp-1', serverCount: 3 },
    'one worker in all: nothing is shared',
  );
});

test("a shared tenant's agent connections from one node reach each of its owners; none goes to a worker that is not one", (t) => {
  const s = new TenantSteering();
  const owners = [3, 1];
  const ready = [0, 1, 2, 3];
  const picks = Array.from({ length: 4 }, () => s.agent('alpha', owners, ready, '10.0.0.1'));
  t.deepEqual(new Set(picks), new Set(owners), `picks ${picks.join(', ')}`);
  t.is(s.agent('alpha', owners, [0, 2, 3], '10.0.0.1'), 3, 'an owner not ready is skipped');
  t.is(s.agent('alpha', owners, [0, 2], '10.0.0.1'), undefined, 'no owner ready: none');
});

test("a shared tenant's frontend connections go to its owners holding the most of its agents, by its own counts", (t) => {
  const s = new TenantSteering();
  const owners = [0, 2];
  const ready = [0, 1, 2];
  s.agentsOf(0, [['alpha', 4]]);
  s.agentsOf(2, [
    ['alpha', 1],
    ['beta', 50],
  ]);
  const picks = Array.from({ length: 4 }, () => s.frontend('alpha', owners, ready));
  t.true(
    picks.every((w) => w === 0),
    `the owner with alpha's agents, not the one busy with beta's: ${picks.join(', ')}`,
  );
  s.agentsOf(2, [['alpha', 4]]);
  t.deepEqual(new Set(Array.from({ length: 4 }, () => s.frontend('alpha', owners, ready))), new Set(owners), 'converged: in turn');
  s.gone(0);
  t.true(
    Array.from({ length: 3 }, () => s.frontend('alpha', owners, ready)).every((w) => w === 2),
    'a worker gone holds none of them',
  );
  // Its owners change (the file gave it another count): the new owners from their first turn.
  t.true([1, 2].includes(s.frontend('alpha', [1, 2], ready) ?? -1));
  s.retain(new Set(['beta']));
  t.true([1, 2].includes(s.agent('alpha', [1, 2], ready, 'h') ?? -1), 'a forgotten tenant starts again');
});
