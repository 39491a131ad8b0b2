/**
 * The end-to-end setup most tests begin with: a `kanal server` child with
 * its agents connected and ready (kanal-children.ts), in a workspace of its
 * own or one the test shares. Everything is stopped by the scope.
 */
import type { Scope } from '../../kit/launch/cleanup-scope.js';
import {
  startAgent,
  startServer,
  type AgentSpec,
  type KanalAgentProcess,
  type KanalServerProcess,
  type ServerSpec,
} from './kanal-children.js';
import { waitMetrics, waitStatus } from './probes.js';
import { makeWorkspace, type Workspace } from './workspace.js';

/**
 * When the proxy counts as ready: the server's /readyz answers 200 (it holds
 * an agent), the server counts every agent started (kanal_server_agents), or
 * no more than each agent's own /readyz (startAgent waits for it).
 */
export type ProxyReadiness = 'server-ready' | 'every-agent' | 'agents-ready';

export interface ProxySpec {
  /** Default: a new workspace on the scope. */
  ws?: Workspace;
  server?: ServerSpec;
  /** Started one after another, in this order; default one agent with AgentSpec's defaults. */
  agents?: readonly [AgentSpec, ...AgentSpec[]];
  /** Default 'server-ready'. */
  ready?: ProxyReadiness;
}

export interface Proxy {
  ws: Workspace;
  server: KanalServerProcess;
  /** The first agent of `agents`. */
  agent: KanalAgentProcess;
  agents: KanalAgentProcess[];
}

/** How long the server may take to see agents that are already up. */
const SERVER_SEES_AGENTS_MS = 10_000;

export async function startProxy(scope: Scope, spec: ProxySpec = {}): Promise<Proxy> {
  const ws = spec.ws ?? (await makeWorkspace(scope));
  const server = await startServer(scope, ws, spec.server);
  const agents: KanalAgentProcess[] = [];
  for (const agentSpec of spec.agents ?? [{}]) agents.push(await startAgent(scope, ws, server, agentSpec));
  const ready = spec.ready ?? 'server-ready';
  if (ready === 'server-ready') await waitStatus(server.readyzUrl(), 200, SERVER_SEES_AGENTS_MS);
  if (ready === 'every-agent') await waitMetrics(server.healthPort, { kanal_server_agents: agents.length }, SERVER_SEES_AGENTS_MS);
  return { ws, server, agent: agents[0], agents };
}

/** Server plus one connected agent, both ready, in `ws`. */
export async function startPair(
  scope: Scope,
  ws: Workspace,
  spec: { server?: ServerSpec; agent?: AgentSpec } = {},
): Promise<{ server: KanalServerProcess; agent: KanalAgentProcess }> {
  const { server, agent } = await startProxy(scope, { ws, server: spec.server, agents: [spec.agent ?? {}] });
  return { server, agent };
}
