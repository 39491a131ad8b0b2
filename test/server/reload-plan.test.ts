/**
 * What a reload of the tenants file does (src/server/tenants/reload-plan.ts),
 * decided without a server: each tenant added, removed, updated in place or
 * started anew, and a file that cannot be used refused whole.
 */
import test from 'ava';
import { planReload, type Fingerprinted } from '../../src/server/tenants/reload-plan.js';

const tenant = (name: string, fingerprint = `${name}-f1`, identity = `${name}-i1`): Fingerprinted => ({ name, fingerprint, identity });
const running = (...list: Fingerprinted[]): Map<string, Fingerprinted> => new Map(list.map((t) => [t.name, t]));

test('an unchanged file changes nothing', (t) => {
  const plan = planReload(running(tenant('a'), tenant('b')), [tenant('a'), tenant('b')]);
  t.deepEqual(plan, { kind: 'apply', added: [], removed: [], changed: [], inPlace: [], rebuilt: [] });
});

test('a tenant new to the file is added, one missing from it removed, the others untouched', (t) => {
  const plan = planReload(running(tenant('a'), tenant('b')), [tenant('b'), tenant('c')]);
  t.deepEqual(plan, { kind: 'apply', added: ['c'], removed: ['a'], changed: [], inPlace: [], rebuilt: [] });
});

test('settings alone changed (same identity): applied in place; identity changed: started anew; both listed as changed in the file order', (t) => {
  const plan = planReload(running(tenant('a'), tenant('b'), tenant('c')), [
    tenant('c', 'c-f2', 'c-i2'),
    tenant('b'),
    tenant('a', 'a-f2', 'a-i1'),
  ]);
  t.deepEqual(plan, { kind: 'apply', added: [], removed: [], changed: ['c', 'a'], inPlace: ['a'], rebuilt: ['c'] });
});

test('a file that cannot be used is refused whole, naming why, whatever runs', (t) => {
  t.deepEqual(planReload(running(tenant('a')), { error: 'bad.yaml: 2 mistakes' }), { kind: 'refused', error: 'bad.yaml: 2 mistakes' });
  t.deepEqual(planReload(new Map(), { error: 'cannot read' }), { kind: 'refused', error: 'cannot read' });
});

test("a worker plans only its own share: another worker's tenant is neither added nor kept", (t) => {
  const mine = (name: string): boolean => name !== 'theirs';
  const plan = planReload(running(tenant('a'), tenant('theirs')), [tenant('a', 'a-f2'), tenant('theirs'), tenant('new')], mine);
  t.deepEqual(plan, { kind: 'apply', added: ['new'], removed: ['theirs'], changed: ['a'], inPlace: ['a'], rebuilt: [] });
});

test('an empty file removes every running tenant', (t) => {
  const plan = planReload(running(tenant('a'), tenant('b')), []);
  t.deepEqual(plan, { kind: 'apply', added: [], removed: ['a', 'b'], changed: [], inPlace: [], rebuilt: [] });
});
