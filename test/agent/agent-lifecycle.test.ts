/**
 * KanalAgent's life (created -> starting -> running -> stopping -> stopped,
 * src/agent/agent.ts), in process with a lease counter against the Kubernetes
 * API stand-in and the node side on 127.0.0.2 with --bind-interface-type none
 * (no root needed): a second start() is refused before it makes anything, a
 * stop() before start() leaves nothing to start, a stop() during start() waits
 * for it and leaves nothing running, and two stops are one.
 */
import test, { type ExecutionContext } from 'ava';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { AGENT_LIFECYCLE, KanalAgent, type AgentLife, type AgentOptions } from '../../src/agent/agent.js';
import { StateMachine } from '../../src/common/state-machine.js';
import { h2Transport } from '../../src/transport/h2/index.js';
import { freePort } from '../../kit/launch/kanal-cli.js';
import { captureLogger, makeEnv, waitFor, type CapturedLogger } from '../helpers/in-process.js';
import { startKubeApi, type KubeFixture } from '../helpers/kube-stand-in/fixture.js';

const NODE_ADDRESS = '127.0.0.2';
const HOST_INTERFACE_UP = 'using existing address (--bind-interface-type none)';

interface Fixture {
  agent: KanalAgent;
  logs: CapturedLogger;
  k: KubeFixture;
  kubeconfig: string;
  nodePort: number;
  /** The lease LISTs the stand-in served (one per lease counter started). */
  leaseLists(): number;
}

/** An agent with a lease counter and a node listener; its server address refuses (no tunnel is needed here). */
async function agentWithParts(t: ExecutionContext): Promise<Fixture> {
  const env = await makeEnv(t);
  const k = await startKubeApi(t);
  const kubeconfig = await k.api.writeKubeconfig(path.join(k.dir, 'agent.kubeconfig'), { user: 'agent', auth: 'token' });
  const nodePort = await freePort(NODE_ADDRESS);
  const logs = captureLogger('debug');
  const options: AgentOptions = {
    tunnels: {
      agentID: 'node-1',
      agentIdentifiers: '',
      server: { hosts: [{ host: '127.0.0.1', port: await freePort() }], tls: { ca: fs.readFileSync(env.pki.caCert) } },
      dialTimeoutMs: 5000,
      connectTimeoutMs: 5000,
      reconnect: { initialMs: 100, maxMs: 500 },
      transport: h2Transport,
      log: logs.log,
    },
    leases: {
      kube: { kubeconfig, qps: 50, burst: 100, contentType: 'application/json' },
      namespace: 'kube-system',
      selector: 'k8s-app=konnectivity-server',
    },
    node: {
      bindAddress: NODE_ADDRESS,
      targets: [{ localPort: nodePort, destination: '127.0.0.1:1' }],
      interfaceName: 'kanal0',
      interfaceType: 'none',
      tunnelWaitMs: 1000,
    },
  };
  const agent = new KanalAgent(options);
  t.teardown(() => agent.stop(0));
  const leaseLists = (): number => k.api.requests.filter((r) => r.resource === 'leases' && r.verb === 'list').length;
  return { agent, logs, k, kubeconfig, nodePort, leaseLists };
}

/** Whether something accepts TCP connections on NODE_ADDRESS:port. */
function listening(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const s = net.connect(port, NODE_ADDRESS);
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => resolve(false));
  });
}

test('the lifecycle allows only forward moves, and stopped is final', (t) => {
  const life = new StateMachine<AgentLife>('created', AGENT_LIFECYCLE);
  t.throws(() => life.to('running'), { message: 'kanal agent: no transition from created to running' });
  life.to({ kind: 'starting', started: Promise.resolve() });
  t.throws(() => life.to('created'), { message: 'kanal agent: no transition from starting to created' });
  life.to('running');
  t.throws(() => life.to('stopped'), { message: 'kanal agent: no transition from running to stopped' });
  life.to({ kind: 'stopping', stopped: Promise.resolve() });
  life.to('stopped');
  for (const next of ['created', 'running', 'stopped'] as const) t.false(life.canMove(next));
});

test('a second start() is refused before it makes anything: no second lease counter, no second host interface', async (t) => {
  const f = await agentWithParts(t);
  await f.agent.start();
  t.is(f.agent.state, 'running');
  await waitFor(() => f.leaseLists() === 1, 'the lease counter to list the leases', 10_000);
  t.is(f.logs.matching(HOST_INTERFACE_UP).length, 1);
  // A second lease counter would read the kubeconfig first: gone, it would fail on that instead.
  fs.rmSync(f.kubeconfig);
  await t.throwsAsync(f.agent.start(), { message: 'the agent cannot start when running' });
  t.is(f.agent.state, 'running');
  t.is(f.logs.matching(HOST_INTERFACE_UP).length, 1, 'one host interface set up');
  t.true(await listening(f.nodePort), 'the first start still serves the node listener');
  await f.agent.stop(0);
  t.is(f.agent.state, 'stopped');
  t.is(f.leaseLists(), 1, 'one lease counter listed the leases');
  t.false(await listening(f.nodePort), 'the node listener closed');
  await t.throwsAsync(f.agent.start(), { message: 'the agent cannot start when stopped' });
});

test('stop() before start(): stopped, nothing made, and it cannot start after', async (t) => {
  const f = await agentWithParts(t);
  await f.agent.stop(0);
  t.is(f.agent.state, 'stopped');
  await t.throwsAsync(f.agent.start(), { message: 'the agent cannot start when stopped' });
  t.is(f.leaseLists(), 0, 'no lease counter');
  t.is(f.logs.matching(HOST_INTERFACE_UP).length, 0, 'no host interface');
  t.is(f.agent.tunnels.snapshot().state, 'stopped', 'the tunnels cannot start either');
  t.false(await listening(f.nodePort));
});

test('stop() during start() waits for it, then stops what it made: nothing left running', async (t) => {
  const f = await agentWithParts(t);
  const starting = f.agent.start();
  t.is(f.agent.state, 'starting');
  const stopping = f.agent.stop(0);
  await starting;
  await stopping;
  t.is(f.agent.state, 'stopped');
  t.is(f.agent.tunnels.snapshot().state, 'stopped');
  t.is(f.logs.matching(HOST_INTERFACE_UP).length, 1, 'start() ran to its end');
  t.false(await listening(f.nodePort), 'the node listener closed');
  t.is(f.agent.tunnels.tunnels().length, 0);
});

test('stop() twice is one stop: the second waits for the first, and a third after it returns at once', async (t) => {
  const f = await agentWithParts(t);
  await f.agent.start();
  const first = f.agent.stop(0);
  t.is(f.agent.state, 'stopping');
  const second = f.agent.stop(0);
  await Promise.all([first, second]);
  t.is(f.agent.state, 'stopped');
  await f.agent.stop(0);
  t.is(f.agent.state, 'stopped');
  const moves = f.logs.matching('agent state').map((l) => `${String(l.from)}->${String(l.to)}`);
  t.deepEqual(moves, ['created->starting', 'starting->running', 'running->stopping', 'stopping->stopped']);
});

test('a start() that fails releases what it made and ends stopped', async (t) => {
  const f = await agentWithParts(t);
  fs.rmSync(f.kubeconfig);
  await t.throwsAsync(f.agent.start());
  t.is(f.agent.state, 'stopped');
  t.is(f.leaseLists(), 0);
  await f.agent.stop(0);
  await t.throwsAsync(f.agent.start(), { message: 'the agent cannot start when stopped' });
});
