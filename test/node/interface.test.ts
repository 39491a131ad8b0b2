// The host-scoped interface the agent owns in the node namespace: created as
// kanal0 (kind bridge) carrying ADVERTISE_IP/32 scope host, re-created after a
// restart, gone after a clean stop; a kind the kernel lacks (dummy, here)
// fails the start with a message that names the fallback. One owner: a second
// agent for the same address or interface exits. Watched
// (docs/operations.md): when the address is deleted, kanal0 set down or deleted,
// the agent restores it, logs and counts it; while it cannot, /readyz says
// not ready with the reason and kanal_agent_bind_address_ready is 0.

import test, { type ExecutionContext } from 'ava';
import { levelAtLeast } from '../../kit/launch/log-reader.js';
import { skippedBecause } from '../helpers/skipped.js';
import { setTimeout as sleep } from 'node:timers/promises';
import { netnsUnavailableReason, type Netns } from '../../kit/launch/netns.js';
import {
  ADVERTISE_IP,
  AGENT_HEALTH_PORT,
  KAS_PORT,
  agentArgs,
  createTopology,
  destroyAllTopologies,
  findAddress,
  ipLinks,
  startAgent,
  startServer,
  type NsProcess,
  type Topology,
} from '../helpers/node-topology.js';
import { KAS_GIT_VERSION } from '../helpers/kas-stand-in.js';

const unavailable = await netnsUnavailableReason();
test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) skippedBecause('host interface tests', unavailable);
// Serial: each test runs a server, an agent and a KAS stand-in in two namespaces.
const kernelTest = unavailable ? test.skip : test.serial;

async function topology(t: ExecutionContext): Promise<Topology> {
  const topo = await createTopology();
  t.teardown(() => topo.destroy());
  return topo;
}

async function expectInterface(t: ExecutionContext, ns: Netns, kind: string): Promise<void> {
  const link = (await ipLinks(ns)).find((l) => l.ifname === 'kanal0');
  t.truthy(link, 'kanal0 exists');
  t.is(link?.linkinfo?.info_kind, kind);
  t.true(link?.flags.includes('UP'), `kanal0 is up (flags ${link?.flags.join(',')})`);
  const addrs = await findAddress(ns, ADVERTISE_IP);
  t.deepEqual(
    addrs.map((a) => [a.ifname, a.addr.family, a.addr.prefixlen, a.addr.scope]),
    [['kanal0', 'inet', 32, 'host']],
  );
}

async function expectNoInterface(t: ExecutionContext, ns: Netns): Promise<void> {
  t.false(
    (await ipLinks(ns)).some((l) => l.ifname === 'kanal0'),
    'no kanal0 link left behind',
  );
  t.deepEqual(await findAddress(ns, ADVERTISE_IP), [], 'no advertise address left behind');
}

async function versionThroughTunnel(topo: Topology): Promise<string> {
  const r = await topo.curl(topo.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', topo.pki.caCert], 10_000);
  if (r.status !== 200) throw new Error(`curl /version: ${r.status} ${r.result.stderr}`);
  return (JSON.parse(r.body) as { gitVersion: string }).gitVersion;
}

function errorLines(p: NsProcess): unknown[] {
  return p.jsonLines().filter((l) => levelAtLeast(l.level, 'error'));
}

function interfaceLog(p: NsProcess): Record<string, unknown>[] {
  return p.jsonLines().filter((l) => l.msg === 'host interface ready' || l.msg === 'host interface cleaned up');
}

kernelTest(
  'agent creates kanal0 (bridge, ADVERTISE_IP/32 scope host), re-creates it after a restart, removes it on a clean stop',
  async (t) => {
    t.timeout(120_000);
    const topo = await topology(t);
    await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
    await startServer(topo);
    await expectNoInterface(t, topo.node);

    const first = await startAgent(topo, {}, 'agent-1');
    await expectInterface(t, topo.node, 'bridge');
    t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
    t.like(interfaceLog(first)[0], {
      msg: 'host interface ready',
      interface: 'kanal0',
      kind: 'bridge',
      createdLink: true,
      addedAddress: true,
    });

    const firstExit = await first.stop('SIGTERM').then(() => first.exited);
    t.deepEqual(firstExit, { code: 0, signal: null });
    await expectNoInterface(t, topo.node);
    t.like(interfaceLog(first)[1], { msg: 'host interface cleaned up', removedLink: true });

    const second = await startAgent(topo, {}, 'agent-2');
    await expectInterface(t, topo.node, 'bridge');
    t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
    t.like(interfaceLog(second)[0], { createdLink: true, addedAddress: true });
    t.deepEqual(errorLines(second), []);

    t.deepEqual(await second.stop('SIGTERM').then(() => second.exited), { code: 0, signal: null });
    await expectNoInterface(t, topo.node);
    t.deepEqual(errorLines(first), []);
    t.deepEqual(errorLines(second), []);
  },
);

kernelTest('after a crash (SIGKILL) the next agent reclaims the leftover kanal0, serves, and removes it on a clean stop', async (t) => {
  t.timeout(120_000);
  const topo = await topology(t);
  await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
  await startServer(topo);
  const crashed = await startAgent(topo, {}, 'agent-crashed');
  await expectInterface(t, topo.node, 'bridge');
  t.deepEqual(await crashed.stop('SIGKILL').then(() => crashed.exited), { code: null, signal: 'SIGKILL' });
  // Nothing could clean up: the link and address stay until someone removes them.
  await expectInterface(t, topo.node, 'bridge');

  const next = await startAgent(topo, {}, 'agent-next');
  await expectInterface(t, topo.node, 'bridge');
  // The link carries Kanal's ownership marker (its alias), so it is reclaimed, not merely adopted.
  t.like(interfaceLog(next)[0], { msg: 'host interface ready', createdLink: true, addedAddress: true, reclaimed: true });
  t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
  t.deepEqual(await next.stop('SIGTERM').then(() => next.exited), { code: 0, signal: null });
  t.deepEqual(errorLines(next), []);
  await expectNoInterface(t, topo.node);
});

kernelTest('--bind-interface-type dummy fails at start with a message naming the missing type and the bridge fallback', async (t) => {
  t.timeout(60_000);
  const topo = await topology(t);
  // Does this kernel have the dummy link type? Probe inside the namespace only.
  const probe = await topo.node.ip(['link', 'add', 'kprobe0', 'type', 'dummy']);
  const hasDummy = probe.code === 0;
  if (hasDummy) await topo.node.ip(['link', 'del', 'kprobe0']);
  t.log(hasDummy ? 'this kernel has the dummy link type' : `no dummy link type here: ${probe.stderr.trim()}`);

  if (hasDummy) {
    await startServer(topo);
    const agent = await startAgent(topo, { interfaceType: 'dummy' }, 'agent-dummy');
    await expectInterface(t, topo.node, 'dummy');
    t.deepEqual(await agent.stop('SIGTERM').then(() => agent.exited), { code: 0, signal: null });
    await expectNoInterface(t, topo.node);
    return;
  }

  // No server needed: the interface is set up before anything else.
  const agent = topo.kanal(topo.node, 'agent-dummy', agentArgs(topo, { interfaceType: 'dummy' }));
  const exit = await Promise.race([agent.exited, new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), 15_000))]);
  if (exit === 'timeout') {
    await agent.stop('SIGKILL');
    t.fail(`agent with a dummy interface did not exit within 15 s; log:\n${agent.log()}`);
    return;
  }
  t.not(exit.code, 0);
  t.not(exit.code, null);
  const log = agent.log();
  t.regex(log, /no 'dummy' link type/);
  t.regex(log, /--bind-interface-type bridge/);
  t.log(log.trim().split('\n').pop());
  await expectNoInterface(t, topo.node);
  // And it never got as far as the health port.
  const health = await topo.curl(topo.node, `http://127.0.0.1:${AGENT_HEALTH_PORT}/healthz`, [], 2000);
  t.is(health.status, 0);
});

kernelTest('a second agent on the same --bind-address (or --bind-interface) exits at start and leaves the first one serving', async (t) => {
  t.timeout(120_000);
  const topo = await topology(t);
  await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
  await startServer(topo);
  const first = await startAgent(topo, {}, 'agent-first');
  await expectInterface(t, topo.node, 'bridge');
  const firstHealth = `http://127.0.0.1:${AGENT_HEALTH_PORT}/readyz`;

  // Same address and interface; the same address on another interface; the same interface with another address.
  const attempts: [string, string[], RegExp][] = [
    ['same address and interface', [], /interface kanal0 is in use by another running kanal agent \(pid \d+, agent ID node-1\)/],
    [
      'same address, other interface',
      ['--bind-interface', 'kanal1'],
      /address 10\.200\.0\.1 is in use by another running kanal agent \(pid \d+, agent ID node-1\)/,
    ],
    ['same interface, other address', ['--bind-address', '10.200.0.2'], /interface kanal0 is in use by another running kanal agent/],
  ];
  for (const [name, extra, message] of attempts) {
    const second = topo.kanal(
      topo.node,
      `agent-second-${attempts.findIndex((a) => a[0] === name)}`,
      agentArgs(topo, { agentArgs: ['--health-server-port', '8099', '--agent-id', 'node-1b', ...extra] }),
    );
    const exit = await Promise.race([second.exited, new Promise<'timeout'>((resolve) => setTimeout(() => resolve('timeout'), 30_000))]);
    if (exit === 'timeout') {
      await second.stop('SIGKILL');
      t.fail(`${name}: the second agent did not exit; log:\n${second.log()}`);
      continue;
    }
    t.is(exit.code, 1, name);
    t.regex(second.log(), message, name);
    t.regex(second.log(), /this agent changes nothing and exits/);
    t.log(`${name}: ${second.log().trim().split('\n').pop()}`);
    // The first agent still has its link, address and listener, and still serves.
    await expectInterface(t, topo.node, 'bridge');
    t.false(
      (await ipLinks(topo.node)).some((l) => l.ifname === 'kanal1'),
      'nothing created for the refused agent',
    );
    t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION, `${name}: still served by the first agent`);
    t.is((await topo.curl(topo.node, firstHealth)).status, 200);
  }
  t.deepEqual(await first.stop('SIGTERM').then(() => first.exited), { code: 0, signal: null });
  await expectNoInterface(t, topo.node);
  t.deepEqual(errorLines(first), []);
});

/** Polls until kanal0 is up and carries `address` again; the time it took. */
async function restored(topo: Topology, address: string, timeoutMs: number): Promise<number> {
  const t0 = Date.now();
  for (;;) {
    const link = (await ipLinks(topo.node)).find((l) => l.ifname === 'kanal0');
    const addrs = await findAddress(topo.node, address);
    if (link?.flags.includes('UP') && addrs.some((a) => a.ifname === 'kanal0')) return Date.now() - t0;
    if (Date.now() - t0 > timeoutMs) throw new Error(`kanal0 with ${address} not back within ${timeoutMs} ms`);
    await sleep(20);
  }
}

async function agentMetrics(topo: Topology): Promise<Map<string, number>> {
  const r = await topo.curl(topo.node, `http://127.0.0.1:${AGENT_HEALTH_PORT}/metrics`);
  const out = new Map<string, number>();
  for (const line of r.body.split('\n')) {
    if (!line.startsWith('kanal_agent_bind_address')) continue;
    const cut = line.lastIndexOf(' ');
    out.set(line.slice(0, cut), Number(line.slice(cut + 1)));
  }
  return out;
}

async function readyz(topo: Topology): Promise<{ status: number; body: string }> {
  return topo.curl(topo.node, `http://127.0.0.1:${AGENT_HEALTH_PORT}/readyz`);
}

function watchLog(agent: NsProcess): string[] {
  return agent
    .jsonLines()
    .filter((l) => /advertise address/.test(String(l.msg)))
    .map((l) => `${String(l.msg)}: ${JSON.stringify(l.problems)}`);
}

kernelTest(
  'the address deleted, kanal0 set down, kanal0 deleted: each is restored, logged and counted, and the KAS is reachable again',
  async (t) => {
    t.timeout(120_000);
    const topo = await topology(t);
    await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
    await startServer(topo);
    const agent = await startAgent(topo);
    t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);

    const breakages: [string, string[], string][] = [
      ['ip addr del', ['addr', 'del', `${ADVERTISE_IP}/32`, 'dev', 'kanal0'], `address ${ADVERTISE_IP} is missing from kanal0`],
      ['ip link set down', ['link', 'set', 'kanal0', 'down'], 'interface kanal0 is down'],
      ['ip link del', ['link', 'del', 'kanal0'], 'interface kanal0 is gone'],
    ];
    for (const [name, cmd, problem] of breakages) {
      const r = await topo.node.ip(cmd);
      t.is(r.code, 0, `${name}: ${r.stderr}`);
      const ms = await restored(topo, ADVERTISE_IP, 10_000);
      t.log(`${name}: restored within ${ms} ms (polled every 20 ms with ip)`);
      t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION, `${name}: the KAS answers through the agent again`);
      await agent.waitForLine(
        (l) => l.msg === 'advertise address restored' && JSON.stringify(l.problems) === JSON.stringify([problem]),
        10_000,
      );
    }
    const lost = agent.jsonLines().filter((l) => l.msg === 'advertise address lost; restoring it');
    t.deepEqual(
      lost.map((l) => [l.level, l.problems]),
      breakages.map(([, , p]) => ['warn', [p]]),
    );
    t.like(Object.fromEntries(await agentMetrics(topo)), {
      kanal_agent_bind_address_ready: 1,
      kanal_agent_bind_address_losses_total: 3,
      kanal_agent_bind_address_restorations_total: 3,
    });
    t.is((await readyz(topo)).status, 200);
    t.log(watchLog(agent).join('\n'));
    t.deepEqual(await agent.stop('SIGTERM').then(() => agent.exited), { code: 0, signal: null });
    t.false(
      (await ipLinks(topo.node)).some((l) => l.ifname === 'kanal0'),
      'removed on the clean stop',
    );
  },
);

kernelTest(
  'while the address cannot be restored (IPv6 disabled on kanal0), /readyz is 503 with the reason and the metric is 0; then it recovers',
  async (t) => {
    t.timeout(120_000);
    const topo = await topology(t);
    const address = 'fd00:10::1';
    await startServer(topo);
    const agent = await startAgent(topo, { agentArgs: ['--bind-address', address] });
    t.deepEqual(await findAddress(topo.node, address).then((a) => a.map((x) => x.ifname)), ['kanal0']);

    // The kernel drops the interface's IPv6 addresses and refuses new ones (EACCES).
    const off = await topo.node.exec(['sysctl', '-w', 'net.ipv6.conf.kanal0.disable_ipv6=1']);
    t.is(off.code, 0, off.stderr);
    let r = await readyz(topo);
    for (let i = 0; i < 100 && r.status !== 503; i++) r = await readyz(topo).finally(() => sleep(50));
    t.is(r.status, 503);
    t.regex(
      r.body,
      new RegExp(
        `advertise address ${address} on kanal0 unusable since .*: address ${address} is missing from kanal0; restoring \\(last attempt failed: .*IPv6 is disabled on this interface`,
      ),
    );
    t.is((await agentMetrics(topo)).get('kanal_agent_bind_address_ready'), 0);
    const errors = agent.jsonLines().filter((l) => l.msg === 'cannot restore the advertise address');
    t.is(errors.length, 1, 'the same failure is logged once, however often it is retried');

    const on = await topo.node.exec(['sysctl', '-w', 'net.ipv6.conf.kanal0.disable_ipv6=0']);
    t.is(on.code, 0, on.stderr);
    t.log(`restored ${await restored(topo, address, 10_000)} ms after IPv6 came back`);
    await agent.waitForLine((l) => l.msg === 'advertise address restored', 10_000);
    for (let i = 0; i < 100 && r.status !== 200; i++) r = await readyz(topo).finally(() => sleep(50));
    t.is(r.status, 200, r.body);
    t.is((await agentMetrics(topo)).get('kanal_agent_bind_address_ready'), 1);
    t.deepEqual(await agent.stop('SIGTERM').then(() => agent.exited), { code: 0, signal: null });
  },
);

kernelTest('--bind-interface-type none: an address that goes away is reported (not restored), and back when it returns', async (t) => {
  t.timeout(120_000);
  const topo = await topology(t);
  const address = '10.200.0.9';
  const add = await topo.node.ip(['addr', 'add', `${address}/32`, 'dev', 'lo']);
  t.is(add.code, 0, add.stderr);
  await startServer(topo);
  const agent = await startAgent(topo, { interfaceType: 'none', agentArgs: ['--bind-address', address] });
  t.is((await readyz(topo)).status, 200);

  t.is((await topo.node.ip(['addr', 'del', `${address}/32`, 'dev', 'lo'])).code, 0);
  let r = await readyz(topo);
  for (let i = 0; i < 300 && r.status !== 503; i++) r = await readyz(topo).finally(() => sleep(50));
  t.is(r.status, 503);
  t.regex(
    r.body,
    new RegExp(
      `advertise address ${address} unusable since .*: ${address} is not an address of this host \\(EADDRNOTAVAIL\\), and --bind-interface-type none means the agent does not add it`,
    ),
  );
  t.is((await agentMetrics(topo)).get('kanal_agent_bind_address_ready'), 0);
  t.deepEqual(await findAddress(topo.node, address), [], 'the agent did not add it');

  t.is((await topo.node.ip(['addr', 'add', `${address}/32`, 'dev', 'lo'])).code, 0);
  for (let i = 0; i < 300 && r.status !== 200; i++) r = await readyz(topo).finally(() => sleep(50));
  t.is(r.status, 200, r.body);
  await agent.waitForLine((l) => l.msg === 'advertise address usable again', 10_000);
  t.deepEqual(await agent.stop('SIGTERM').then(() => agent.exited), { code: 0, signal: null });
});
