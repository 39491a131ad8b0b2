/**
 * Which addresses an agent dials (src/agent/server-addresses.ts) and how long
 * it waits between connects to one (src/agent/reconnect-delay.ts), with a
 * fake resolver and a fake clock: --proxy-server-host values parsed, a name
 * with one address dialled by name, a name with several dialled at each
 * address (its name kept for TLS), a failed lookup keeping what it had.
 */
import test from 'ava';
import { parseServerHosts, ServerAddresses, withPorts, type LookupAll } from '../../src/agent/server-addresses.js';
import { FIRST_RETRY_MS, ReconnectDelay } from '../../src/agent/reconnect-delay.js';
import { UsageError } from '../../src/common/usage-error.js';

const FLAG = 'proxy-server-host';

test('--proxy-server-host: repeatable and comma-separated, a port of its own optional, a bare IPv6 address a host', (t) => {
  t.deepEqual(parseServerHosts(['cp.example', '10.0.0.1,cp2.example:8132', ' ::1 ', '[fd00::1]:9000', ''], FLAG), [
    { host: 'cp.example' },
    { host: '10.0.0.1' },
    { host: 'cp2.example', port: 8132 },
    { host: '::1' },
    { host: 'fd00::1', port: 9000 },
  ]);
  t.deepEqual(withPorts(parseServerHosts(['a', 'a:8091', 'b:1', 'b'], FLAG), 8091), [
    { host: 'a', port: 8091 },
    { host: 'b', port: 1 },
    { host: 'b', port: 8091 },
  ]);
});

test('--proxy-server-host refuses what is no host, naming the flag', (t) => {
  const cases: [string[], RegExp][] = [
    [[], /^--proxy-server-host is required$/],
    [[',', ' '], /^--proxy-server-host is required$/],
    [['cp example'], /^--proxy-server-host "cp example" is not a host name or IP address$/],
    [['cp:0'], /^--proxy-server-host "cp:0": .*out of range 1-65535/],
    [['cp:http'], /^--proxy-server-host "cp:http": .*not a number/],
    [['[cp]:1'], /^--proxy-server-host "\[cp\]:1": .*not an IPv6 address/],
  ];
  for (const [values, message] of cases) t.throws(() => parseServerHosts(values, FLAG), { instanceOf: UsageError, message });
});

/** A resolver answering from `table` (a missing name fails as getaddrinfo does); counts lookups. */
function fakeLookup(table: Map<string, string[]>): LookupAll & { calls: string[] } {
  const calls: string[] = [];
  const lookup = (name: string): Promise<string[]> => {
    calls.push(name);
    const found = table.get(name);
    return found ? Promise.resolve(found) : Promise.reject(new Error(`getaddrinfo ENOTFOUND ${name}`));
  };
  return Object.assign(lookup, { calls });
}

test('a name with one address is dialled by name (a balancer); with several, at each address under its name', async (t) => {
  const table = new Map([
    ['lb.example', ['10.0.0.9']],
    ['servers.example', ['10.0.0.1', '10.0.0.2', 'fd00::3']],
  ]);
  const lookup = fakeLookup(table);
  const balancer = new ServerAddresses([{ host: 'lb.example', port: 8091 }], lookup);
  t.deepEqual(await balancer.resolve(), { endpoints: [{ target: 'lb.example:8091', name: 'lb.example', resolved: false }], failures: [] });
  const byName = new ServerAddresses([{ host: 'servers.example', port: 8132 }], lookup);
  t.deepEqual((await byName.resolve()).endpoints, [
    { target: '10.0.0.1:8132', name: 'servers.example', resolved: true },
    { target: '10.0.0.2:8132', name: 'servers.example', resolved: true },
    { target: '[fd00::3]:8132', name: 'servers.example', resolved: true },
  ]);
  // Addresses are never looked up; an address reached under two hosts is dialled once, under the first.
  const mixed = new ServerAddresses(
    [
      { host: '10.0.0.2', port: 8132 },
      { host: 'servers.example', port: 8132 },
    ],
    lookup,
  );
  t.true(mixed.resolvable);
  t.deepEqual(
    (await mixed.resolve()).endpoints.map((e) => e.target),
    ['10.0.0.2:8132', '10.0.0.1:8132', '[fd00::3]:8132'],
  );
  t.false(new ServerAddresses([{ host: '10.0.0.1', port: 1 }], lookup).resolvable);
  t.deepEqual(lookup.calls, ['lb.example', 'servers.example', 'servers.example']);
});

test('resolving again follows DNS: addresses added and removed; a failed lookup keeps the last answer, or the name when there was none', async (t) => {
  const table = new Map([['servers.example', ['10.0.0.1', '10.0.0.2']]]);
  const addresses = new ServerAddresses(
    [
      { host: 'servers.example', port: 8091 },
      { host: 'later.example', port: 8091 },
    ],
    fakeLookup(table),
  );
  const targets = async (): Promise<{ targets: string[]; failed: string[] }> => {
    const r = await addresses.resolve();
    return { targets: r.endpoints.map((e) => e.target), failed: r.failures.map((f) => f.host) };
  };
  t.deepEqual(await targets(), { targets: ['10.0.0.1:8091', '10.0.0.2:8091', 'later.example:8091'], failed: ['later.example'] });
  table.set('servers.example', ['10.0.0.2', '10.0.0.3']);
  table.set('later.example', ['10.0.0.7', '10.0.0.8']);
  t.deepEqual((await targets()).targets, ['10.0.0.2:8091', '10.0.0.3:8091', '10.0.0.7:8091', '10.0.0.8:8091']);
  table.delete('servers.example');
  t.deepEqual(await targets(), {
    targets: ['10.0.0.2:8091', '10.0.0.3:8091', '10.0.0.7:8091', '10.0.0.8:8091'],
    failed: ['servers.example'],
  });
});

test('ReconnectDelay: a short first retry, the sync interval for a cap of failures, then back-off; reaching a held server starts afresh', (t) => {
  let now = 0;
  const delay = new ReconnectDelay({ initialMs: 1000, maxMs: 30_000 }, () => now);
  t.is(delay.failed(), FIRST_RETRY_MS);
  for (; now < 30_000; now += 1000) {
    const ms = delay.failed();
    t.true(ms >= 500 && ms <= 1000, `${ms} ms after ${now} ms of failures`);
  }
  // Past the cap's worth of failures: doubling from twice the interval, never above the cap.
  const later = Array.from({ length: 8 }, () => delay.failed());
  t.true(later[0] >= 1000 && later[0] <= 2000, `${later[0]}`);
  t.true(later[7] >= 15_000 && later[7] <= 30_000, `${later[7]}`);
  // A server reached (held already or not) ends the run of failures.
  const held = delay.reachedHeld();
  t.true(held >= 500 && held <= 1000);
  t.is(delay.failed(), FIRST_RETRY_MS);
  delay.succeeded();
  t.is(delay.failed(), FIRST_RETRY_MS);
  // A sync interval shorter than the first retry bounds it.
  t.is(new ReconnectDelay({ initialMs: 50, maxMs: 100 }).failed(), 50);
});
