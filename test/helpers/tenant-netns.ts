/**
 * A network namespace standing in for "the network where a shared server and
 * its tenants' nodes meet" (docs/multi-tenant.md), for tests with unmodified
 * upstream agents that must reach a tenant by its DNS name:
 *
 *   netns (lo up, /etc/netns/NAME/hosts maps every tenant name to 127.0.0.1)
 *     kanal server   127.0.0.1:AGENT_PORT  (tenants' kube-apiservers: Unix sockets in the workspace)
 *     proxy-agent    --proxy-server-host=<tenant name>  (resolved through the hosts file: SNI = the name)
 *     echo backend   127.0.0.1:ECHO_PORT   (what the agents dial for their tenant's kube-apiserver)
 *     relays         127.0.0.1:P -> Unix socket -> this process -> 127.0.0.1:P of the root namespace
 *                    (for the Kubernetes API stand-ins, which run in the test process)
 *
 * Nothing touches the root namespace's interfaces, addresses or routes: the
 * namespace has only its own loopback, and Unix sockets (which are not per
 * network namespace) carry whatever crosses. `ip netns exec` bind-mounts
 * /etc/netns/NAME/hosts over /etc/hosts for the processes it starts, which is
 * how the Go resolver of upstream's agent finds the tenant names. Everything
 * (processes by pid, relays, the namespace, /etc/netns/NAME) is undone by the
 * scope, and by exit-cleanup as a last resort.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { createNetns, type Netns } from '../../kit/launch/netns.js';
import { Child } from '../../kit/launch/child.js';
import { kanalCommand } from '../../kit/launch/kanal-cli.js';
import { removeOnExit } from '../../kit/launch/exit-cleanup.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';

/** node-topology.js run as a program is the small service process (echo, relay) placed inside a namespace. */
const SERVICES = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node-topology.js');
const ETC_NETNS = '/etc/netns';

/** Namespaces of this process that use /etc/netns; the last one out removes it if this process created it. */
let etcNetnsUsers = 0;
let etcNetnsCreated = false;

export interface TenantNetns {
  readonly name: string;
  readonly ns: Netns;
  /** Starts argv inside the namespace, its output in DIR/<label>.log; stopped by the scope (`kill`: SIGKILL at once). */
  spawn(label: string, argv: readonly string[], opts?: { kill?: boolean; env?: NodeJS.ProcessEnv }): Child;
  /** `kanal ...args` inside the namespace. */
  kanal(label: string, args: readonly string[]): Child;
  /** GET with curl inside the namespace: status (0 when nothing answered) and body. */
  get(url: string, timeoutMs?: number): Promise<{ status: number; body: string }>;
  /** Polls url inside the namespace until it answers `status`; fails early with the log of `proc` if it ends. */
  waitStatus(url: string, status: number, timeoutMs: number, proc?: Child): Promise<string>;
  /** Every Prometheus sample of url (inside the namespace) as `name{labels}` -> value. */
  metrics(url: string): Promise<Map<string, number>>;
  /** An echo server on 127.0.0.1:port inside the namespace. */
  echo(port: number): Promise<Child>;
  /** Makes 127.0.0.1:port of the root namespace reachable as 127.0.0.1:port inside the namespace (TCP relayed byte for byte). */
  reachRootPort(port: number): Promise<void>;
}

/**
 * Creates the namespace with its loopback up and a hosts file mapping each
 * of `names` to 127.0.0.1. `ownSources` are loopback addresses added as /32
 * (inside the namespace only): a connection to one of them then comes FROM
 * it too, so a server tells its peers apart by address (on lo's 127.0.0.0/8
 * alone, every connection comes from 127.0.0.1). The scope undoes it all,
 * processes first.
 */
export async function createTenantNetns(
  scope: Scope,
  dir: string,
  names: readonly string[],
  ownSources: readonly string[] = [],
): Promise<TenantNetns> {
  const ns = await createNetns('kanal-tp');
  const etcDir = path.join(ETC_NETNS, ns.name);
  etcNetnsUsers++;
  // Registered before anything starts in the namespace: teardowns run newest first, so processes stop before this.
  scope.teardown(async () => {
    await ns.destroy();
    fs.rmSync(etcDir, { recursive: true, force: true });
    removeOnExit.delete(etcDir);
    if (--etcNetnsUsers === 0 && etcNetnsCreated) {
      try {
        fs.rmdirSync(ETC_NETNS); // only when empty: another program's entries stay
        etcNetnsCreated = false;
      } catch {
        // not empty, or gone
      }
    }
  });
  const lo = await ns.ip(['link', 'set', 'lo', 'up']);
  if (lo.code !== 0) throw new Error(`lo up in ${ns.name}: ${lo.stderr.trim()}`);
  for (const address of ownSources) {
    const add = await ns.ip(['addr', 'add', `${address}/32`, 'dev', 'lo']);
    if (add.code !== 0) throw new Error(`${address} on lo in ${ns.name}: ${add.stderr.trim()}`);
  }
  if (!fs.existsSync(ETC_NETNS)) {
    fs.mkdirSync(ETC_NETNS, { recursive: true });
    etcNetnsCreated = true;
  }
  fs.mkdirSync(etcDir);
  removeOnExit.add(etcDir);
  fs.writeFileSync(path.join(etcDir, 'hosts'), ['127.0.0.1 localhost', ...names.map((n) => `127.0.0.1 ${n}`), ''].join('\n'));

  const spawn: TenantNetns['spawn'] = (label, argv, opts = {}) => {
    const child = new Child({ name: label, argv, logFile: path.join(dir, `${label}.log`), netns: ns.name, env: opts.env });
    scope.teardown(async () => {
      if (opts.kill) await child.kill();
      else await child.stop('SIGTERM', 5000);
    });
    return child;
  };

  const get: TenantNetns['get'] = async (url, timeoutMs = 3000) => {
    const secs = String(Math.max(1, Math.ceil(timeoutMs / 1000)));
    const r = await ns.exec(['curl', '-sS', '--noproxy', '*', '--max-time', secs, '-w', '\n%{http_code}', url], timeoutMs + 2000);
    const nl = r.stdout.lastIndexOf('\n');
    return { status: Number(r.stdout.slice(nl + 1)) || 0, body: nl >= 0 ? r.stdout.slice(0, nl) : '' };
  };

  const startServices = async (label: string, services: unknown[]): Promise<Child> => {
    const child = spawn(label, [process.execPath, SERVICES, JSON.stringify(services)]);
    await child.waitForLine((l) => l.event === 'ready', 10_000, 'its services listening');
    return child;
  };

  let relays = 0;
  return {
    name: ns.name,
    ns,
    spawn,
    kanal: (label, args) => spawn(label, [...kanalCommand(), ...args]),
    get,
    async waitStatus(url, status, timeoutMs, proc) {
      const deadline = Date.now() + timeoutMs;
      let last = { status: 0, body: '' };
      while (Date.now() < deadline) {
        const ended = proc?.ended();
        if (proc && ended !== undefined) throw new Error(`${proc.name} ${ended} before ${url} answered ${status}; tail:\n${proc.tail(20)}`);
        last = await get(url, 2000);
        if (last.status === status) return last.body;
        await sleep(100);
      }
      throw new Error(
        `${url} in ${ns.name}: wanted ${status}, last ${last.status} ${last.body.trim()}${proc ? `; tail:\n${proc.tail(20)}` : ''}`,
      );
    },
    async metrics(url) {
      const r = await get(url, 5000);
      if (r.status !== 200) throw new Error(`${url} answered ${r.status}`);
      const out = new Map<string, number>();
      for (const line of r.body.split('\n')) {
        if (!line || line.startsWith('#')) continue;
        const cut = line.lastIndexOf(' ');
        out.set(line.slice(0, cut), Number(line.slice(cut + 1)));
      }
      return out;
    },
    echo: (port) => startServices(`echo-${port}`, [{ kind: 'echo', name: 'echo', host: '127.0.0.1', port }]),
    async reachRootPort(port) {
      const sock = path.join(dir, `relay-${++relays}.sock`);
      // Root side: this process, Unix socket -> 127.0.0.1:port.
      const sockets = new Set<net.Socket>();
      const server = net.createServer((down) => {
        const up = net.connect({ host: '127.0.0.1', port });
        for (const s of [down, up]) {
          sockets.add(s);
          s.on('error', () => s.destroy());
          s.once('close', () => sockets.delete(s));
        }
        down.pipe(up);
        up.pipe(down);
        down.once('close', () => up.destroy());
        up.once('close', () => down.destroy());
      });
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(sock, () => resolve());
      });
      scope.teardown(
        () =>
          new Promise<void>((resolve) => {
            for (const s of sockets) s.destroy();
            server.close(() => resolve());
          }),
      );
      // Namespace side: 127.0.0.1:port -> the Unix socket.
      await startServices(`relay-${port}`, [
        { kind: 'relay', name: `root-${port}`, listen: { host: '127.0.0.1', port }, to: { path: sock } },
      ]);
    },
  };
}
