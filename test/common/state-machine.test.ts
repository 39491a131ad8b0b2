/**
 * The lifecycle idiom (src/common/state-machine.ts): allowed moves happen and
 * are traced, any other move throws naming the object and both states, a
 * guarded move is refused by its condition, and from() moves only from the
 * states it names.
 */
import test from 'ava';
import { debugTrace, describeState, StateMachine, type Lifecycle } from '../../src/common/state-machine.js';

type Door = 'closed' | 'open' | 'locked' | 'gone';
const DOOR: Lifecycle<Door> = {
  name: 'door',
  moves: { closed: ['open', 'locked', 'gone'], open: ['closed', 'gone'], locked: ['closed', 'gone'], gone: [] },
};

test('allowed moves happen and are traced in order', (t) => {
  const seen: string[] = [];
  const door = new StateMachine<Door>('closed', DOOR, (from, to) => seen.push(`${from}->${to}`));
  door.to('open');
  door.to('closed');
  door.to('locked');
  t.is(door.state, 'locked');
  t.true(door.is('locked', 'gone'));
  t.false(door.is('open'));
  t.deepEqual(seen, ['closed->open', 'open->closed', 'closed->locked']);
});

test('a move the lifecycle does not allow throws, naming the object and both states, and changes nothing', (t) => {
  const door = new StateMachine<Door>('locked', DOOR);
  t.throws(() => door.to('open'), { message: 'door: no transition from locked to open' });
  t.is(door.state, 'locked');
  door.to('gone');
  t.throws(() => door.to('closed'), { message: 'door: no transition from gone to closed' });
});

test('from() moves only from the states it names and says whether it moved', (t) => {
  const door = new StateMachine<Door>('closed', DOOR);
  t.false(door.from(['open'], 'gone'));
  t.is(door.state, 'closed');
  t.true(door.from(['closed', 'open'], 'open'));
  t.is(door.state, 'open');
  // Named, but not a move the lifecycle allows from here.
  t.false(door.from(['open'], 'locked'));
  t.is(door.state, 'open');
});

type Pipe = { readonly kind: 'flowing'; readonly draining: boolean } | { readonly kind: 'shut' };
const PIPE: Lifecycle<Pipe> = {
  name: 'pipe',
  moves: { flowing: ['flowing', 'shut'], shut: [] },
  // A drain, once begun, is kept.
  allows: (from, to) => !(from.kind === 'flowing' && from.draining && to.kind === 'flowing' && !to.draining),
  describe: (s) => (s.kind === 'flowing' ? `flowing${s.draining ? ' (draining)' : ''}` : s.kind),
};

test('states with data: the condition refuses a move the names allow, described by the lifecycle', (t) => {
  const pipe = new StateMachine<Pipe>({ kind: 'flowing', draining: false }, PIPE);
  pipe.to({ kind: 'flowing', draining: true });
  t.is(pipe.kind, 'flowing');
  t.false(pipe.canMove({ kind: 'flowing', draining: false }));
  t.throws(() => pipe.to({ kind: 'flowing', draining: false }), { message: 'pipe: no transition from flowing (draining) to flowing' });
  pipe.to({ kind: 'shut' });
  t.deepEqual(pipe.state, { kind: 'shut' });
});

test('toIfAllowed() moves where the lifecycle allows and otherwise stays, saying which', (t) => {
  const door = new StateMachine<Door>('locked', DOOR);
  t.false(door.toIfAllowed('open'));
  t.is(door.state, 'locked');
  t.true(door.toIfAllowed('closed'));
  t.is(door.state, 'closed');
});

test('debugTrace() logs each move at debug level with the fields given, as the lifecycle describes the states', (t) => {
  const lines: { fields: object; message: string }[] = [];
  const log = { debug: (fields: object, message: string) => lines.push({ fields, message }) };
  const pipe = new StateMachine<Pipe>({ kind: 'flowing', draining: false }, PIPE, debugTrace(PIPE, log, { pipeID: 7 }));
  pipe.to({ kind: 'flowing', draining: true });
  pipe.to({ kind: 'shut' });
  t.deepEqual(lines, [
    { fields: { pipeID: 7 }, message: 'pipe: flowing -> flowing (draining)' },
    { fields: { pipeID: 7 }, message: 'pipe: flowing (draining) -> shut' },
  ]);
  t.is(describeState(DOOR, 'open'), 'open', 'a lifecycle without describe reads as the kind');
});

test('debugTrace() not enabled: no trace at all, and the moves still happen', (t) => {
  const log = { debug: () => t.fail('nothing is logged') };
  const trace = debugTrace(DOOR, log, {}, false);
  t.is(trace, undefined);
  const door = new StateMachine<Door>('closed', DOOR, trace);
  door.to('open');
  t.is(door.state, 'open');
});
