/**
 * `kanal server` and `kanal agent` as CLI children of a test: loopback ports,
 * the workspace's throwaway certificates, readiness waits, one log file each,
 * stopped by the scope (kit/launch/kanal-cli.ts starts them).
 */
import path from 'node:path';
import { issueAgentCertificate } from '../../kit/pki/throwaway-pki.js';
import type { Child } from '../../kit/launch/child.js';
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import { freePort, loopbackServerArgs, runKanal, spawnKanal, waitHealthy, withPortRetry } from '../../kit/launch/kanal-cli.js';
import { run, type RunResult } from '../../kit/launch/run-to-end.js';
import type { Workspace } from './workspace.js';

export interface ServerSpec {
  /** Frontend: a Unix socket in the workspace (default) or mTLS TCP on 127.0.0.1. */
  frontend?: 'uds' | 'tcp';
  /** More flags, e.g. ['--backend-dial-timeout', '500ms']. */
  extraArgs?: string[];
  name?: string;
  /** Runs the server under this open-files limit (prlimit). */
  openFilesLimit?: number;
  /** The server's umask (default: the test process's). */
  umask?: number;
  /** Pass --cluster-ca-cert (default true); false for token authentication alone. */
  clusterCa?: boolean;
}

export interface KanalServerProcess extends Child {
  readonly agentPort: number;
  readonly healthPort: number;
  /** Admin port (/metrics, profiles) on 127.0.0.1; its own free port so parallel servers never share upstream's 8095. */
  readonly adminPort: number;
  /** TCP frontend port (0 with a Unix socket). */
  readonly frontendPort: number;
  /** Unix socket path ('' with a TCP frontend). */
  readonly uds: string;
  readonly args: readonly string[];
  readyzUrl: () => string;
}

export async function startServer(scope: Scope, ws: Workspace, spec: ServerSpec = {}): Promise<KanalServerProcess> {
  const name = spec.name ?? 'server';
  const { pki } = ws;
  return withPortRetry(async () => {
    const [agentPort, healthPort, adminPort] = [await freePort(), await freePort(), await freePort()];
    const args = [
      ...loopbackServerArgs({ pki, agentPort, healthPort, clusterCa: spec.clusterCa }),
      '--admin-port',
      String(adminPort),
      '--server-id',
      name,
      '--log-level',
      'debug',
    ];
    let uds = '';
    let frontendPort = 0;
    if ((spec.frontend ?? 'uds') === 'uds') {
      uds = path.join(ws.dir, `${name}.sock`);
      args.push('--uds-name', uds, '--delete-existing-uds-file');
    } else {
      frontendPort = await freePort();
      args.push(
        '--server-bind-address',
        '127.0.0.1',
        '--server-port',
        String(frontendPort),
        '--server-cert',
        pki.frontendCert,
        '--server-key',
        pki.frontendKey,
        '--server-ca-cert',
        pki.frontendCaCert,
      );
    }
    args.push(...(spec.extraArgs ?? []));
    const wrapper = spec.openFilesLimit ? ['prlimit', `--nofile=${spec.openFilesLimit}:${spec.openFilesLimit}`, '--'] : [];
    const proc = spawnKanal(scope, { name, args, logFile: path.join(ws.dir, `${name}.log`), wrapper, umask: spec.umask });
    // /healthz answers once every listener is up (the health port opens last).
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    return Object.assign(proc, {
      agentPort,
      healthPort,
      adminPort,
      frontendPort,
      uds,
      args,
      readyzUrl: () => `http://127.0.0.1:${healthPort}/readyz`,
    });
  });
}

/** Starts the same server again (same flags, ports and log file) after it stopped. */
export async function restartServer(scope: Scope, old: KanalServerProcess): Promise<KanalServerProcess> {
  if (old.running()) throw new Error(`${old.name} is still running`);
  const proc = spawnKanal(scope, { name: old.name, args: [...old.args], logFile: old.logFile });
  // Same ports by design, so no withPortRetry: one another process took meanwhile fails here, as waitHealthy
  // says (EADDRINUSE, with the log's "cannot listen on <address> (<flags>) ... another process listens there").
  await waitHealthy(proc, `http://127.0.0.1:${old.healthPort}/healthz`, 20_000);
  const { agentPort, healthPort, adminPort, frontendPort, uds, args, readyzUrl } = old;
  return Object.assign(proc, { agentPort, healthPort, adminPort, frontendPort, uds, args, readyzUrl });
}

export interface AgentSpec {
  agentID?: string;
  /**
   * Client certificate: the agent's own (default: CN = its agentID, as each
   * node holds its own), the workspace's one shared agent.crt, one from
   * another CA, or none at all.
   */
  cert?: 'good' | 'shared' | 'rogue' | 'none';
  extraArgs?: string[];
  /** Wait for the agent's /readyz (a tunnel is up). Default true. */
  waitReady?: boolean;
}

export interface KanalAgentProcess extends Child {
  readonly agentID: string;
  readonly healthPort: number;
  /** Admin port on 127.0.0.1 (its own free port, never upstream's 8094). */
  readonly adminPort: number;
  readyzUrl: () => string;
}

/** `server` is any server with an agent port on 127.0.0.1 (a Kanal server, or another gRPC peer). */
export async function startAgent(
  scope: Scope,
  ws: Workspace,
  server: Pick<KanalServerProcess, 'agentPort'>,
  spec: AgentSpec = {},
): Promise<KanalAgentProcess> {
  const agentID = spec.agentID ?? 'agent-1';
  const { pki } = ws;
  return withPortRetry(async () => {
    const [healthPort, adminPort] = [await freePort(), await freePort()];
    const args = [
      'agent',
      '--proxy-server-host',
      '127.0.0.1',
      '--proxy-server-port',
      String(server.agentPort),
      '--ca-cert',
      pki.caCert,
      '--agent-id',
      agentID,
      '--health-bind-address',
      '127.0.0.1',
      '--health-server-port',
      String(healthPort),
      '--admin-server-port',
      String(adminPort),
      '--sync-interval',
      '200ms',
      '--sync-interval-cap',
      '1s',
      '--shutdown-grace-period',
      '1s',
      '--log-level',
      'debug',
    ];
    const cert = spec.cert ?? 'good';
    if (cert === 'good') {
      const own = await issueAgentCertificate(pki, agentID);
      args.push('--agent-cert', own.cert, '--agent-key', own.key);
    }
    if (cert === 'shared') args.push('--agent-cert', pki.agentCert, '--agent-key', pki.agentKey);
    if (cert === 'rogue') args.push('--agent-cert', pki.rogueAgentCert, '--agent-key', pki.rogueAgentKey);
    args.push(...(spec.extraArgs ?? []));
    const proc = spawnKanal(scope, { name: agentID, args, logFile: path.join(ws.dir, `${agentID}.log`) });
    const readyzUrl = (): string => `http://127.0.0.1:${healthPort}/readyz`;
    // Up first (health port open), then ready (a tunnel is up) if asked.
    await waitHealthy(proc, `http://127.0.0.1:${healthPort}/healthz`, 20_000);
    if (spec.waitReady ?? true) await waitHealthy(proc, readyzUrl(), 20_000);
    return Object.assign(proc, { agentID, healthPort, adminPort, readyzUrl });
  });
}

// ---------- the real CLI, one-shot ----------

export type CliResult = RunResult;

/** Runs `kanal ...args` to completion (bounded by timeoutMs). */
export function runCli(args: string[], timeoutMs = 20_000): Promise<CliResult> {
  return runKanal(args, { timeoutMs });
}

/** Runs /usr/bin/curl with a clean proxy environment (bounded by timeoutMs). */
export function runCurl(args: string[], timeoutMs = 30_000): Promise<CliResult> {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!/proxy/i.test(k)) env[k] = v;
  return run('/usr/bin/curl', args, { timeoutMs, env });
}
