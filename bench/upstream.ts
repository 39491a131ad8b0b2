/**
 * Upstream Konnectivity (kubernetes-sigs/apiserver-network-proxy) in the
 * bench's topology: its proxy-server with the HTTP CONNECT frontend on a Unix
 * socket (`--mode http-connect`) and the mTLS agent port, and its proxy-agent,
 * both at `--v=1` (the default `-v=4` logs every packet). The binaries come
 * from `--upstream DIR`, KANAL_UPSTREAM_DIR, or `../shared/upstream/` beside
 * the checkout (unpacked into the run's temp dir with its unpack.sh).
 */
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { freePort, readyOrStopped, waitHealthy, withPortRetry } from '../kit/launch/kanal-cli.js';
import { issueAgentCertificate, type ThrowawayPki } from '../kit/pki/throwaway-pki.js';
import { spawnChild, type Child } from './children.js';
import type { TunnelPair } from './cluster.js';

const REPO_ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const SHARED_UPSTREAM = path.resolve(REPO_ROOT, '..', 'shared', 'upstream');
const BINARIES = ['proxy-server', 'proxy-agent'] as const;

export interface UpstreamBinaries {
  proxyServer: string;
  proxyAgent: string;
  /** Where they came from, for the report (e.g. "v0.36.0 from …/upstream-v0.36.0.tar.xz"). */
  origin: string;
}

/** The binaries to run, or why there are none. */
export type UpstreamChoice = { binaries: UpstreamBinaries } | { absent: string };

function inDir(dir: string, origin: string): UpstreamBinaries {
  return { proxyServer: path.join(dir, 'proxy-server'), proxyAgent: path.join(dir, 'proxy-agent'), origin };
}

function missingIn(dir: string): string[] {
  return BINARIES.filter((b) => !fs.existsSync(path.join(dir, b)));
}

/** What is wrong with --upstream's value, or undefined when nothing is. */
export function upstreamOptionProblem(option: string): string | undefined {
  if (option === 'none') return undefined;
  const missing = missingIn(option);
  return missing.length > 0 ? `--upstream ${option}: ${missing.join(' and ')} not found there (or pass --upstream none)` : undefined;
}

/**
 * `option` is the value of --upstream: undefined (find them), "none" (do not
 * run upstream) or a directory holding proxy-server and proxy-agent.
 */
export function findUpstream(option: string | undefined, tempDir: string): UpstreamChoice {
  if (option === 'none') return { absent: 'not run (--upstream none)' };
  if (option !== undefined) {
    const problem = upstreamOptionProblem(option);
    if (problem) throw new Error(problem);
    return { binaries: inDir(option, `binaries from ${option}`) };
  }
  const preset = process.env.KANAL_UPSTREAM_DIR;
  if (preset && missingIn(preset).length === 0) return { binaries: inDir(preset, `binaries from KANAL_UPSTREAM_DIR=${preset}`) };
  const unpack = path.join(SHARED_UPSTREAM, 'unpack.sh');
  const archive = fs.existsSync(SHARED_UPSTREAM)
    ? fs.readdirSync(SHARED_UPSTREAM).find((f) => /^upstream-v.+\.tar\.xz$/.test(f))
    : undefined;
  if (!fs.existsSync(unpack) || !archive) {
    return {
      absent: `upstream binaries not found (${SHARED_UPSTREAM} holds no unpack.sh and upstream-v*.tar.xz; pass --upstream DIR with proxy-server and proxy-agent)`,
    };
  }
  if (process.platform !== 'linux' || process.arch !== 'x64')
    return { absent: `upstream binaries are linux/amd64; this is ${process.platform}/${process.arch}` };
  const dir = path.join(tempDir, 'upstream-bin');
  execFileSync('bash', [unpack, dir], { stdio: 'ignore', timeout: 120_000 });
  const version = /^upstream-(v.+)\.tar\.xz$/.exec(archive)?.[1] ?? '?';
  return { binaries: inDir(dir, `${version} from ${path.join(SHARED_UPSTREAM, archive)}`) };
}

export interface UpstreamServerProc {
  child: Child;
  uds: string;
  agentPort: number;
  healthUrl: string;
  /** Prometheus metrics (admin port). */
  metricsUrl: string;
  /** Milliseconds from spawning the process to its /healthz answering 200. */
  readyMs: number;
}

export interface UpstreamStartOptions {
  dir: string;
  tag: string;
  pki: ThrowawayPki;
  binaries: UpstreamBinaries;
}

/** On fresh ports for each attempt (withPortRetry), as Kanal's servers in cluster.ts. */
export function startUpstreamServer(o: UpstreamStartOptions): Promise<UpstreamServerProc> {
  return withPortRetry(() => startUpstreamServerOnce(o));
}

async function startUpstreamServerOnce(o: UpstreamStartOptions): Promise<UpstreamServerProc> {
  const [agentPort, healthPort, adminPort] = await Promise.all([freePort(), freePort(), freePort()]);
  const uds = path.join(o.dir, `${o.tag}.sock`);
  const t0 = performance.now();
  const child = spawnChild({
    name: `${o.tag}-server`,
    executable: o.binaries.proxyServer,
    logFile: path.join(o.dir, `${o.tag}-server.log`),
    args: [
      '--mode=http-connect',
      `--uds-name=${uds}`,
      '--server-port=0',
      `--server-id=${o.tag}`,
      '--server-count=1',
      `--cluster-cert=${o.pki.serverCert}`,
      `--cluster-key=${o.pki.serverKey}`,
      `--cluster-ca-cert=${o.pki.caCert}`,
      '--agent-bind-address=127.0.0.1',
      `--agent-port=${agentPort}`,
      '--health-bind-address=127.0.0.1',
      `--health-port=${healthPort}`,
      '--admin-bind-address=127.0.0.1',
      `--admin-port=${adminPort}`,
      '--v=1',
    ],
  });
  const healthUrl = `http://127.0.0.1:${healthPort}`;
  const readyAt = await readyOrStopped(child, `${healthUrl}/healthz`, 20_000).catch((err: unknown) => {
    // The next attempt binds the same path, and upstream is not told to replace a socket file.
    fs.rmSync(uds, { force: true });
    throw err;
  });
  return { child, uds, agentPort, healthUrl, metricsUrl: `http://127.0.0.1:${adminPort}/metrics`, readyMs: readyAt - t0 };
}

/** Upstream's proxy-server and one proxy-agent (its own certificate, CN = agentID), ready to carry CONNECT tunnels. */
export async function startUpstreamPair(o: UpstreamStartOptions): Promise<TunnelPair> {
  const server = await startUpstreamServer(o);
  const agentID = `${o.tag}-node`;
  const cred = await issueAgentCertificate(o.pki, agentID);
  const { agent, agentReadyMs, healthPort } = await withPortRetry(() => startUpstreamAgentOnce(o, server, agentID, cred));
  await waitHealthy(server.child, `${server.healthUrl}/readyz`, 20_000);
  return {
    product: 'upstream',
    readyMs: { server: server.readyMs, agent: agentReadyMs },
    uds: server.uds,
    server: server.child,
    agent,
    agentPort: server.agentPort,
    // Upstream's agent serves /metrics on its health port; its admin port has only pprof.
    metricsUrls: { server: server.metricsUrl, agent: `http://127.0.0.1:${healthPort}/metrics` },
    async stop() {
      // Upstream's agent only starts draining on its first SIGTERM.
      await agent.stop('SIGKILL');
      await server.child.stop();
    },
  };
}

/** Upstream's agent of the pair on fresh ports, ready: one attempt of withPortRetry. */
async function startUpstreamAgentOnce(
  o: UpstreamStartOptions,
  server: UpstreamServerProc,
  agentID: string,
  cred: { cert: string; key: string },
): Promise<{ agent: Child; agentReadyMs: number; healthPort: number }> {
  const [healthPort, adminPort] = await Promise.all([freePort(), freePort()]);
  const t0 = performance.now();
  const agent = spawnChild({
    name: `${o.tag}-agent`,
    executable: o.binaries.proxyAgent,
    logFile: path.join(o.dir, `${o.tag}-agent.log`),
    args: [
      '--proxy-server-host=127.0.0.1',
      `--proxy-server-port=${server.agentPort}`,
      `--ca-cert=${o.pki.caCert}`,
      `--agent-cert=${cred.cert}`,
      `--agent-key=${cred.key}`,
      `--agent-id=${agentID}`,
      '--health-server-host=127.0.0.1',
      `--health-server-port=${healthPort}`,
      '--admin-bind-address=127.0.0.1',
      `--admin-server-port=${adminPort}`,
      '--v=1',
    ],
  });
  const agentReadyMs = (await readyOrStopped(agent, `http://127.0.0.1:${healthPort}/readyz`, 20_000)) - t0;
  return { agent, agentReadyMs, healthPort };
}

/** Upstream's own count of connected agents (its ready_backend_connections gauge), NaN when unreadable. */
export async function upstreamAgentCount(server: UpstreamServerProc): Promise<number> {
  try {
    const text = await (await fetch(server.metricsUrl, { signal: AbortSignal.timeout(2000) })).text();
    const m = /^konnectivity_network_proxy_server_ready_backend_connections (\d+)/m.exec(text);
    return m ? Number(m[1]) : Number.NaN;
  } catch {
    return Number.NaN;
  }
}
