/**
 * Upstream Konnectivity's own binaries (`../shared/upstream/`, see its README:
 * proxy-server, proxy-agent, proxy-test-client of v0.36.0) as real peers:
 * unpacked once per test process into a temp dir, run as child processes with
 * their klog output in the workspace, stopped by pid through the Scope.
 *
 * Tests that use them skip with {@link upstreamUnavailableReason} when the
 * archive is absent (a user's fresh clone has no `../shared`).
 * KANAL_UPSTREAM_DIR names a directory that already holds the binaries.
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import { removeOnExit } from '../../kit/launch/exit-cleanup.js';
import { Child } from '../../kit/launch/child.js';
import { freePort, waitHealthy, withPortRetry, type Scope, type Workspace } from './kanal-processes.js';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const SHARED_UPSTREAM = path.resolve(REPO_ROOT, '..', 'shared', 'upstream');
const ARCHIVE = 'upstream-v0.36.0.tar.xz';
const BINARIES = ['proxy-server', 'proxy-agent', 'proxy-test-client'] as const;

export const UPSTREAM_VERSION = 'v0.36.0';

export interface UpstreamBinaries {
  dir: string;
  proxyServer: string;
  proxyAgent: string;
  testClient: string;
}

function presetDir(): string | undefined {
  const dir = process.env.KANAL_UPSTREAM_DIR;
  return dir && BINARIES.every((b) => fs.existsSync(path.join(dir, b))) ? dir : undefined;
}

/** Why upstream's binaries cannot be used here, or undefined when they can. */
export function upstreamUnavailableReason(): string | undefined {
  if (presetDir()) return undefined;
  if (!fs.existsSync(path.join(SHARED_UPSTREAM, ARCHIVE))) {
    return `upstream Konnectivity binaries not found (${path.join(SHARED_UPSTREAM, ARCHIVE)} is absent; set KANAL_UPSTREAM_DIR to a directory holding proxy-server, proxy-agent and proxy-test-client)`;
  }
  if (process.platform !== 'linux' || process.arch !== 'x64')
    return `upstream binaries are linux/amd64; this is ${process.platform}/${process.arch}`;
  return undefined;
}

let unpacked: UpstreamBinaries | undefined;

/** Unpacks the binaries once per process (synchronously: ~1 s) and returns their paths. */
export function upstreamBinaries(): UpstreamBinaries {
  if (unpacked) return unpacked;
  const reason = upstreamUnavailableReason();
  if (reason) throw new Error(reason);
  let dir = presetDir();
  if (!dir) {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kanal-upstream-'));
    removeOnExit.add(dir);
    execFileSync('bash', [path.join(SHARED_UPSTREAM, 'unpack.sh'), dir], { stdio: 'ignore', timeout: 60_000 });
  }
  unpacked = {
    dir,
    proxyServer: path.join(dir, 'proxy-server'),
    proxyAgent: path.join(dir, 'proxy-agent'),
    testClient: path.join(dir, 'proxy-test-client'),
  };
  return unpacked;
}

// ---------- processes ----------

/** An upstream binary as a kit child (kit/launch/child.ts): its klog text is matched with waitForLog(/pattern/). */
export type UpstreamProcess = Child;

/** Runs `file args` with stdout and stderr appended to logFile; killed by pid when the scope ends. */
export function spawnUpstream(scope: Scope, name: string, file: string, args: string[], logFile: string): UpstreamProcess {
  const proc = new Child({ name, argv: [file, ...args], logFile });
  // Upstream's agent only drains on its first SIGTERM; end it for good.
  scope.teardown(() => proc.kill());
  return proc;
}

export interface UpstreamServerSpec {
  /** Upstream's --mode (default grpc, upstream's own default). */
  mode?: 'grpc' | 'http-connect';
  /** Frontend on a Unix socket in the workspace (default) or mTLS TCP on 127.0.0.1. */
  frontend?: 'uds' | 'tcp';
  serverCount?: number;
  /** Verify agents' client certificates (--cluster-ca-cert; default true). Upstream refuses it with token authentication. */
  agentClientCa?: boolean;
  /** klog verbosity (default 1: -v 4, upstream's default, logs every packet). */
  verbosity?: number;
  extraArgs?: string[];
  name?: string;
}

export interface UpstreamServerProcess extends UpstreamProcess {
  readonly agentPort: number;
  readonly healthPort: number;
  readonly adminPort: number;
  /** Frontend Unix socket ('' with a TCP frontend). */
  readonly uds: string;
  /** Frontend TCP port (0 with a Unix socket). */
  readonly frontendPort: number;
  readonly serverID: string;
}

/**
 * Ends a start that failed (it may still run, e.g. with its health port bound
 * and another port taken) before withPortRetry starts another, so that no
 * abandoned copy keeps a port or a tunnel; then rethrows.
 */
async function abandon(proc: UpstreamProcess, err: unknown, after?: () => void): Promise<never> {
  await proc.kill();
  after?.();
  throw err;
}

/**
 * Upstream's proxy-server with the workspace's PKI: mTLS agent port, frontend
 * on a Unix socket or mTLS TCP. On fresh freePort() ports per attempt
 * (withPortRetry): the returned ports are those of the attempt that started.
 */
export async function startUpstreamServer(scope: Scope, ws: Workspace, spec: UpstreamServerSpec = {}): Promise<UpstreamServerProcess> {
  const bin = upstreamBinaries();
  const name = spec.name ?? 'upstream-server';
  return withPortRetry(() => startUpstreamServerOnce(scope, ws, bin, name, spec));
}

async function startUpstreamServerOnce(
  scope: Scope,
  ws: Workspace,
  bin: UpstreamBinaries,
  name: string,
  spec: UpstreamServerSpec,
): Promise<UpstreamServerProcess> {
  const { pki } = ws;
  const [agentPort, healthPort, adminPort] = [await freePort(), await freePort(), await freePort()];
  const args = [
    `--mode=${spec.mode ?? 'grpc'}`,
    `--server-id=${name}`,
    `--server-count=${spec.serverCount ?? 1}`,
    `--cluster-cert=${pki.serverCert}`,
    `--cluster-key=${pki.serverKey}`,
    ...(spec.agentClientCa === false ? [] : [`--cluster-ca-cert=${pki.caCert}`]),
    '--agent-bind-address=127.0.0.1',
    `--agent-port=${agentPort}`,
    '--health-bind-address=127.0.0.1',
    `--health-port=${healthPort}`,
    '--admin-bind-address=127.0.0.1',
    `--admin-port=${adminPort}`,
    `--v=${spec.verbosity ?? 1}`,
  ];
  let uds = '';
  let frontendPort = 0;
  if ((spec.frontend ?? 'uds') === 'uds') {
    uds = path.join(ws.dir, `${name}.sock`);
    args.push(`--uds-name=${uds}`, '--server-port=0');
  } else {
    frontendPort = await freePort();
    args.push(
      '--server-bind-address=127.0.0.1',
      `--server-port=${frontendPort}`,
      `--server-cert=${pki.frontendCert}`,
      `--server-key=${pki.frontendKey}`,
      `--server-ca-cert=${pki.frontendCaCert}`,
    );
  }
  args.push(...(spec.extraArgs ?? []));
  const proc = spawnUpstream(scope, name, bin.proxyServer, args, path.join(ws.dir, `${name}.log`));
  await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000).catch(async (err: unknown) => {
    // The next attempt's wait for the socket file below must not see this one's.
    return abandon(proc, err, () => uds && fs.rmSync(uds, { force: true }));
  });
  if (uds) {
    const deadline = Date.now() + 10_000;
    while (!fs.existsSync(uds) && Date.now() < deadline) await sleep(50);
  }
  return Object.assign(proc, { agentPort, healthPort, adminPort, uds, frontendPort, serverID: name });
}

export interface UpstreamAgentSpec {
  /** Names the process, its log and its certificate (CN); announced as --agent-id unless randomAgentID. */
  agentID?: string;
  /** Leave --agent-id out: upstream then announces a random UUID, its default. */
  randomAgentID?: boolean;
  /** Client certificate: its own (default, CN = agentID) or the workspace's shared agent.crt. */
  cert?: 'own' | 'shared';
  verbosity?: number;
  /** Wait until the agent's own /readyz answers 200 (a tunnel is up). Default true. */
  waitReady?: boolean;
  extraArgs?: string[];
}

export interface UpstreamAgentProcess extends UpstreamProcess {
  readonly agentID: string;
  readonly healthPort: number;
  readonly adminPort: number;
  readyzUrl(): string;
}

/**
 * Upstream's proxy-agent dialing `server`'s agent port on 127.0.0.1 (a Kanal
 * or an upstream server), its own ports fresh per attempt (withPortRetry).
 */
export async function startUpstreamAgent(
  scope: Scope,
  ws: Workspace,
  server: { agentPort: number },
  spec: UpstreamAgentSpec = {},
): Promise<UpstreamAgentProcess> {
  const bin = upstreamBinaries();
  const agentID = spec.agentID ?? 'upstream-agent';
  const { pki } = ws;
  const cred = (spec.cert ?? 'own') === 'own' ? await issueAgentCertificate(pki, agentID) : { cert: pki.agentCert, key: pki.agentKey };
  return withPortRetry(() => startUpstreamAgentOnce(scope, ws, bin, server, agentID, cred, spec));
}

async function startUpstreamAgentOnce(
  scope: Scope,
  ws: Workspace,
  bin: UpstreamBinaries,
  server: { agentPort: number },
  agentID: string,
  cred: { cert: string; key: string },
  spec: UpstreamAgentSpec,
): Promise<UpstreamAgentProcess> {
  const { pki } = ws;
  const [healthPort, adminPort] = [await freePort(), await freePort()];
  const args = [
    '--proxy-server-host=127.0.0.1',
    `--proxy-server-port=${server.agentPort}`,
    `--ca-cert=${pki.caCert}`,
    `--agent-cert=${cred.cert}`,
    `--agent-key=${cred.key}`,
    ...(spec.randomAgentID ? [] : [`--agent-id=${agentID}`]),
    '--health-server-host=127.0.0.1',
    `--health-server-port=${healthPort}`,
    '--admin-bind-address=127.0.0.1',
    `--admin-server-port=${adminPort}`,
    '--sync-interval=200ms',
    '--sync-interval-cap=1s',
    `--v=${spec.verbosity ?? 1}`,
    ...(spec.extraArgs ?? []),
  ];
  const proc = spawnUpstream(scope, agentID, bin.proxyAgent, args, path.join(ws.dir, `${agentID}.log`));
  const readyzUrl = (): string => `http://127.0.0.1:${healthPort}/readyz`;
  try {
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    // Also through waitHealthy: it fails at once, naming the log, if the agent ends while not ready.
    if (spec.waitReady ?? true) await waitHealthy(proc, readyzUrl(), 20_000);
  } catch (err) {
    return abandon(proc, err);
  }
  return Object.assign(proc, { agentID, healthPort, adminPort, readyzUrl });
}

// ---------- the konnectivity-client (proxy-test-client) ----------

export interface TestClientResult {
  /** Exit code (null when killed at the timeout). */
  code: number | null;
  /** The response body it logged, or undefined when it logged none. */
  body: Buffer | undefined;
  /** Its log, without the body. */
  log: string;
}

/**
 * Runs upstream's proxy-test-client, which fetches http://host:port/path
 * through a server's Unix-socket frontend with the konnectivity-client
 * library exactly as the kube-apiserver does (--mode grpc), or with HTTP
 * CONNECT, reads the whole body and logs it at -v=4. `bodyBytes` is the
 * length of the body expected (it is cut out of the log).
 */
export async function runUpstreamTestClient(
  ws: Workspace,
  opts: { mode: 'grpc' | 'http-connect'; uds: string; host: string; port: number; path: string; bodyBytes: number; timeoutMs: number },
): Promise<TestClientResult> {
  const bin = upstreamBinaries();
  const logFile = path.join(ws.dir, `test-client-${Date.now()}-${Math.floor(Math.random() * 1e6)}.log`);
  // The client closes its tunnel on *any* signal it receives (signal.Notify
  // without a list), Go's own SIGURG preemption signals included, which cut
  // long transfers; asyncpreemptoff stops the runtime from sending them.
  const child = new Child({
    name: 'test-client',
    argv: [
      bin.testClient,
      `--mode=${opts.mode}`,
      `--proxy-uds=${opts.uds}`,
      '--proxy-host=',
      '--proxy-port=0',
      `--request-host=${opts.host}`,
      `--request-port=${opts.port}`,
      `--request-path=${opts.path}`,
      '--v=4',
    ],
    logFile,
    env: { ...process.env, GODEBUG: 'asyncpreemptoff=1' },
  });
  const timer = setTimeout(() => child.signal('SIGKILL'), opts.timeoutMs);
  const { code } = await child.exited;
  clearTimeout(timer);
  const text = fs.readFileSync(logFile);
  fs.rmSync(logFile, { force: true });
  const marker = text.indexOf('HTML Response:\n');
  if (marker < 0) return { code, body: undefined, log: text.toString('utf8') };
  const start = marker + 'HTML Response:\n'.length;
  const body = text.subarray(start, Math.min(text.length, start + opts.bodyBytes));
  return { code, body, log: Buffer.concat([text.subarray(0, start), text.subarray(start + body.length)]).toString('utf8') };
}
