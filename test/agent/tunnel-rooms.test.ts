/**
 * The pure rooms of the agent's tunnels (src/agent/): when an address's loop
 * connects next (connect-schedule.ts), how many tunnels it aims at and when
 * the count changes or disagrees with the addresses (expected-servers.ts),
 * what /readyz says (tunnel-readiness.ts), how loops wait (wakeups.ts), and
 * which connect failure is a refusal (reconnect-loop.ts).
 */
import test from 'ava';
import { untilNextConnect, type ConnectScheduleView } from '../../src/agent/connect-schedule.js';
import { ExpectedServers, tunnelsAimedAt, type HoldingView } from '../../src/agent/expected-servers.js';
import { allReady, tunnelReadiness, type ReadyTunnel, type TunnelReadinessView } from '../../src/agent/tunnel-readiness.js';
import { Wakeups } from '../../src/agent/wakeups.js';
import { refusedConnection } from '../../src/agent/reconnect-loop.js';
import { captureLogger } from '../helpers/in-process.js';

const RECONNECT = { initialMs: 1000, maxMs: 30_000 };
const schedule = (v: Partial<ConnectScheduleView>): ConnectScheduleView => ({
  byName: false,
  covered: false,
  tunnels: 0,
  servers: 1,
  syncForever: false,
  leases: false,
  reconnect: RECONNECT,
  lastAttempt: 0,
  now: 100_000,
  ...v,
});

test('connect schedule by name: now unless the address is covered, then not until something changes', (t) => {
  t.is(untilNextConnect(schedule({ byName: true })), 0);
  t.is(untilNextConnect(schedule({ byName: true, covered: true })), Infinity);
  // By name the count does not matter: one tunnel through each address.
  t.is(untilNextConnect(schedule({ byName: true, covered: true, tunnels: 0, servers: 5 })), Infinity);
});

test('connect schedule behind one address: now while servers are missing; once reached, only --sync-forever probes and lease looks', (t) => {
  t.is(untilNextConnect(schedule({ tunnels: 1, servers: 3 })), 0);
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3 })), Infinity);
  // --sync-forever: a connect per reconnect.maxMs after the last one.
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3, syncForever: true, lastAttempt: 90_000 })), 20_000);
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3, syncForever: true, lastAttempt: 60_000 })), 0);
  // Leases: a look every sync interval (the count changes without a tunnel changing), sooner than a probe.
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3, leases: true })), 1000);
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3, leases: true, syncForever: true, lastAttempt: 99_500 })), 1000);
  t.is(untilNextConnect(schedule({ tunnels: 3, servers: 3, leases: true, syncForever: true, lastAttempt: 70_500 })), 500);
});

test('tunnels aimed at: the count behind one address; by name, the addresses not reaching a server held through another', (t) => {
  const addresses = [{ reachedHeld: undefined }, { reachedHeld: 'server-a' }, { reachedHeld: 'server-gone' }];
  const held = (id: string | undefined): boolean => id === 'server-a';
  t.is(tunnelsAimedAt(false, 4, addresses, held), 4);
  t.is(tunnelsAimedAt(true, 4, addresses, held), 2);
});

const holding = (v: Partial<HoldingView>): HoldingView => ({
  tunnels: 0,
  byName: false,
  addresses: () => ['10.0.0.1:8091'],
  aimed: () => 1,
  ...v,
});

test('expected servers: announced counts, leases by source, a floor of 1; each change logged once with its source', (t) => {
  const logs = captureLogger('debug');
  const announced = new ExpectedServers({ source: 'default', log: logs.log });
  t.deepEqual(announced.current, { count: 1, from: 'fallback to 1' });
  t.is(announced.update(holding({})), 1);
  announced.announce(3);
  t.is(announced.update(holding({})), 3);
  t.is(announced.update(holding({ tunnels: 2 })), 3);
  t.deepEqual(announced.current, { count: 3, from: 'KNP server response headers' });
  const changes = logs.matching('server count changed');
  t.is(changes.length, 1, 'the first look (fallback to 1) is no change; then 1 -> 3, once');
  t.like(changes[0], { serverCount: 3, previous: 1, from: 'KNP server response headers' });

  let leases = 2;
  const max = new ExpectedServers({ source: 'max', leases: () => leases, log: logs.log });
  max.announce(5);
  t.is(max.update(holding({})), 5);
  leases = 7;
  t.deepEqual((max.update(holding({})), max.current), { count: 7, from: 'KNP lease count' });
  const byLeases = new ExpectedServers({ source: 'default', leases: () => 0, log: logs.log });
  byLeases.announce(5);
  t.deepEqual((byLeases.update(holding({})), byLeases.current), { count: 1, from: 'fallback to 1' });
});

test('expected servers by name: a count that disagrees with the addresses is said once, and cleared when they agree', (t) => {
  const logs = captureLogger('debug');
  const expected = new ExpectedServers({ source: 'default', log: logs.log });
  const view = (aimed: number): HoldingView => holding({ byName: true, aimed: () => aimed, addresses: () => ['a:1', 'b:1'] });
  expected.update(view(2));
  t.is(expected.mismatch, '', 'no server announced yet: nothing to disagree with');
  expected.announce(3);
  expected.update(view(2));
  expected.update(view(2));
  t.is(expected.mismatch, 'the servers count 3 (KNP server response headers), 2 address(es) reach distinct servers');
  const warned = logs.matching('server count and server addresses disagree');
  t.is(warned.length, 1);
  t.deepEqual(warned[0].addresses, ['a:1', 'b:1']);
  expected.update(view(3));
  t.is(expected.mismatch, '');
});

const tunnel = (serverID: string, address = '10.0.0.1:8091', more: Partial<ReadyTunnel> = {}): ReadyTunnel => ({
  serverID,
  address,
  nodeDial: true,
  refusedTargets: [],
  ...more,
});
const readiness = (v: Partial<TunnelReadinessView>): TunnelReadinessView => ({
  tunnels: [],
  addresses: [],
  byName: false,
  aimed: 1,
  countMismatch: '',
  nodeDial: true,
  ...v,
});

test('readiness: not ready without a tunnel, naming the last connect error', (t) => {
  t.deepEqual(tunnelReadiness(readiness({})), { ready: false, detail: 'no tunnel to a proxy server' });
  const addresses = [
    { target: 'a:1', lastError: '', reachedHeld: undefined },
    { target: 'b:1', lastError: 'connection refused (--proxy-server-host)', reachedHeld: undefined },
  ];
  t.deepEqual(tunnelReadiness(readiness({ addresses })), {
    ready: false,
    detail: 'no tunnel to a proxy server (last error: connection refused (--proxy-server-host))',
  });
});

test('readiness behind one address: the servers held; by name, each address and why one has no tunnel', (t) => {
  t.deepEqual(tunnelReadiness(readiness({ tunnels: [tunnel('s1'), tunnel('s2')], aimed: 3 })), {
    ready: true,
    detail: '2/3 server tunnel(s) up: s1, s2',
  });
  const byName = tunnelReadiness(
    readiness({
      byName: true,
      aimed: 2,
      tunnels: [tunnel('s1', 'a:1')],
      addresses: [
        { target: 'a:1', lastError: '', reachedHeld: undefined },
        { target: 'b:1', lastError: '', reachedHeld: 's1' },
        { target: 'c:1', lastError: 'timed out', reachedHeld: undefined },
      ],
      countMismatch: 'the servers count 3 (KNP server response headers), 2 address(es) reach distinct servers',
    }),
  );
  t.deepEqual(byName, {
    ready: true,
    detail:
      '1/2 server tunnel(s) up: s1 (a:1); b:1 reaches s1, held through a:1; no tunnel through c:1 (last error: timed out); ' +
      'the servers count 3 (KNP server response headers), 2 address(es) reach distinct servers',
  });
});

test('readiness: still ready, but says which targets a server refuses and where node -> control plane dials are unavailable', (t) => {
  const refused = tunnel('s1', 'a:1', { refusedTargets: [{ localPort: 6443, destination: '10.0.0.9:443' }] });
  const some = tunnelReadiness(readiness({ tunnels: [refused, tunnel('s2', 'a:1', { nodeDial: false })], aimed: 2 }));
  t.true(some.ready);
  t.regex(some.detail, /^2\/2 server tunnel\(s\) up: s1, s2; .*10\.0\.0\.9:443/);
  t.true(some.detail.endsWith('; node -> control plane dials unavailable through s2 (server does not support them)'));
  const none = tunnelReadiness(readiness({ tunnels: [tunnel('s1', 'a:1', { nodeDial: false })] }));
  t.true(none.detail.endsWith('no connected server supports them (upstream Konnectivity?)'));
  // An agent that offers no node dials says nothing of servers that take none.
  t.deepEqual(tunnelReadiness(readiness({ tunnels: [tunnel('s1', 'a:1', { nodeDial: false })], nodeDial: false })), {
    ready: true,
    detail: '1/1 server tunnel(s) up: s1',
  });
  t.deepEqual(
    allReady([
      { ready: true, detail: 'x' },
      { ready: false, detail: 'y' },
    ]),
    { ready: false, detail: 'x; y' },
  );
  t.deepEqual(allReady([{ ready: true, detail: 'x' }]), { ready: true, detail: 'x' });
});

test('wakeups: wake() ends only the waits that listen for a change; an abort ends its own; the stop ends all and every later one', async (t) => {
  const stop = new AbortController();
  const wakeups = new Wakeups(stop.signal);
  const mine = new AbortController();
  const ended: string[] = [];
  const change = wakeups.changeOrTimeout(Infinity, mine.signal).then(() => ended.push('change'));
  const pause = wakeups.pause(Infinity, new AbortController().signal).then(() => ended.push('pause'));
  const own = wakeups.changeOrTimeout(Infinity, mine.signal, false).then(() => ended.push('own'));
  t.is(wakeups.waiting, 1);
  wakeups.wake();
  await change;
  t.deepEqual(ended, ['change']);
  t.is(wakeups.waiting, 0);
  mine.abort();
  await own;
  t.deepEqual(ended, ['change', 'own']);
  stop.abort();
  await pause;
  t.deepEqual(ended, ['change', 'own', 'pause']);
  await wakeups.changeOrTimeout(Infinity, new AbortController().signal);
  t.is(await wakeups.unlessStopped(new Promise<never>(() => undefined)), undefined);
  t.is(wakeups.waiting, 0);
});

test('wakeups: a timeout ends a wait; unlessStopped() gives the work its result while running, undefined once stopped', async (t) => {
  const stop = new AbortController();
  const wakeups = new Wakeups(stop.signal);
  await wakeups.changeOrTimeout(1, new AbortController().signal);
  t.is(wakeups.waiting, 0, 'the timed-out waiter is dropped');
  t.is(await wakeups.unlessStopped(Promise.resolve(42)), 42);
  const never = wakeups.unlessStopped(new Promise<number>(() => undefined));
  stop.abort();
  t.is(await never, undefined);
});

test('a connect refused is told by ECONNREFUSED on the error or a cause within five levels', (t) => {
  const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' });
  t.true(refusedConnection(refused));
  t.true(refusedConnection(new Error('tunnel', { cause: new Error('h2', { cause: refused }) })));
  t.false(refusedConnection(new Error('timed out')));
  t.false(refusedConnection('ECONNREFUSED'));
  let deep: Error = refused;
  for (let i = 0; i < 5; i++) deep = new Error(`level ${i}`, { cause: deep });
  t.false(refusedConnection(deep), 'beyond five levels it is not looked for');
});
