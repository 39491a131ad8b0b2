/**
 * The `kanal` command as a child: where the built CLI is, starting it on a
 * cleanup scope, waiting until its own health listener answers (failing early
 * with its log when it exits), and free loopback ports for its listeners.
 */
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { spawnChild, type Child, type ChildSpec } from './child.js';
import { listenerHolder, type ListenerHolder } from './listener-holder.js';
import type { Scope } from './cleanup-scope.js';
import { run, type RunOptions, type RunResult } from './run-to-end.js';
import { errorMessage } from '../../src/common/error-message.js';
import { RUNTIME_FLAGS } from '../../src/cli/runtime-flags.js';

/** dist/src/cli/main.js (this file runs from dist/kit/launch/). */
export const KANAL_CLI = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../src/cli/main.js');

/**
 * The command line that runs `kanal`: this Node with the V8 flags Kanal always
 * runs with (src/cli/runtime-flags.ts) and `dist/src/cli/main.js`, or the single
 * executable named by KANAL_EXECUTABLE (an absolute path; it carries those
 * flags; see docs/executable.md), so the demo, tests and bench can run either form.
 */
export function kanalCommand(env: NodeJS.ProcessEnv = process.env): readonly string[] {
  const executable = env.KANAL_EXECUTABLE;
  if (executable === undefined || executable === '') return [process.execPath, ...RUNTIME_FLAGS, KANAL_CLI];
  if (!path.isAbsolute(executable)) throw new Error(`KANAL_EXECUTABLE=${executable}: give the executable's absolute path`);
  return [executable];
}

/** The agent-port credentials a loopback server presents and trusts (kit/pki's throwaway PKI has them). */
export interface ServerCredentials {
  serverCert: string;
  serverKey: string;
  caCert: string;
}

/**
 * `kanal server` with the flags every loopback server of the demo, the tests
 * and the bench starts with: its agent-port certificate and the CA it trusts
 * for agents (`clusterCa: false` leaves the CA out), the agent port and the
 * health port on 127.0.0.1. Callers append what makes theirs different.
 */
export function loopbackServerArgs(o: { pki: ServerCredentials; agentPort: number; healthPort: number; clusterCa?: boolean }): string[] {
  return [
    'server',
    '--cluster-cert',
    o.pki.serverCert,
    '--cluster-key',
    o.pki.serverKey,
    ...((o.clusterCa ?? true) ? ['--cluster-ca-cert', o.pki.caCert] : []),
    '--agent-bind-address',
    '127.0.0.1',
    '--agent-port',
    String(o.agentPort),
    '--health-bind-address',
    '127.0.0.1',
    '--health-port',
    String(o.healthPort),
  ];
}

/**
 * `kanal agent` with the flags every loopback agent of the demo and the bench
 * starts with: the server's agent port on 127.0.0.1, the CA it trusts, its
 * client certificate and agentID, its health port on 127.0.0.1. Callers
 * append what makes theirs different (targets, transport, log level).
 */
export function loopbackAgentArgs(o: {
  agentPort: number;
  caCert: string;
  credential: { cert: string; key: string };
  agentID: string;
  healthPort: number;
}): string[] {
  return [
    'agent',
    '--proxy-server-host',
    '127.0.0.1',
    '--proxy-server-port',
    String(o.agentPort),
    '--ca-cert',
    o.caCert,
    '--agent-cert',
    o.credential.cert,
    '--agent-key',
    o.credential.key,
    '--agent-id',
    o.agentID,
    '--health-bind-address',
    '127.0.0.1',
    '--health-server-port',
    String(o.healthPort),
  ];
}

/** A `kanal` child: its name, its command line after `kanal`, its log file, and the rest of a ChildSpec. */
export type KanalChildSpec = Omit<ChildSpec, 'argv'> & { args: readonly string[] };

/** `kanal ...args` as a child the scope stops; its output (the JSON log) goes to `logFile`. */
export function spawnKanal(scope: Scope, { args, ...spec }: KanalChildSpec): Child {
  return spawnChild(scope, { ...spec, argv: [...kanalCommand(), ...args] });
}

/** `kanal ...args` to completion (bounded, never rejects). */
export function runKanal(args: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const [program, ...before] = kanalCommand();
  return run(program, [...before, ...args], opts);
}

/** A port that was free on `host` a moment ago (see withPortRetry). */
export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise<number>((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, host, () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

/** The status of GET url (0 when nothing answers within a second). */
function getStatus(url: string): Promise<number> {
  return new Promise<number>((resolve) => {
    const req = http.get(url, { timeout: 1000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on('error', () => resolve(0));
    req.on('timeout', () => req.destroy());
  });
}

/** A taken port as Node (EADDRINUSE) and Go ("address already in use", upstream's binaries) say it. */
const PORT_TAKEN = /EADDRINUSE|address already in use/;

/**
 * What a readiness wait reads of a child: a kit Child has it all, and a test
 * that must wire a child's stdio itself (a pipe nobody reads) can supply it.
 */
export type ReadinessSubject = Pick<Child, 'name' | 'pid' | 'logFile' | 'ended' | 'ownLog' | 'tail'>;

/** " (EADDRINUSE: its port was taken)" when the child's own output says so (withPortRetry looks for the code), else "". */
function portTaken(child: ReadinessSubject): string {
  return PORT_TAKEN.test(child.ownLog()) ? ' (EADDRINUSE: its port was taken)' : '';
}

function describeOther(holder: ListenerHolder & { kind: 'other' }): string {
  return holder.pids.length > 0 ? `another process (pid ${holder.pids.join(', ')})` : 'another process (its pid not readable)';
}

/**
 * Polls a health URL until it answers 200 from the child's own listener (it or
 * a descendant holds the LISTEN socket: listener-holder.ts), since freePort()'s
 * port may have been taken by another test file's process meanwhile. Fails
 * with the child's log when it ends first, when another process answers and
 * the child logged a taken port (so withPortRetry starts again), or after
 * timeoutMs. Resolves with performance.now() at the accepted answer, before
 * the /proc lookup, so that bench/ times exec -> ready without it.
 */
export async function waitHealthy(child: ReadinessSubject, url: string, timeoutMs: number): Promise<number> {
  const started = Date.now();
  const deadline = started + timeoutMs;
  const { hostname, port, protocol } = new URL(url);
  const portNumber = port === '' ? (protocol === 'https:' ? 443 : 80) : Number(port);
  let answered: Exclude<ListenerHolder, { kind: 'own' }> | undefined;
  while (Date.now() < deadline) {
    const ended = child.ended();
    if (ended !== undefined) {
      throw new Error(`${child.name} ${ended} before ${url} answered${portTaken(child)}; log ${child.logFile}:\n${child.tail()}`);
    }
    if ((await getStatus(url)) === 200) {
      const at = performance.now();
      // /proc names the holder on Linux only; elsewhere the answer is taken as it was before.
      if (process.platform !== 'linux') return at;
      // This process sent the request, so its namespace's view of the port is the one that answered.
      const holder = listenerHolder(hostname, portNumber, child.pid);
      if (holder.kind === 'own') return at;
      answered = holder;
      if (holder.kind === 'other') {
        const taken = portTaken(child);
        if (taken !== '') {
          throw new Error(`${child.name}: ${url} was answered by ${describeOther(holder)}${taken}; log ${child.logFile}:\n${child.tail()}`);
        }
      }
    }
    // Polled finely while a start is still quick (bench/ times exec -> ready through this) and no other process answers.
    await sleep(answered === undefined && Date.now() - started < 3000 ? 5 : 100);
  }
  const by =
    answered === undefined
      ? ''
      : answered.kind === 'other'
        ? ` (the port was answered by ${describeOther(answered)})`
        : ` (it answered 200, but no listener on ${hostname}:${portNumber} was found in /proc/${process.pid}/net)`;
  throw new Error(`${child.name}: ${url} not ready after ${timeoutMs} ms${by}${portTaken(child)}; log ${child.logFile}:\n${child.tail()}`);
}

/**
 * waitHealthy, and a child that did not get ready stopped (it may still run
 * with one port bound and another taken), so that a retry on fresh ports
 * (withPortRetry) leaves nothing of this attempt behind.
 */
export async function readyOrStopped(child: ReadinessSubject & Pick<Child, 'stop'>, url: string, timeoutMs: number): Promise<number> {
  try {
    return await waitHealthy(child, url, timeoutMs);
  } catch (err) {
    await child.stop();
    throw err;
  }
}

/**
 * freePort() only finds a port that was free a moment ago; other test files
 * run at the same time. Retries `start` (with fresh ports) when the process
 * died of EADDRINUSE, a bounded number of times.
 */
export async function withPortRetry<T>(start: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await start();
    } catch (err) {
      if (attempt >= 3 || !/EADDRINUSE/.test(errorMessage(err))) throw err;
    }
  }
}
