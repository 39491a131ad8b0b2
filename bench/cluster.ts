/** Starting the real `kanal` CLI (server and agent) and the bench workers as child processes. */
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  KANAL_CLI as CLI,
  freePort,
  loopbackAgentArgs,
  loopbackServerArgs,
  readyOrStopped,
  waitHealthy,
  withPortRetry,
} from '../kit/launch/kanal-cli.js';
import { issueAgentCertificate, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import { spawnChild, type Child } from './children.js';
import { RUNTIME_FLAGS } from '../src/cli/runtime-flags.js';
import { Worker } from './rpc.js';
import type { BackendPorts, LoadgenCommands, Product } from './loadgen-protocol.js';
import type { SwarmCommands } from './agent-swarm.js';
import type { HostileCommands } from './hostile-agent.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const LOADGEN_SCRIPT = path.join(HERE, 'loadgen.js');
export const SWARM_SCRIPT = path.join(HERE, 'agent-swarm.js');
export const HOSTILE_SCRIPT = path.join(HERE, 'hostile-agent.js');

export const BACKEND_HOST = '127.0.0.1';
export const NODE_HOST = '127.0.0.2';

function httpStatus(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: 1000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', () => resolve({ status: 0, body: '' }));
    req.on('timeout', () => req.destroy());
  });
}

export async function readyDetail(url: string): Promise<string> {
  return (await httpStatus(url)).body.trim();
}

export interface KanalServerProc {
  child: Child;
  /** Milliseconds from spawning the process to its /healthz answering 200. */
  readyMs: number;
  uds: string;
  agentPort: number;
  healthUrl: string;
}

/** A server and one agent connected to it, carrying HTTP CONNECT tunnels from the server's frontend Unix socket. */
export interface TunnelPair {
  product: Product;
  /** The server's HTTP CONNECT frontend. */
  uds: string;
  server: Child;
  agent: Child;
  /** The server's mTLS agent port (127.0.0.1). */
  agentPort: number;
  /** Milliseconds from spawning each process to ready: the server's /healthz, then the agent's /readyz (its tunnel up). */
  readyMs: { server: number; agent: number };
  /** Prometheus metrics of each process (Kanal: the health ports; upstream: the server's admin port, the agent's health port). */
  metricsUrls: { server: string; agent: string };
  stop(): Promise<void>;
}

export interface KanalPair extends TunnelPair {
  product: 'kanal';
  /** Agent's node-side listeners on NODE_HOST, one per backend service. */
  node: { bulk: number; echo: number; http: number };
}

export interface StartOptions {
  dir: string;
  tag: string;
  pki: ThrowawayPki;
  transport: string;
  /** Destinations the server lets agents reach (node -> control plane). */
  allowed?: string[];
  /** Extra node flags, e.g. --cpu-prof. */
  nodeArgs?: string[];
  logLevel?: string;
  /** Server --max-agents-per-credential, for agents that share one certificate (a DaemonSet's). */
  maxAgentsPerCredential?: number;
  /** More `kanal server` flags. */
  serverArgs?: string[];
  /** More `kanal agent` flags (startPair). */
  agentArgs?: string[];
  /** The kanal CLI to run (another build's dist/src/cli/main.js, or a kanal executable, for A/B comparisons); default this checkout's. */
  cli?: string;
  /** --audit: server and agent write their audit logs to files in `dir` (docs/operations.md, "The audit log"). */
  audit?: boolean;
  /** --kanal-workers: the server runs `--workers N` (docs/multi-tenant.md, "Workers of one cluster"). */
  workers?: number;
}

/**
 * How to run `cli`: a .js file with this Node and the V8 flags Kanal always
 * runs with (src/cli/runtime-flags.ts) before `nodeArgs`; anything else (the
 * single executable, which carries those flags) as it is.
 */
export function kanalProgram(
  cli: string | undefined,
  nodeArgs: readonly string[] = [],
): { script: string; nodeArgs: string[] } | { executable: string } {
  if (cli === undefined || cli.endsWith('.js')) return { script: cli ?? CLI, nodeArgs: [...RUNTIME_FLAGS, ...nodeArgs] };
  return { executable: cli };
}

/** On fresh ports for each attempt (withPortRetry): the bench runs inside the test suite too, next to other files' processes. */
export function startServer(o: StartOptions): Promise<KanalServerProc> {
  return withPortRetry(() => startServerOnce(o));
}

async function startServerOnce(o: StartOptions): Promise<KanalServerProc> {
  const [agentPort, healthPort] = await Promise.all([freePort(), freePort()]);
  const uds = path.join(o.dir, `${o.tag}.sock`);
  const args = [
    ...loopbackServerArgs({ pki: o.pki, agentPort, healthPort }),
    '--uds-name',
    uds,
    '--delete-existing-uds-file',
    '--transport',
    o.transport,
    '--log-level',
    o.logLevel ?? 'info',
  ];
  for (const d of o.allowed ?? []) args.push('--allowed-destination', d);
  if (o.maxAgentsPerCredential) args.push('--max-agents-per-credential', String(o.maxAgentsPerCredential));
  if (o.audit) args.push('--audit-log-path', path.join(o.dir, `${o.tag}-server-audit.log`));
  if (o.workers !== undefined) args.push('--workers', String(o.workers));
  args.push(...(o.serverArgs ?? []));
  const t0 = performance.now();
  const child = spawnChild({
    name: `${o.tag}-server`,
    ...kanalProgram(o.cli, o.nodeArgs),
    args,
    logFile: path.join(o.dir, `${o.tag}-server.log`),
  });
  const healthUrl = `http://127.0.0.1:${healthPort}`;
  const readyAt = await readyOrStopped(child, `${healthUrl}/healthz`, 20_000);
  return { child, uds, agentPort, healthUrl, readyMs: readyAt - t0 };
}

/** The pair's agent on fresh ports (its health port and its node-side listeners on NODE_HOST), ready: one attempt of withPortRetry. */
async function startPairAgent(
  o: StartOptions & { backend: BackendPorts },
  server: KanalServerProc,
  agentID: string,
  cred: { cert: string; key: string },
): Promise<{ agent: Child; agentReadyMs: number; ports: { agentHealth: number; bulk: number; echo: number; httpPort: number } }> {
  const b = o.backend;
  const [agentHealth, bulk, echo, httpPort] = await Promise.all([
    freePort(),
    freePort(NODE_HOST),
    freePort(NODE_HOST),
    freePort(NODE_HOST),
  ]);
  const t0 = performance.now();
  const agent = spawnChild({
    name: `${o.tag}-agent`,
    ...kanalProgram(o.cli, o.nodeArgs),
    logFile: path.join(o.dir, `${o.tag}-agent.log`),
    args: [
      ...loopbackAgentArgs({ agentPort: server.agentPort, caCert: o.pki.caCert, credential: cred, agentID, healthPort: agentHealth }),
      '--bind-address',
      NODE_HOST,
      '--bind-interface-type',
      'none',
      '--target',
      `${bulk}:${BACKEND_HOST}:${b.bulkTcp}`,
      '--target',
      `${echo}:${BACKEND_HOST}:${b.echoTcp}`,
      '--target',
      `${httpPort}:${BACKEND_HOST}:${b.httpTcp}`,
      '--transport',
      o.transport,
      '--log-level',
      o.logLevel ?? 'info',
      ...(o.audit ? ['--audit-log-path', path.join(o.dir, `${o.tag}-agent-audit.log`)] : []),
      ...(o.agentArgs ?? []),
    ],
  });
  const agentReadyMs = (await readyOrStopped(agent, `http://127.0.0.1:${agentHealth}/readyz`, 20_000)) - t0;
  return { agent, agentReadyMs, ports: { agentHealth, bulk, echo, httpPort } };
}

/** A server and one `kanal agent` with node-side listeners for the three backend services. */
export async function startPair(o: StartOptions & { backend: BackendPorts }): Promise<KanalPair> {
  const b = o.backend;
  const server = await startServer({ ...o, allowed: [b.bulkTcp, b.echoTcp, b.httpTcp].map((p) => `${BACKEND_HOST}:${p}`) });
  const agentID = `${o.tag}-node`;
  const cred = await issueAgentCertificate(o.pki, agentID);
  const { agent, agentReadyMs, ports } = await withPortRetry(() => startPairAgent(o, server, agentID, cred));
  await waitHealthy(server.child, `${server.healthUrl}/readyz`, 20_000);
  return {
    product: 'kanal',
    readyMs: { server: server.readyMs, agent: agentReadyMs },
    uds: server.uds,
    server: server.child,
    agent,
    agentPort: server.agentPort,
    metricsUrls: { server: `${server.healthUrl}/metrics`, agent: `http://127.0.0.1:${ports.agentHealth}/metrics` },
    node: { bulk: ports.bulk, echo: ports.echo, http: ports.httpPort },
    async stop() {
      await agent.stop();
      await server.child.stop();
    },
  };
}

export function startLoadgen(dir: string, name: string): Worker<LoadgenCommands> {
  return new Worker<LoadgenCommands>(spawnChild({ name, script: LOADGEN_SCRIPT, logFile: path.join(dir, `${name}.log`), ipc: true }));
}

export function startSwarm(dir: string, name: string): Worker<SwarmCommands> {
  return new Worker<SwarmCommands>(spawnChild({ name, script: SWARM_SCRIPT, logFile: path.join(dir, `${name}.log`), ipc: true }));
}

export function startHostile(dir: string, name: string): Worker<HostileCommands> {
  return new Worker<HostileCommands>(spawnChild({ name, script: HOSTILE_SCRIPT, logFile: path.join(dir, `${name}.log`), ipc: true }));
}

export function readPem(file: string): string {
  return fs.readFileSync(file, 'utf8');
}
