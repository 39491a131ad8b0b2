// The node's advertise address is watched (#12 finding 3), in a network
// namespace: when the address is deleted, its interface set down or deleted,
// the agent restores it, logs it and counts it; while it cannot, /readyz says
// not ready with the reason and kanal_agent_bind_address_ready is 0.

import test, { type ExecutionContext } from 'ava';
import { setTimeout as sleep } from 'node:timers/promises';
import { netnsUnavailableReason } from './helpers/netns.js';
import {
  ADVERTISE_IP,
  AGENT_HEALTH_PORT,
  KAS_PORT,
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
  test(`address watch tests skipped: ${unavailable}`, (t) => {
    t.log(`skipped: ${unavailable}`);
    t.pass();
  });
}
const kernelTest = unavailable ? test.skip : test.serial;

async function topology(t: ExecutionContext): Promise<Topology> {
  const topo = await createTopology();
  t.teardown(() => topo.destroy());
  return topo;
}

async function versionThroughTunnel(topo: Topology, address = ADVERTISE_IP): Promise<string> {
  const host = address.includes(':') ? `[${address}]` : address;
  const r = await topo.curl(topo.node, `https://${host}:${KAS_PORT}/version`, ['--cacert', topo.pki.caCert], 10_000);
  if (r.status !== 200) throw new Error(`curl /version: ${r.status} ${r.result.stderr}`);
  return (JSON.parse(r.body) as { gitVersion: string }).gitVersion;
}

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
  return agent.jsonLines().filter((l) => /advertise address/.test(String(l.msg))).map((l) => `${String(l.msg)}: ${JSON.stringify(l.problems)}`);
}

kernelTest('the address deleted, kanal0 set down, kanal0 deleted: each is restored, logged and counted, and the KAS is reachable again', async (t) => {
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
    await agent.waitForLine((l) => l.msg === 'advertise address restored' && JSON.stringify(l.problems) === JSON.stringify([problem]), 10_000);
  }
  const lost = agent.jsonLines().filter((l) => l.msg === 'advertise address lost; restoring it');
  t.deepEqual(lost.map((l) => [l.level, l.problems]), breakages.map(([, , p]) => [40, [p]]));
  t.like(Object.fromEntries(await agentMetrics(topo)), {
    kanal_agent_bind_address_ready: 1,
    kanal_agent_bind_address_losses_total: 3,
    kanal_agent_bind_address_restorations_total: 3,
  });
  t.is((await readyz(topo)).status, 200);
  t.log(watchLog(agent).join('\n'));
  t.deepEqual(await agent.stop('SIGTERM'), { code: 0, signal: null });
  t.false((await ipLinks(topo.node)).some((l) => l.ifname === 'kanal0'), 'removed on the clean stop');
});

kernelTest('while the address cannot be restored (IPv6 disabled on kanal0), /readyz is 503 with the reason and the metric is 0; then it recovers', async (t) => {
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
  t.regex(r.body, new RegExp(`advertise address ${address} on kanal0 unusable since .*: address ${address} is missing from kanal0; restoring \\(last attempt failed: .*IPv6 is disabled on this interface`));
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
  t.deepEqual(await agent.stop('SIGTERM'), { code: 0, signal: null });
});

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
  t.regex(r.body, new RegExp(`advertise address ${address} unusable since .*: ${address} is not an address of this host \\(EADDRNOTAVAIL\\), and --bind-interface-type none means the agent does not add it`));
  t.is((await agentMetrics(topo)).get('kanal_agent_bind_address_ready'), 0);
  t.deepEqual(await findAddress(topo.node, address), [], 'the agent did not add it');

  t.is((await topo.node.ip(['addr', 'add', `${address}/32`, 'dev', 'lo'])).code, 0);
  for (let i = 0; i < 300 && r.status !== 200; i++) r = await readyz(topo).finally(() => sleep(50));
  t.is(r.status, 200, r.body);
  await agent.waitForLine((l) => l.msg === 'advertise address usable again', 10_000);
  t.deepEqual(await agent.stop('SIGTERM'), { code: 0, signal: null });
});
