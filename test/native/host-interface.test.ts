// Kernel tests for native/host-interface.ts. Every kernel-touching step runs in
// a throwaway network namespace: the netlink code runs in a child process
// started with `ip netns exec <ns>` (netlink acts on the caller's namespace),
// and results are checked with iproute2 against the same namespace. Nothing
// here creates, changes or deletes anything in the root namespace.

import test, { type ExecutionContext } from 'ava';
import { fileURLToPath } from 'node:url';
import { createNetns, destroyAllNetns, netnsUnavailableReason, type Netns } from '../../kit/launch/netns.js';
import { KANAL_LINK_ALIAS, type HostInterfaceSpec, type HostInterfaceState } from '../../native/host-interface.js';

const FIXTURE = fileURLToPath(new URL('../fixtures/netlink-fixture.js', import.meta.url));

const unavailable = await netnsUnavailableReason();
const kernelTest = unavailable ? test.skip : test;
test.after.always('destroy any namespace a test left behind', destroyAllNetns);
if (unavailable) {
  test(`kernel tests skipped: ${unavailable}`, (t) => {
    t.log(`native host-interface kernel tests skipped: ${unavailable}`);
    t.pass();
  });
}

interface FixtureError {
  type: string;
  message: string;
  errno?: number;
  code?: string;
  operation?: string;
  field?: string;
}
type FixtureResult<T> = { ok: true; result: T } | { ok: false; error: FixtureError };

interface IpAddrInfo {
  family: string;
  local: string;
  prefixlen: number;
  scope: string;
  tentative?: boolean;
}
interface IpLink {
  ifindex: number;
  ifname: string;
  flags: string[];
  ifalias?: string;
  linkinfo?: { info_kind?: string };
  addr_info?: IpAddrInfo[];
}

/** New namespace, destroyed when the test ends however it ends. */
async function netns(t: ExecutionContext): Promise<Netns> {
  const ns = await createNetns('kanal-test');
  t.teardown(() => ns.destroy());
  return ns;
}

async function fixture<T>(ns: Netns, cmd: unknown): Promise<FixtureResult<T>> {
  const r = await ns.exec([process.execPath, FIXTURE, JSON.stringify(cmd)], 20_000);
  const line = r.stdout.trim().split('\n').pop() ?? '';
  try {
    return JSON.parse(line) as FixtureResult<T>;
  } catch {
    throw new Error(`fixture produced no JSON (exit ${r.code}): stdout=${r.stdout} stderr=${r.stderr}`);
  }
}

async function ensure(t: ExecutionContext, ns: Netns, spec: HostInterfaceSpec): Promise<HostInterfaceState> {
  const r = await fixture<HostInterfaceState>(ns, { op: 'ensure', spec });
  if (!r.ok) t.fail(`ensure failed: ${JSON.stringify(r.error)}`);
  return (r as { result: HostInterfaceState }).result;
}

async function remove(t: ExecutionContext, ns: Netns, state: HostInterfaceState): Promise<void> {
  const r = await fixture<null>(ns, { op: 'remove', state });
  if (!r.ok) t.fail(`remove failed: ${JSON.stringify(r.error)}`);
}

async function links(ns: Netns): Promise<IpLink[]> {
  const r = await ns.ip(['-d', '-j', 'addr', 'show']);
  if (r.code !== 0) throw new Error(`ip addr show failed: ${r.stderr}`);
  return JSON.parse(r.stdout) as IpLink[];
}

async function link(ns: Netns, name: string): Promise<IpLink | undefined> {
  return (await links(ns)).find((l) => l.ifname === name);
}

/** The link as `ip -d -j link show` reports it, or undefined when absent. */
async function linkShow(ns: Netns, name: string): Promise<IpLink | undefined> {
  const r = await ns.ip(['-j', '-d', 'link', 'show']);
  if (r.code !== 0) throw new Error(`ip link show failed: ${r.stderr}`);
  return (JSON.parse(r.stdout) as IpLink[]).find((l) => l.ifname === name);
}

/** Every local address in the namespace (all links, both families). */
async function allAddresses(ns: Netns): Promise<string[]> {
  return (await links(ns)).flatMap((l) => (l.addr_info ?? []).map((a) => a.local));
}

async function sh(ns: Netns, args: string[]): Promise<void> {
  const r = await ns.ip(args);
  if (r.code !== 0) throw new Error(`ip ${args.join(' ')} failed: ${r.stderr}`);
}

kernelTest('kind dummy: clear EOPNOTSUPP error without the dummy module, success with it', async (t) => {
  const ns = await netns(t);
  // Ask the kernel directly (inside the namespace) whether it has the dummy type.
  const probe = await ns.ip(['link', 'add', 'probe0', 'type', 'dummy']);
  const hasDummy = probe.code === 0;
  if (hasDummy) await sh(ns, ['link', 'del', 'probe0']);
  t.log(`kernel has dummy link type: ${hasDummy}`);

  const r = await fixture<HostInterfaceState>(ns, { op: 'ensure', spec: { name: 'kanal0', kind: 'dummy', address: '192.0.2.10' } });
  if (hasDummy) {
    t.true(r.ok, JSON.stringify(r));
    const l = await link(ns, 'kanal0');
    t.is(l?.linkinfo?.info_kind, 'dummy');
  } else {
    t.false(r.ok);
    const e = (r as { error: FixtureError }).error;
    t.log(e.message);
    t.is(e.type, 'NetlinkError');
    t.is(e.errno, 95);
    t.is(e.code, 'EOPNOTSUPP');
    t.regex(e.message, /cannot create interface kanal0 of kind dummy: this kernel has no 'dummy' link type \(EOPNOTSUPP, errno 95/);
    t.regex(e.message, /--bind-interface-type bridge/);
    t.regex(e.message, /--bind-interface-type none/);
    t.is(await link(ns, 'kanal0'), undefined, 'nothing left behind');
  }
});

kernelTest('kind bridge IPv4: create, idempotent re-ensure, /32 scope host, up, remove', async (t) => {
  const ns = await netns(t);
  const spec = { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' } as const;
  const first = await ensure(t, ns, spec);
  t.like(first, { name: 'kanal0', address: '192.0.2.10', createdLink: true, addedAddress: true, reclaimed: false, kind: 'bridge' });
  t.true(first.ifindex > 1);

  const l = await link(ns, 'kanal0');
  t.truthy(l);
  t.is(l?.ifindex, first.ifindex);
  t.is(l?.linkinfo?.info_kind, 'bridge');
  t.true(l?.flags.includes('UP'), `flags ${l?.flags.join(',')}`);
  const a = l?.addr_info?.filter((x) => x.family === 'inet') ?? [];
  t.deepEqual(
    a.map((x) => [x.local, x.prefixlen, x.scope]),
    [['192.0.2.10', 32, 'host']],
  );

  t.is(l?.ifalias, KANAL_LINK_ALIAS, 'ownership marker set');

  // The link carries our marker, so a second ensure reclaims it as Kanal's own.
  const second = await ensure(t, ns, spec);
  t.like(second, { createdLink: true, addedAddress: true, reclaimed: true, ifindex: first.ifindex, kind: 'bridge' });
  t.is((await link(ns, 'kanal0'))?.addr_info?.filter((x) => x.family === 'inet').length, 1, 'no duplicate address');

  await remove(t, ns, first);
  t.is(await link(ns, 'kanal0'), undefined);
  await remove(t, ns, first); // idempotent
  await remove(t, ns, second); // the reclaiming state is a no-op once the link is gone
});

kernelTest('kind bridge IPv6: /128 without DAD, remove', async (t) => {
  const ns = await netns(t);
  const sysctl = await ns.exec(['sysctl', '-n', 'net.ipv6.conf.all.disable_ipv6']);
  if (sysctl.code !== 0) {
    t.log(`IPv6 unavailable in this kernel (${sysctl.stderr.trim()}); IPv6 case skipped`);
    t.pass();
    return;
  }
  if (sysctl.stdout.trim() !== '0') {
    await ns.exec(['sysctl', '-w', 'net.ipv6.conf.all.disable_ipv6=0', 'net.ipv6.conf.default.disable_ipv6=0']);
  }
  const state = await ensure(t, ns, { name: 'kanal6', kind: 'bridge', address: '2001:db8::10' });
  t.like(state, { createdLink: true, addedAddress: true, kind: 'bridge' });
  const l = await link(ns, 'kanal6');
  const a = l?.addr_info?.find((x) => x.family === 'inet6' && x.local === '2001:db8::10');
  t.truthy(a, JSON.stringify(l?.addr_info));
  t.is(a?.prefixlen, 128);
  t.falsy(a?.tentative, 'NODAD: usable at once');
  // Linux derives IPv6 scope from the address itself and ignores ifa_scope.
  t.log(`IPv6 address scope as reported by the kernel: ${a?.scope}`);

  const again = await ensure(t, ns, { name: 'kanal6', kind: 'bridge', address: '2001:db8::10' });
  t.like(again, { createdLink: true, addedAddress: true, reclaimed: true, ifindex: state.ifindex });

  await remove(t, ns, state);
  t.is(await link(ns, 'kanal6'), undefined);
});

kernelTest('adopted link: remove drops only the address we added, keeps the link', async (t) => {
  const ns = await netns(t);
  await sh(ns, ['link', 'add', 'x', 'type', 'bridge']);
  const state = await ensure(t, ns, { name: 'x', kind: 'bridge', address: '198.51.100.7' });
  t.like(state, { createdLink: false, addedAddress: true, reclaimed: false, kind: 'bridge' });
  t.true((await link(ns, 'x'))?.flags.includes('UP'));
  t.true((await link(ns, 'x'))?.addr_info?.some((a) => a.local === '198.51.100.7'));

  await remove(t, ns, state);
  const after = await link(ns, 'x');
  t.truthy(after, 'pre-existing link kept');
  t.false(after?.addr_info?.some((a) => a.local === '198.51.100.7') ?? false, 'our address removed');
});

kernelTest('adopted link and address: remove leaves both', async (t) => {
  const ns = await netns(t);
  await sh(ns, ['link', 'add', 'x', 'type', 'bridge']);
  await sh(ns, ['addr', 'add', '198.51.100.7/32', 'dev', 'x', 'scope', 'host']);
  const state = await ensure(t, ns, { name: 'x', kind: 'bridge', address: '198.51.100.7' });
  t.like(state, { createdLink: false, addedAddress: false, reclaimed: false });
  await remove(t, ns, state);
  t.true((await link(ns, 'x'))?.addr_info?.some((a) => a.local === '198.51.100.7'));
});

kernelTest('after a crash the next ensure reclaims the marked link and address; remove deletes both', async (t) => {
  const ns = await netns(t);
  const spec = { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' } as const;

  // First "agent": ensure, then SIGKILL itself without removing anything.
  const crash = await ns.exec([process.execPath, FIXTURE, JSON.stringify({ op: 'crash', spec })], 20_000);
  const crashed = JSON.parse(crash.stdout.trim().split('\n').pop() ?? '') as FixtureResult<HostInterfaceState>;
  t.true(crashed.ok, crash.stdout);
  t.not(crash.code, 0, 'the fixture died instead of exiting');
  const lost = (crashed as { result: HostInterfaceState }).result;
  t.like(lost, { createdLink: true, addedAddress: true, reclaimed: false });

  // The kernel keeps the link, its address and the marker.
  const left = await linkShow(ns, 'kanal0');
  t.is(left?.ifindex, lost.ifindex);
  t.is(left?.ifalias, KANAL_LINK_ALIAS, 'marker visible as ifalias in ip -d -j link show');
  t.true((await allAddresses(ns)).includes('192.0.2.10'));

  // Second "agent": knows nothing of the first, but the marker says the link is Kanal's.
  const next = await ensure(t, ns, spec);
  t.like(next, { createdLink: true, addedAddress: true, reclaimed: true, ifindex: lost.ifindex, kind: 'bridge' });
  t.is((await link(ns, 'kanal0'))?.addr_info?.filter((a) => a.local === '192.0.2.10').length, 1, 'no duplicate address');

  // Its clean stop removes what the crashed agent left behind.
  await remove(t, ns, next);
  t.is(await linkShow(ns, 'kanal0'), undefined, 'link removed');
  t.false((await allAddresses(ns)).includes('192.0.2.10'), 'address removed');
});

kernelTest('a reclaimed link that lost its address gets it back, and remove still deletes the link', async (t) => {
  const ns = await netns(t);
  const spec = { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' } as const;
  const first = await ensure(t, ns, spec);
  // As if the previous agent died between marking the link and adding the address.
  await sh(ns, ['addr', 'del', '192.0.2.10/32', 'dev', 'kanal0']);
  const next = await ensure(t, ns, spec);
  t.like(next, { createdLink: true, addedAddress: true, reclaimed: true, ifindex: first.ifindex });
  t.true((await allAddresses(ns)).includes('192.0.2.10'));
  await remove(t, ns, next);
  t.is(await linkShow(ns, 'kanal0'), undefined);
});

kernelTest('an operator-created link without alias is adopted, never marked and never removed', async (t) => {
  const ns = await netns(t);
  await sh(ns, ['link', 'add', 'kanal0', 'type', 'bridge']);
  const before = await linkShow(ns, 'kanal0');
  t.is(before?.ifalias, undefined);

  const first = await ensure(t, ns, { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' });
  t.like(first, { createdLink: false, addedAddress: true, reclaimed: false, ifindex: before?.ifindex });
  t.is((await linkShow(ns, 'kanal0'))?.ifalias, undefined, 'Kanal does not stamp a link it did not create');

  // Simulated restart after a crash: the operator's link is still not Kanal's; neither is the address now.
  const second = await ensure(t, ns, { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' });
  t.like(second, { createdLink: false, addedAddress: false, reclaimed: false });
  await remove(t, ns, second);
  t.is((await linkShow(ns, 'kanal0'))?.ifindex, before?.ifindex, 'operator link kept');
  t.true((await allAddresses(ns)).includes('192.0.2.10'), 'address kept: this run did not add it');

  await remove(t, ns, first);
  t.is((await linkShow(ns, 'kanal0'))?.ifindex, before?.ifindex, 'operator link kept');
  t.false((await allAddresses(ns)).includes('192.0.2.10'), 'the address the first run added is removed');
});

kernelTest('an operator-created link with some other alias is not reclaimed', async (t) => {
  const ns = await netns(t);
  await sh(ns, ['link', 'add', 'kanal0', 'type', 'bridge']);
  for (const alias of ['uplink for the lab', `${KANAL_LINK_ALIAS} (kept by ops)`, 'kanal-agent']) {
    await sh(ns, ['link', 'set', 'kanal0', 'alias', alias]);
    t.is((await linkShow(ns, 'kanal0'))?.ifalias, alias);
    const state = await ensure(t, ns, { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' });
    t.like(state, { createdLink: false, addedAddress: true, reclaimed: false }, alias);
    await remove(t, ns, state);
    const after = await linkShow(ns, 'kanal0');
    t.truthy(after, `link with alias ${JSON.stringify(alias)} kept`);
    t.is(after?.ifalias, alias, 'alias untouched');
    t.false((await allAddresses(ns)).includes('192.0.2.10'), 'only our address removed');
  }
});

kernelTest('adopting a link of another kind is accepted and reported', async (t) => {
  const ns = await netns(t);
  await sh(ns, ['link', 'add', 'kanal0', 'type', 'bridge']);
  const state = await ensure(t, ns, { name: 'kanal0', kind: 'dummy', address: '192.0.2.10' });
  t.like(state, { createdLink: false, addedAddress: true, kind: 'bridge' });
});

kernelTest('remove leaves a same-named link that replaced ours alone', async (t) => {
  const ns = await netns(t);
  const state = await ensure(t, ns, { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' });
  await sh(ns, ['link', 'del', 'kanal0']);
  await sh(ns, ['link', 'add', 'kanal0', 'type', 'bridge']);
  const replaced = await link(ns, 'kanal0');
  t.not(replaced?.ifindex, state.ifindex);
  await remove(t, ns, state);
  t.is((await link(ns, 'kanal0'))?.ifindex, replaced?.ifindex);
});

kernelTest('a failed address step rolls back the link it created', async (t) => {
  const ns = await netns(t);
  const sysctl = await ns.exec(['sysctl', '-w', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1']);
  if (sysctl.code !== 0) {
    t.log(`cannot disable IPv6 in the namespace (${sysctl.stderr.trim()}); rollback case skipped`);
    t.pass();
    return;
  }
  const r = await fixture<HostInterfaceState>(ns, { op: 'ensure', spec: { name: 'kanal0', kind: 'bridge', address: '2001:db8::10' } });
  t.false(r.ok);
  const e = (r as { error: FixtureError }).error;
  t.log(`${e.code} (${e.errno}): ${e.message}`);
  t.is(e.type, 'NetlinkError');
  t.regex(e.message, /IPv6 is disabled/);
  t.is(await link(ns, 'kanal0'), undefined, 'created link rolled back');
});

kernelTest('invalid name or address fails before any kernel call', async (t) => {
  const ns = await netns(t);
  const before = (await links(ns)).map((l) => l.ifname);
  for (const [spec, field] of [
    [{ name: 'kanal/0', kind: 'bridge', address: '192.0.2.10' }, 'name'],
    [{ name: 'thisnameiswaytoolong', kind: 'bridge', address: '192.0.2.10' }, 'name'],
    [{ name: 'kanal0', kind: 'bridge', address: '192.0.2.10/32' }, 'address'],
    [{ name: 'kanal0', kind: 'bridge', address: 'not-an-ip' }, 'address'],
  ] as const) {
    const r = await fixture<HostInterfaceState>(ns, { op: 'ensure', spec });
    t.false(r.ok);
    const e = (r as { error: FixtureError }).error;
    t.is(e.type, 'HostInterfaceSpecError', e.message);
    t.is(e.field, field);
  }
  t.deepEqual(
    (await links(ns)).map((l) => l.ifname),
    before,
  );
});

kernelTest('checkNetlink reports ok and the state of lo', async (t) => {
  const ns = await netns(t);
  const r = await fixture<{ ok: boolean; detail: string }>(ns, { op: 'check' });
  t.true(r.ok);
  const res = (r as { result: { ok: boolean; detail: string } }).result;
  t.true(res.ok, res.detail);
  t.regex(res.detail, /lo is ifindex 1, down/); // a fresh namespace has lo down
  t.regex(res.detail, /CAP_NET_ADMIN present/);
});

kernelTest('without CAP_NET_ADMIN the error says so', async (t) => {
  const ns = await netns(t);
  const spec = { name: 'kanal0', kind: 'bridge', address: '192.0.2.10' };
  // Drop to nobody inside the namespace: same kernel, no capabilities.
  const r = await ns.exec(
    ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, FIXTURE, JSON.stringify({ op: 'ensure', spec })],
    20_000,
  );
  if (r.code !== 0 && r.stdout.trim() === '') {
    t.log(`setpriv not usable here (${r.stderr.trim()}); EPERM case skipped`);
    t.pass();
    return;
  }
  const res = JSON.parse(r.stdout.trim().split('\n').pop() ?? '') as FixtureResult<HostInterfaceState>;
  t.false(res.ok);
  const e = (res as { error: FixtureError }).error;
  t.log(e.message);
  t.is(e.errno, 1);
  t.regex(e.message, /CAP_NET_ADMIN is needed/);
  t.is(await link(ns, 'kanal0'), undefined);
});
