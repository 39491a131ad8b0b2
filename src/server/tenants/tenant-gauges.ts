/**
 * The server's gauges and upstream's lease metrics: registered once per
 * server (a prom-client registry refuses a name twice), each reading the
 * server's parts when scraped (docs/metrics.md).
 */
import type { KanalMetrics } from '../../domain/metrics.js';
import type { UpstreamServerLeaseMetrics } from '../../domain/upstream-metrics.js';
import type { ConnectionBudget } from '../../domain/connection-budget.js';
import type { Tunnel } from '../../tunnel/tunnel.js';
import type { AgentRegistry } from '../agents/agent-registry.js';
import type { ServerLeaseController } from '../leases/lease-controller.js';

/** What the gauges read. */
export interface GaugedParts {
  registry: AgentRegistry;
  frontendTunnels: ReadonlySet<Tunnel>;
  nodeToCp: ConnectionBudget;
}

export function registerServerGauges(metrics: KanalMetrics, { registry, frontendTunnels, nodeToCp }: GaugedParts): void {
  metrics.gauge('kanal_server_agents', 'Agent tunnels connected to this server', () => registry.size);
  metrics.gauge(
    'kanal_server_agent_identities',
    'Distinct agents (credential + agentID) connected to this server',
    () => registry.agentCount,
  );
  metrics.gauge(
    'kanal_server_agent_tunnels_quiet',
    'Agent tunnels whose liveness PING is unanswered (dials avoid them)',
    () => registry.list().filter((b) => b.liveness?.quiet).length,
  );
  metrics.gauge('kanal_server_frontend_streams', 'gRPC frontend streams open', () => frontendTunnels.size);
  metrics.gauge('kanal_server_connections_open', 'Tunnelled connections open through agents', () =>
    registry.list().reduce((n, b) => n + b.tunnel.stats().connections, 0),
  );
  metrics.gauge('kanal_server_pending_dials', 'Dials through agents waiting for an answer', () =>
    registry.list().reduce((n, b) => n + b.tunnel.stats().pendingDials, 0),
  );
  metrics.gauge(
    'kanal_server_node_to_cp_connections',
    'Node -> control plane connections the server holds (dialling or open), all agents',
    () => nodeToCp.used,
  );
  metrics.gauge(
    'kanal_server_streams_read_paused',
    'Agent tunnels and frontend streams the server is not reading now (slow reader or peer not reading)',
    () => [...registry.list().map((b) => b.tunnel), ...frontendTunnels].filter((t) => t.stats().readPaused).length,
  );
  metrics.gauge(
    'kanal_server_window_growth_bytes',
    'Receive-window growth (beyond the first window) held by connections on agent tunnels and frontend streams',
    () => [...registry.list().map((b) => b.tunnel), ...frontendTunnels].reduce((n, t) => n + t.stats().windowGrowthBytes, 0),
  );
}

/** Feeds the lease controller's garbage collection into upstream's lease metrics. */
export function feedLeaseMetrics(leases: ServerLeaseController, m: UpstreamServerLeaseMetrics): void {
  leases.on('collected', () => m.culled.inc());
  leases.on('gc-call', (op, status, reason, seconds) => {
    const code = String(status);
    if (op === 'list') {
      m.lists.inc({ http_status_code: code, reason });
      m.listSeconds.observe({ http_status_code: code }, seconds);
    } else {
      m.deletes.inc({ http_status_code: code, reason });
      m.deleteSeconds.observe({ http_status_code: code }, seconds);
    }
  });
}
