// Node -> control plane with real clients: kubectl and curl inside the node
// namespace talk to https://ADVERTISE_IP:6443, served by the Kanal agent's
// listener and carried through the tunnel to a kube-apiserver stand-in in
// the control-plane namespace. TLS passes through untouched: the clients
// verify the stand-in's certificate themselves. A destination off the
// server's allow-list is refused, logged, and never dialled.

import test from 'ava';
import { levelAtLeast } from '../../kit/launch/log-reader.js';
import { skippedBecause } from '../helpers/skipped.js';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { netnsUnavailableReason, run } from '../../kit/launch/netns.js';
import {
  ADVERTISE_IP,
  AGENT_ID,
  KAS_PORT,
  createTopology,
  destroyAllTopologies,
  startAgent,
  startServer,
  type NsProcess,
  type Topology,
} from '../helpers/node-topology.js';
import { CONFIGMAP_DATA, CONFIGMAP_NAME, KAS_GIT_VERSION } from '../helpers/kas-stand-in.js';
import { errorMessage } from '../../src/common/error-message.js';

const KUBECTL = '/usr/bin/kubectl';
const OFF_LIST_LOCAL = 7000;
const OFF_LIST_PORT = 7001;

const unavailable = await netnsUnavailableReason();
const kubectlMissing = fs.existsSync(KUBECTL) ? undefined : `${KUBECTL} not found`;
test.after.always('destroy any topology or namespace left behind', destroyAllTopologies);
if (unavailable) skippedBecause('node -> control plane kubectl tests', unavailable);
const kernelTest = unavailable ? test.skip : test.serial;
const kubectlTest = unavailable || kubectlMissing ? test.skip : test.serial;
if (!unavailable && kubectlMissing) skippedBecause('kubectl tests', kubectlMissing);

interface Stack {
  topo: Topology;
  server: NsProcess;
  agent: NsProcess;
  kas: NsProcess;
  offList: NsProcess;
  offListRelay: string;
  kubeconfig: string;
}

let stack: Stack | undefined;

test.before(async () => {
  if (unavailable) return;
  const topo = await createTopology();
  try {
    const kas = await topo.kas(topo.cp, 'kas', topo.cpAddr, KAS_PORT);
    // Reachable from the server, but not on its allow-list: must see no connection at all.
    const offList = await topo.services(topo.cp, 'cp-services', [
      { kind: 'count', name: 'off-list', host: topo.cpAddr, port: OFF_LIST_PORT },
    ]);
    const server = await startServer(topo);
    const agent = await startAgent(topo, { targets: [`${OFF_LIST_LOCAL}:${topo.cpAddr}:${OFF_LIST_PORT}`] });
    const offListRelay = topo.socketPath('node-off-list');
    await topo.services(topo.node, 'node-services', [
      { kind: 'relay', name: 'off-list', listen: { path: offListRelay }, to: { host: ADVERTISE_IP, port: OFF_LIST_LOCAL } },
    ]);
    const kubeconfig = path.join(topo.dir, 'kubeconfig');
    fs.writeFileSync(
      kubeconfig,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters:',
        '- name: kanal',
        '  cluster:',
        `    server: https://${ADVERTISE_IP}:${KAS_PORT}`,
        `    certificate-authority: ${topo.pki.caCert}`,
        'users:',
        // A token, as a bootstrap kubeconfig has (the stand-in does not check it);
        // without any credentials kubectl would prompt for a user name.
        '- name: node',
        '  user: {token: kanal-bootstrap-token}',
        'contexts:',
        '- name: kanal',
        '  context: {cluster: kanal, user: node}',
        'current-context: kanal',
        '',
      ].join('\n'),
    );
    stack = { topo, server, agent, kas, offList, offListRelay, kubeconfig };
  } catch (err) {
    await topo.destroy(true);
    throw new Error(`${errorMessage(err)}\n(logs kept in ${topo.dir})`, { cause: err });
  }
});

test.after.always('tear the topology down', async () => {
  await stack?.topo.destroy();
});

function need(): Stack {
  if (!stack) throw new Error('stack not started');
  return stack;
}

async function kubectl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const s = need();
  return s.topo.node.exec(
    [
      'env',
      `HOME=${s.topo.dir}`,
      KUBECTL,
      '--kubeconfig',
      s.kubeconfig,
      '--cache-dir',
      path.join(s.topo.dir, 'kube-cache'),
      '--request-timeout',
      '10s',
      ...args,
    ],
    30_000,
  );
}

function requestsSeenByKas(): { url: string; peer: string; status: number }[] {
  return need()
    .kas.jsonLines()
    .filter((l) => l.event === 'request')
    .map((l) => ({ url: String(l.url), peer: String(l.peer), status: Number(l.status) }));
}

kubectlTest('kubectl version (in the node namespace) reports the stand-in behind ADVERTISE_IP:6443', async (t) => {
  const r = await kubectl(['version', '-o', 'json']);
  t.is(r.code, 0, `kubectl version failed: ${r.stderr}`);
  const out = JSON.parse(r.stdout) as { serverVersion?: { gitVersion?: string; major?: string; minor?: string } };
  t.is(out.serverVersion?.gitVersion, KAS_GIT_VERSION);
  t.is(out.serverVersion?.major, '1');
});

kubectlTest('kubectl get configmaps -n default lists the stand-in configmap (table and JSON)', async (t) => {
  const table = await kubectl(['get', 'configmaps', '-n', 'default']);
  t.is(table.code, 0, `kubectl get configmaps failed: ${table.stderr}`);
  const lines = table.stdout.trim().split('\n');
  t.regex(lines[0] ?? '', /^NAME\s+DATA\s+AGE/);
  t.regex(lines[1] ?? '', new RegExp(`^${CONFIGMAP_NAME}\\s+1\\s+`));

  const json = await kubectl(['get', 'configmaps', '-n', 'default', '-o', 'json']);
  t.is(json.code, 0, `kubectl get configmaps -o json failed: ${json.stderr}`);
  const list = JSON.parse(json.stdout) as { items: { metadata: { name: string }; data: Record<string, string> }[] };
  t.deepEqual(
    list.items.map((i) => [i.metadata.name, i.data]),
    [[CONFIGMAP_NAME, CONFIGMAP_DATA]],
  );

  const ns = await kubectl(['get', 'namespaces', '-o', 'name']);
  t.is(ns.code, 0, `kubectl get namespaces failed: ${ns.stderr}`);
  t.deepEqual(ns.stdout.trim().split('\n'), ['namespace/default', 'namespace/kube-system']);
});

kernelTest('curl --cacert (in the node namespace) gets /version through the tunnel', async (t) => {
  const s = need();
  const r = await s.topo.curl(s.topo.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', s.topo.pki.caCert], 10_000);
  t.is(r.status, 200, `curl: ${r.result.stderr}`);
  t.is((JSON.parse(r.body) as { gitVersion: string }).gitVersion, KAS_GIT_VERSION);
  // And the certificate really is checked end to end: a wrong CA fails.
  const rogue = await s.topo.curl(s.topo.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', s.topo.pki.rogueCaCert], 10_000);
  t.is(rogue.status, 0);
  t.regex(rogue.result.stderr, /certificate/i);
});

kernelTest('the stand-in sees the Kanal server as its peer, never the node', (t) => {
  const s = need();
  const seen = requestsSeenByKas();
  t.true(seen.length > 0, 'the stand-in answered nothing');
  const peers = new Set(seen.map((r) => r.peer.replace(/:\d+$/, '')));
  t.deepEqual([...peers], [s.topo.cpAddr]);
  t.log(`${seen.length} requests: ${[...new Set(seen.map((r) => r.url.split('?')[0]))].join(' ')}`);
});

kernelTest('a destination off the allow-list is closed promptly, logged by the server, and never dialled', async (t) => {
  const s = need();
  const destination = `${s.topo.cpAddr}:${OFF_LIST_PORT}`;
  const started = Date.now();
  const outcome = await new Promise<{ ms: number; bytes: number; how: string }>((resolve) => {
    const sock = net.connect({ path: s.offListRelay });
    let bytes = 0;
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({ ms: Date.now() - started, bytes, how: 'still open after 10 s' });
    }, 10_000);
    sock.on('data', (c: Buffer) => (bytes += c.length));
    sock.on('error', () => undefined);
    sock.once('connect', () => sock.write('GET /version HTTP/1.1\r\nHost: kas\r\n\r\n'));
    sock.once('close', () => {
      clearTimeout(timer);
      resolve({ ms: Date.now() - started, bytes, how: 'closed' });
    });
  });
  t.is(outcome.how, 'closed');
  t.true(outcome.ms < 5000, `closed after ${outcome.ms} ms`);
  t.is(outcome.bytes, 0);
  t.log(`client connection closed after ${outcome.ms} ms`);

  const refusal = await s.server.waitForLine(
    (l) => typeof l.msg === 'string' && l.msg.includes('refused node dial') && l.address === destination,
    5000,
  );
  t.is(refusal.agentID, AGENT_ID);
  t.true(levelAtLeast(refusal.level, 'warn'), 'the refusal is logged at warn or above');

  // Also a real client: curl is refused the same way, promptly.
  const t0 = Date.now();
  const r = await s.topo.curl(s.topo.node, `http://${ADVERTISE_IP}:${OFF_LIST_LOCAL}/`, [], 10_000);
  t.is(r.status, 0);
  t.true(Date.now() - t0 < 5000, `curl took ${Date.now() - t0} ms`);

  // Give a late dial every chance to show up: the off-list listener saw nothing.
  await sleep(500);
  t.deepEqual(
    s.offList.jsonLines().filter((l) => l.event === 'accepted'),
    [],
  );
  // And the agent stays healthy for the allowed destination.
  const ok = await s.topo.curl(s.topo.node, `https://${ADVERTISE_IP}:${KAS_PORT}/version`, ['--cacert', s.topo.pki.caCert], 10_000);
  t.is(ok.status, 200);
});

kernelTest('no process wrote an error-level log line', (t) => {
  const s = need();
  for (const p of [s.server, s.agent]) {
    const errors = p.jsonLines().filter((l) => levelAtLeast(l.level, 'error'));
    t.deepEqual(errors, [], `${p.name} logged errors`);
  }
  t.true(s.agent.running() && s.server.running());
});

// Never touch anything outside the namespaces: a sanity check that `ip` in the
// root namespace shows no kanal links (read-only).
kernelTest('nothing of ours appears in the root namespace', async (t) => {
  const r = await run('ip', ['-j', 'link', 'show']);
  t.is(r.code, 0);
  const names = (JSON.parse(r.stdout) as { ifname: string }[]).map((l) => l.ifname);
  t.false(names.includes('kv-cp') || names.includes('kv-node') || names.includes('kanal0'), names.join(' '));
});
