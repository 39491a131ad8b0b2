// A two-namespace stand-in for a cluster, for the node -> control plane tests:
//
//   netns "cp"   (kv-cp   CP_ADDR/30)  <--veth-->  (kv-node NODE_ADDR/30)  netns "node"
//
// Both ends of the veth pair are created directly inside the namespaces
// (`ip -n <cp> link add ... peer ... netns <node>`), so nothing is ever added
// to, changed in or removed from the machine's root namespace. Every process
// runs inside one of the namespaces via `ip netns exec` (which execs, so the
// pid we hold is the process itself) and is stopped by pid in teardown before
// the namespaces are deleted.
//
// Run directly (`ip netns exec <ns> node node-topology.js '<json>'`), this
// file is also the small service process the tests place inside a namespace:
// echo servers, connection counters and byte relays between a TCP address in
// the namespace and a Unix socket the test process can reach.

import { randomInt } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { createNetns, destroyAllNetns, type ExecResult, type Netns } from '../../kit/launch/netns.js';
import { Child } from '../../kit/launch/child.js';
import { kanalCommand } from '../../kit/launch/kanal-cli.js';
import { writeThrowawayPki, type ThrowawayPki } from '../../kit/pki/throwaway-pki.js';

/** The kube-apiserver advertise address the agent serves on the node. */
export const ADVERTISE_IP = '10.200.0.1';
export const KAS_PORT = 6443;
export const AGENT_PORT = 8091;
export const SERVER_HEALTH_PORT = 8092;
export const AGENT_HEALTH_PORT = 8093;
export const AGENT_ID = 'node-1';

const SELF = fileURLToPath(import.meta.url);
const HERE = path.dirname(SELF);
export const KAS_STAND_IN = path.join(HERE, 'kas-stand-in.js');

// ------------------------------------------------------------ processes

export type LogLine = Record<string, unknown>;

/** A process running inside a namespace (kit/launch/child.ts); stdout and stderr go to its log file. */
export type NsProcess = Child;

// ------------------------------------------------------------ namespace services

export type Endpoint = { host: string; port: number } | { path: string };

export type Service =
  /** Echoes every byte back; half-close is passed on (end after the peer ended). */
  | { kind: 'echo'; name: string; host: string; port: number }
  /** Accepts, reports {"event":"accepted","name"} and closes. */
  | { kind: 'count'; name: string; host: string; port: number }
  /** Byte relay: every connection to `listen` is piped to `to` (TCP in the namespace, or a Unix socket). */
  | { kind: 'relay'; name: string; listen: Endpoint; to: Endpoint };

// ------------------------------------------------------------ topology

export interface Topology {
  readonly dir: string;
  readonly cp: Netns;
  readonly node: Netns;
  /** Control-plane end of the veth pair. */
  readonly cpAddr: string;
  /** Node end of the veth pair. */
  readonly nodeAddr: string;
  /** Throwaway PKI; server.crt is valid for ADVERTISE_IP and cpAddr. */
  readonly pki: ThrowawayPki;
  /** The server's frontend socket (reachable from the test process: Unix sockets are not per network namespace). */
  readonly uds: string;
  spawn(ns: Netns, label: string, argv: string[], env?: NodeJS.ProcessEnv): NsProcess;
  /** `kanal <args>` inside ns. */
  kanal(ns: Netns, label: string, args: string[]): NsProcess;
  /** Starts service processes inside ns and waits until all listen. */
  services(ns: Netns, label: string, services: Service[]): Promise<NsProcess>;
  /** Starts the KAS stand-in on host:port inside ns (certificate: pki.serverCert). */
  kas(ns: Netns, label: string, host: string, port: number): Promise<NsProcess>;
  /** GET with curl inside ns: status code (0 when no answer) and body. */
  curl(ns: Netns, url: string, extra?: string[], timeoutMs?: number): Promise<{ status: number; body: string; result: ExecResult }>;
  /** Polls url inside ns until it answers 200; returns the body. */
  waitReady(ns: Netns, url: string, timeoutMs: number, proc?: NsProcess): Promise<string>;
  /** A Unix socket path in the test directory, relayed by `services` to a TCP address inside a namespace. */
  socketPath(name: string): string;
  /** Stops every process (by pid), deletes the veth pair and both namespaces, removes dir (kept when keepDir). */
  destroy(keepDir?: boolean): Promise<void>;
}

// Topologies not yet destroyed (their pids and namespaces are also in exit-cleanup).
const liveTopologies = new Set<Topology>();

/** Destroys every topology still alive (processes first), then any namespace left; for test.after.always. */
export async function destroyAllTopologies(): Promise<void> {
  await Promise.allSettled([...liveTopologies].map((t) => t.destroy()));
  await destroyAllNetns();
}

async function must(what: string, r: Promise<ExecResult>): Promise<ExecResult> {
  const res = await r;
  if (res.code !== 0) throw new Error(`${what} failed (exit ${res.code}): ${res.stderr.trim()}`);
  return res;
}

export interface TopologyOptions {
  /** The command line that runs `kanal` (default: kanalCommand(), node with the built CLI or KANAL_EXECUTABLE). */
  kanal?: readonly string[];
}

/**
 * Creates both namespaces and the veth pair between them. Call destroy() in a
 * teardown; on failure here, whatever was created is destroyed before the throw.
 */
export async function createTopology(opts: TopologyOptions = {}): Promise<Topology> {
  const kanalArgv = opts.kanal ?? kanalCommand();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-node-'));
  const procs = new Set<NsProcess>();
  const created: Netns[] = [];
  const subnet = randomInt(0, 256);
  const cpAddr = `10.250.${subnet}.1`;
  const nodeAddr = `10.250.${subnet}.2`;
  let destroyed = false;
  // Set once the topology object exists; destroy() only needs its identity.
  let topoRef: Topology | undefined;

  const destroy = async (keepDir = false): Promise<void> => {
    if (destroyed) return;
    destroyed = true;
    // Agents first (they remove their interface on SIGTERM), then everything else.
    const all = [...procs];
    await Promise.all(all.filter((p) => p.name.startsWith('agent')).map((p) => p.stop('SIGTERM', 8000)));
    await Promise.all(all.map((p) => p.stop('SIGTERM', 5000)));
    for (const ns of created) {
      // Deleting one end of the pair deletes both; the namespaces go next.
      if (ns === created[0]) await ns.ip(['link', 'del', 'kv-cp'], 5000);
      await ns.destroy();
    }
    if (topoRef) liveTopologies.delete(topoRef);
    if (!keepDir) fs.rmSync(dir, { recursive: true, force: true });
  };

  try {
    const cp = await createNetns('kanal-cp');
    created.push(cp);
    const node = await createNetns('kanal-node');
    created.push(node);
    await must('veth pair', cp.ip(['link', 'add', 'kv-cp', 'type', 'veth', 'peer', 'name', 'kv-node', 'netns', node.name]));
    for (const [ns, dev, addr] of [
      [cp, 'kv-cp', cpAddr],
      [node, 'kv-node', nodeAddr],
    ] as const) {
      await must(`lo up in ${ns.name}`, ns.ip(['link', 'set', 'lo', 'up']));
      await must(`address on ${dev}`, ns.ip(['addr', 'add', `${addr}/30`, 'dev', dev]));
      await must(`${dev} up`, ns.ip(['link', 'set', dev, 'up']));
    }
    const pki = await writeThrowawayPki(path.join(dir, 'pki'), { serverIps: [ADVERTISE_IP, cpAddr] });

    const spawnIn = (ns: Netns, label: string, argv: string[], env?: NodeJS.ProcessEnv): NsProcess => {
      if (destroyed) throw new Error('topology already destroyed');
      const p = new Child({ name: label, argv, logFile: path.join(dir, `${label}.log`), netns: ns.name, env });
      procs.add(p);
      return p;
    };

    const curl: Topology['curl'] = async (ns, url, extra = [], timeoutMs = 5000) => {
      const secs = String(Math.max(1, Math.floor(timeoutMs / 1000)));
      const result = await ns.exec(['curl', '-sS', '--max-time', secs, '-w', '\n%{http_code}', ...extra, url], timeoutMs + 2000);
      const nl = result.stdout.lastIndexOf('\n');
      const status = Number(result.stdout.slice(nl + 1)) || 0;
      return { status, body: nl >= 0 ? result.stdout.slice(0, nl) : '', result };
    };

    const topo: Topology = {
      dir,
      cp,
      node,
      cpAddr,
      nodeAddr,
      pki,
      uds: path.join(dir, 'konnectivity.sock'),
      spawn: spawnIn,
      kanal: (ns, label, args) => spawnIn(ns, label, [...kanalArgv, ...args]),
      async services(ns, label, services) {
        const p = spawnIn(ns, label, [process.execPath, SELF, JSON.stringify(services)]);
        await p.waitForLine((l) => l.event === 'ready', 10_000);
        return p;
      },
      async kas(ns, label, host, port) {
        const spec = { host, port, cert: pki.serverCert, key: pki.serverKey, advertise: `${ADVERTISE_IP}:${KAS_PORT}` };
        const p = spawnIn(ns, label, [process.execPath, KAS_STAND_IN, JSON.stringify(spec)]);
        await p.waitForLine((l) => l.event === 'ready', 10_000);
        return p;
      },
      curl,
      async waitReady(ns, url, timeoutMs, proc) {
        const deadline = Date.now() + timeoutMs;
        let last = '';
        while (Date.now() < deadline) {
          if (proc && !proc.running()) throw new Error(`${proc.name} exited before ${url} was ready; log:\n${proc.log()}`);
          const r = await curl(ns, url, [], 2000);
          if (r.status === 200) return r.body;
          last = `${r.status} ${r.body}${r.result.stderr}`.trim();
          await sleep(100);
        }
        throw new Error(`${url} in ${ns.name} not ready after ${timeoutMs} ms (last: ${last})${proc ? `; log:\n${proc.log()}` : ''}`);
      },
      socketPath: (name) => path.join(dir, `${name}.sock`),
      destroy,
    };
    topoRef = topo;
    liveTopologies.add(topo);
    return topo;
  } catch (err) {
    await destroy();
    throw err;
  }
}

// ------------------------------------------------------------ the standard stack

export interface StackOptions {
  /** Extra --allowed-destination entries (CP_ADDR:6443 is always allowed). */
  allowed?: string[];
  /** Extra --target entries (6443:CP_ADDR:6443 is always present). */
  targets?: string[];
  /** --bind-interface-type (default bridge: this kernel has no dummy type). */
  interfaceType?: string;
  agentArgs?: string[];
  serverArgs?: string[];
}

export function serverArgs(topo: Topology, opts: StackOptions = {}): string[] {
  return [
    'server',
    '--server-id',
    'kanal-cp',
    '--uds-name',
    topo.uds,
    '--cluster-cert',
    topo.pki.serverCert,
    '--cluster-key',
    topo.pki.serverKey,
    '--cluster-ca-cert',
    topo.pki.caCert,
    '--agent-bind-address',
    topo.cpAddr,
    '--agent-port',
    String(AGENT_PORT),
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    String(SERVER_HEALTH_PORT),
    '--allowed-destination',
    `${topo.cpAddr}:${KAS_PORT}`,
    ...(opts.allowed ?? []).flatMap((d) => ['--allowed-destination', d]),
    '--log-level',
    'info',
    ...(opts.serverArgs ?? []),
  ];
}

export function agentArgs(topo: Topology, opts: StackOptions = {}): string[] {
  return [
    'agent',
    '--proxy-server-host',
    topo.cpAddr,
    '--proxy-server-port',
    String(AGENT_PORT),
    '--ca-cert',
    topo.pki.caCert,
    '--agent-cert',
    topo.pki.agentCert,
    '--agent-key',
    topo.pki.agentKey,
    '--agent-id',
    AGENT_ID,
    '--health-bind-address',
    '127.0.0.1',
    '--health-server-port',
    String(AGENT_HEALTH_PORT),
    '--bind-address',
    ADVERTISE_IP,
    '--bind-interface',
    'kanal0',
    '--bind-interface-type',
    opts.interfaceType ?? 'bridge',
    '--target',
    `${KAS_PORT}:${topo.cpAddr}:${KAS_PORT}`,
    ...(opts.targets ?? []).flatMap((t) => ['--target', t]),
    '--sync-interval',
    '200ms',
    '--sync-interval-cap',
    '2s',
    '--shutdown-grace-period',
    '2s',
    '--log-level',
    'info',
    ...(opts.agentArgs ?? []),
  ];
}

export async function startServer(topo: Topology, opts: StackOptions = {}, label = 'server'): Promise<NsProcess> {
  const p = topo.kanal(topo.cp, label, serverArgs(topo, opts));
  // /readyz of the server wants an agent; /healthz says it is up and listening.
  await topo.waitReady(topo.cp, `http://127.0.0.1:${SERVER_HEALTH_PORT}/healthz`, 20_000, p);
  return p;
}

/** Starts the agent in the node namespace and waits until /readyz answers 200 (a tunnel is up). */
export async function startAgent(topo: Topology, opts: StackOptions = {}, label = 'agent'): Promise<NsProcess> {
  const p = topo.kanal(topo.node, label, agentArgs(topo, opts));
  await topo.waitReady(topo.node, `http://127.0.0.1:${AGENT_HEALTH_PORT}/readyz`, 20_000, p);
  return p;
}

// ------------------------------------------------------------ `ip -j` views of the node namespace

export interface IpAddrInfo {
  family: string;
  local: string;
  prefixlen: number;
  scope: string;
}

export interface IpLink {
  ifindex: number;
  ifname: string;
  flags: string[];
  operstate?: string;
  linkinfo?: { info_kind?: string };
  addr_info?: IpAddrInfo[];
}

export async function ipLinks(ns: Netns): Promise<IpLink[]> {
  const r = await must(`ip -n ${ns.name} -d -j link show`, ns.ip(['-d', '-j', 'link', 'show']));
  return JSON.parse(r.stdout) as IpLink[];
}

export async function ipAddrs(ns: Netns): Promise<IpLink[]> {
  const r = await must(`ip -n ${ns.name} -j addr show`, ns.ip(['-j', 'addr', 'show']));
  return JSON.parse(r.stdout) as IpLink[];
}

/** Every (interface, address) pair in ns carrying `address`. */
export async function findAddress(ns: Netns, address: string): Promise<{ ifname: string; addr: IpAddrInfo }[]> {
  return (await ipAddrs(ns)).flatMap((l) =>
    (l.addr_info ?? []).filter((a) => a.local === address).map((addr) => ({ ifname: l.ifname, addr })),
  );
}

// ------------------------------------------------------------ service process (runs inside a namespace)

function emit(event: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ time: new Date().toISOString(), ...event })}\n`);
}

function connectTo(to: Endpoint): net.Socket {
  return 'path' in to
    ? net.connect({ path: to.path, allowHalfOpen: true })
    : net.connect({ host: to.host, port: to.port, allowHalfOpen: true });
}

/** Pipes both ways, passes half-close on, and closes one side when the other is gone. */
function relay(down: net.Socket, up: net.Socket): void {
  down.pipe(up);
  up.pipe(down);
  const finish = (side: net.Socket, hadError: boolean): void => {
    if (side.destroyed) return;
    if (hadError || side.writableFinished) {
      side.destroy();
      return;
    }
    side.end();
    side.once('finish', () => side.destroy());
    setTimeout(() => side.destroy(), 5000).unref();
  };
  down.on('error', () => undefined);
  up.on('error', () => undefined);
  down.once('close', (hadError) => finish(up, hadError));
  up.once('close', (hadError) => finish(down, hadError));
}

function listen(server: net.Server, where: Endpoint): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    const done = (): void => {
      server.off('error', reject);
      resolve();
    };
    if ('path' in where) {
      fs.rmSync(where.path, { force: true });
      server.listen(where.path, done);
    } else {
      server.listen({ host: where.host, port: where.port }, done);
    }
  });
}

async function serve(services: Service[]): Promise<void> {
  for (const s of services) {
    let server: net.Server;
    let where: Endpoint;
    switch (s.kind) {
      case 'echo':
        where = { host: s.host, port: s.port };
        server = net.createServer({ allowHalfOpen: true }, (sock) => {
          sock.on('error', () => sock.destroy());
          sock.pipe(sock);
        });
        break;
      case 'count':
        where = { host: s.host, port: s.port };
        server = net.createServer((sock) => {
          emit({ event: 'accepted', name: s.name, peer: `${sock.remoteAddress}:${sock.remotePort}` });
          sock.on('error', () => undefined);
          sock.destroy();
        });
        break;
      case 'relay':
        where = s.listen;
        server = net.createServer({ allowHalfOpen: true }, (down) => relay(down, connectTo(s.to)));
        break;
    }
    await listen(server, where);
    emit({ event: 'listening', name: s.name, kind: s.kind, where });
  }
  emit({ event: 'ready' });
  const bye = (): void => process.exit(0);
  process.on('SIGTERM', bye);
  process.on('SIGINT', bye);
}

if (process.argv[1] && path.resolve(process.argv[1]) === SELF) {
  serve(JSON.parse(process.argv[2] ?? '[]') as Service[]).catch((err: Error) => {
    emit({ event: 'error', message: err.message });
    process.exit(1);
  });
}
