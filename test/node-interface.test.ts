// The host-scoped interface the agent owns in the node namespace: created as
// kanal0 (kind bridge) carrying ADVERTISE_IP/32 scope host, re-created after a
// restart, gone after a clean stop; a kind the kernel lacks (dummy, here)
// fails the start with a message that names the fallback.

import test, { type ExecutionContext } from 'ava';
import { netnsUnavailableReason, type Netns } from './helpers/netns.js';
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
} from './helpers/node-topology.js';
import { KAS_GIT_VERSION } from './helpers/kas-stand-in.js';

const unavailable = await netnsUnavailableReason();
test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) {
  test(`host interface tests skipped: ${unavailable}`, (t) => {
    t.log(`skipped: ${unavailable}`);
    t.pass();
  });
}
const kernelTest = unavailable ? test.skip : test;

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
  return p.jsonLines().filter((l) => Number(l.level) >= 50);
}

function interfaceLog(p: NsProcess): Record<string, unknown>[] {
  return p.jsonLines().filter((l) => l.msg === 'host interface ready' || l.msg === 'host interface cleaned up');
}

kernelTest('agent creates kanal0 (bridge, ADVERTISE_IP/32 scope host), re-creates it after a restart, removes it on a clean stop', async (t) => {
  t.timeout(120_000);
  const topo = await topology(t);
  await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
  await startServer(topo);
  await expectNoInterface(t, topo.node);

  const first = await startAgent(topo, {}, 'agent-1');
  await expectInterface(t, topo.node, 'bridge');
  t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
  t.like(interfaceLog(first)[0], { msg: 'host interface ready', interface: 'kanal0', kind: 'bridge', createdLink: true, addedAddress: true });

  const firstExit = await first.stop('SIGTERM');
  t.deepEqual(firstExit, { code: 0, signal: null });
  await expectNoInterface(t, topo.node);
  t.like(interfaceLog(first)[1], { msg: 'host interface cleaned up', removedLink: true });

  const second = await startAgent(topo, {}, 'agent-2');
  await expectInterface(t, topo.node, 'bridge');
  t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
  t.like(interfaceLog(second)[0], { createdLink: true, addedAddress: true });
  t.deepEqual(errorLines(second), []);

  t.deepEqual(await second.stop('SIGTERM'), { code: 0, signal: null });
  await expectNoInterface(t, topo.node);
  t.deepEqual(errorLines(first), []);
  t.deepEqual(errorLines(second), []);
});

kernelTest('after a crash (SIGKILL) the next agent reclaims the leftover kanal0, serves, and removes it on a clean stop', async (t) => {
  t.timeout(120_000);
  const topo = await topology(t);
  await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
  await startServer(topo);
  const crashed = await startAgent(topo, {}, 'agent-crashed');
  await expectInterface(t, topo.node, 'bridge');
  t.deepEqual(await crashed.stop('SIGKILL'), { code: null, signal: 'SIGKILL' });
  // Nothing could clean up: the link and address stay until someone removes them.
  await expectInterface(t, topo.node, 'bridge');

  const next = await startAgent(topo, {}, 'agent-next');
  await expectInterface(t, topo.node, 'bridge');
  // The link carries Kanal's ownership marker (its alias), so it is reclaimed, not merely adopted.
  t.like(interfaceLog(next)[0], { msg: 'host interface ready', createdLink: true, addedAddress: true, reclaimed: true });
  t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION);
  t.deepEqual(await next.stop('SIGTERM'), { code: 0, signal: null });
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
    t.deepEqual(await agent.stop('SIGTERM'), { code: 0, signal: null });
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
    ['same address, other interface', ['--bind-interface', 'kanal1'], /address 10\.200\.0\.1 is in use by another running kanal agent \(pid \d+, agent ID node-1\)/],
    ['same interface, other address', ['--bind-address', '10.200.0.2'], /interface kanal0 is in use by another running kanal agent/],
  ];
  for (const [name, extra, message] of attempts) {
    const second = topo.kanal(topo.node, `agent-second-${attempts.findIndex((a) => a[0] === name)}`, agentArgs(topo, { agentArgs: ['--health-server-port', '8099', '--agent-id', 'node-1b', ...extra] }));
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
    t.false((await ipLinks(topo.node)).some((l) => l.ifname === 'kanal1'), 'nothing created for the refused agent');
    t.is(await versionThroughTunnel(topo), KAS_GIT_VERSION, `${name}: still served by the first agent`);
    t.is((await topo.curl(topo.node, firstHealth)).status, 200);
  }
  t.deepEqual(await first.stop('SIGTERM'), { code: 0, signal: null });
  await expectNoInterface(t, topo.node);
  t.deepEqual(errorLines(first), []);
});
