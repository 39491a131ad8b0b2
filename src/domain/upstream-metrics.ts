/**
 * Upstream Konnectivity's metric names (konnectivity_network_proxy_server_*
 * and _agent_*, v0.36 pkg/server/metrics and pkg/agent/metrics) beside
 * Kanal's own, with upstream's labels and buckets, so dashboards and alerts
 * keep working. docs/metrics.md maps each onto Kanal.
 */
import { Counter, Gauge, Histogram, type Registry } from './prom-client.js';
import type { DialResult } from './dial-result.js';
import { SeriesHistogram, type HistogramSeries } from './series-metrics.js';

const SERVER = 'konnectivity_network_proxy_server_';
const AGENT = 'konnectivity_network_proxy_agent_';
/** Upstream's buckets: server 1 µs to 12.5 s, agent 5 ms to 30 s. */
const SERVER_BUCKETS = [0.000001, 0.00001, 0.0001, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];
const AGENT_BUCKETS = [0.005, 0.025, 0.1, 0.5, 2.5, 10, 30];
/**
 * Connection lifespans, 1 s to 24 h as upstream's connection_duration_seconds
 * (kubernetes-sigs/apiserver-network-proxy#899, server only); Kanal's
 * kanal_connection_duration_seconds uses the same on both sides.
 */
export const CONNECTION_DURATION_BUCKETS = [1, 5, 15, 30, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400];

/** Upstream's server dial_failure_count reasons, keyed by Kanal's dial results; absent = not counted there. */
const SERVER_DIAL_FAILURE: Partial<Record<DialResult, 'error_response' | 'timeout' | 'frontend_close' | 'backend_close'>> = {
  refused: 'error_response',
  timeout: 'timeout',
  cancelled: 'frontend_close',
  'tunnel-closed': 'backend_close',
};

/** Control plane -> node dials (the direction upstream has), on whichever side this process is. */
export class UpstreamDialMetrics {
  /** The histograms' one series each, held (series-metrics.ts): observed once per dial and connection. */
  private readonly seconds: HistogramSeries;
  private readonly failures: Counter<'reason'>;
  /** Server only, as upstream's. */
  private readonly connectionSeconds: HistogramSeries | undefined;

  constructor(
    private readonly component: 'server' | 'agent',
    registry: Registry,
  ) {
    const prefix = component === 'server' ? SERVER : AGENT;
    this.seconds = new SeriesHistogram({
      name: `${prefix}dial_duration_seconds`,
      help: 'Latency of dial to the remote endpoint in seconds',
      buckets: component === 'server' ? SERVER_BUCKETS : AGENT_BUCKETS,
      registers: [registry],
    }).series();
    this.failures =
      component === 'server'
        ? new Counter({
            name: `${SERVER}dial_failure_count`,
            help: 'Number of dial failures observed. Multiple failures can occur for a single dial request.',
            labelNames: ['reason'],
            registers: [registry],
          })
        : new Counter({
            name: `${AGENT}endpoint_dial_failure_total`,
            help: 'Number of failures dialing the remote endpoint, by reason (example: timeout).',
            labelNames: ['reason'],
            registers: [registry],
          });
    this.connectionSeconds =
      component === 'server'
        ? new SeriesHistogram({
            name: `${SERVER}connection_duration_seconds`,
            help: 'Duration of established end-to-end proxy connections, from dial success to close, in seconds',
            buckets: CONNECTION_DURATION_BUCKETS,
            registers: [registry],
          }).series()
        : undefined;
  }

  /** A control plane -> node connection closed after `seconds` established. */
  connectionDone(seconds: number): void {
    this.connectionSeconds?.observe(seconds);
  }

  dialDone(result: DialResult, seconds: number): void {
    if (result === 'ok') {
      this.seconds.observe(seconds);
      return;
    }
    const reason = this.component === 'server' ? SERVER_DIAL_FAILURE[result] : result === 'timeout' ? 'timeout' : 'unknown';
    if (reason !== undefined) this.failures.inc({ reason });
  }
}

/** A gauge whose labelled values are computed at scrape time. */
interface LiveGauge<L extends string> {
  name: string;
  help: string;
  labelNames: readonly L[];
  /** The labelled values now, read at each scrape. */
  read: () => [Partial<Record<L, string>>, number][];
}

function liveGauge<L extends string>(registry: Registry, { name, help, labelNames, read }: LiveGauge<L>): void {
  new Gauge({
    name,
    help,
    labelNames,
    registers: [registry],
    collect() {
      for (const [labels, value] of read()) this.set(labels, value);
    },
  });
}

/** What the server's upstream gauges read, at scrape time. */
export interface UpstreamServerReadings {
  /** Agent streams (AgentService.Connect) and gRPC frontend streams (ProxyService.Proxy). */
  agentStreams(): number;
  proxyStreams(): number;
  httpConnectConnections(): number;
  /** Agents (distinct agentIDs) a dial may pick. */
  readyAgents(): number;
  pendingDials(): number;
  /** Connections open through agents. */
  establishedConnections(): number;
  /** Agent tunnels and frontend streams not read now because their reader is behind. */
  pausedAgentStreams(): number;
  pausedProxyStreams(): number;
}

/** Lease metrics of the server's lease controller, named as upstream's (fed by src/server/leases/lease-controller.ts users). */
export interface UpstreamServerLeaseMetrics {
  culled: Counter;
  deletes: Counter<'http_status_code' | 'reason'>;
  deleteSeconds: Histogram<'http_status_code'>;
  lists: Counter<'http_status_code' | 'reason'>;
  listSeconds: Histogram<'http_status_code'>;
}

export function registerUpstreamServerMetrics(registry: Registry, r: UpstreamServerReadings): UpstreamServerLeaseMetrics {
  liveGauge(registry, {
    name: `${SERVER}grpc_connections`,
    help: 'Number of current grpc connections, partitioned by service method.',
    labelNames: ['service_method'],
    read: () => [
      [{ service_method: 'Connect' }, r.agentStreams()],
      [{ service_method: 'Proxy' }, r.proxyStreams()],
    ],
  });
  liveGauge(registry, {
    name: `${SERVER}http_connections`,
    help: 'Number of current HTTP CONNECT connections',
    labelNames: [],
    read: () => [[{}, r.httpConnectConnections()]],
  });
  liveGauge(registry, {
    name: `${SERVER}ready_backend_connections`,
    help: 'Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends',
    labelNames: [],
    read: () => [[{}, r.readyAgents()]],
  });
  // Reported under "default": the agents ready for any of the configured strategies (docs/metrics.md).
  liveGauge(registry, {
    name: `${SERVER}ready_backends`,
    help: 'Number of konnectivity agent connected to the proxy server',
    labelNames: ['proxy_strategy'],
    read: () => [[{ proxy_strategy: 'default' }, r.readyAgents()]],
  });
  liveGauge(registry, {
    name: `${SERVER}pending_backend_dials`,
    help: 'Current number of pending backend dial requests',
    labelNames: [],
    read: () => [[{}, r.pendingDials()]],
  });
  liveGauge(registry, {
    name: `${SERVER}established_connections`,
    help: 'Current number of established end-to-end connections (after dial success)',
    labelNames: [],
    read: () => [[{}, r.establishedConnections()]],
  });
  liveGauge(registry, {
    name: `${SERVER}full_receive_channels`,
    help: 'Number of current connections blocked by a full receive channel, partitioned by service method.',
    labelNames: ['service_method'],
    read: () => [
      [{ service_method: 'Connect' }, r.pausedAgentStreams()],
      [{ service_method: 'Proxy' }, r.pausedProxyStreams()],
    ],
  });
  // Upstream observes each Send() to a frontend; Kanal's writes are asynchronous and flow-controlled (docs/metrics.md).
  new Histogram({
    name: `${SERVER}frontend_write_duration_seconds`,
    help: 'Latency of write to the frontend in seconds (Kanal: not observed, see docs/metrics.md)',
    buckets: SERVER_BUCKETS,
    registers: [registry],
  });
  return {
    culled: new Counter({
      name: `${SERVER}culled_leases_count`,
      help: 'Count of expired leases that the lease garbage collection controller has culled.',
      registers: [registry],
    }),
    deletes: new Counter({
      name: `${SERVER}lease_delete_total`,
      help: 'Count of lease delection calls by the garbage collection controller. Labeled by HTTP status code and reason.',
      labelNames: ['http_status_code', 'reason'],
      registers: [registry],
    }),
    deleteSeconds: new Histogram({
      name: `${SERVER}lease_delete_latency_seconds`,
      help: 'Latency of lease deletion calls by the garbage collection controller',
      labelNames: ['http_status_code'],
      buckets: SERVER_BUCKETS,
      registers: [registry],
    }),
    lists: new Counter({
      name: `${SERVER}lease_list_total`,
      help: 'Count of lease list calls by the garbage collection controller. Labeled by HTTP status code and reason.',
      labelNames: ['http_status_code', 'reason'],
      registers: [registry],
    }),
    listSeconds: new Histogram({
      name: `${SERVER}lease_list_latency_seconds`,
      help: 'Latency of lease list calls by the garbage collection controller',
      labelNames: ['http_status_code'],
      buckets: SERVER_BUCKETS,
      registers: [registry],
    }),
  };
}

/** What the agent's upstream gauges read, at scrape time. */
export interface UpstreamAgentReadings {
  serverConnections(): number;
  knownServers(): number;
  endpointConnections(): number;
}

/** The agent's metrics upstream updates as things happen. */
export interface UpstreamAgentEventMetrics {
  /** direction: to_server or from_server. */
  serverFailures: Counter<'direction'>;
  leaseLists: Counter<'http_response_code' | 'reason'>;
  leaseWatches: Counter<'http_response_code' | 'reason'>;
  leaseListSeconds: Histogram<'http_response_code'>;
}

export function registerUpstreamAgentMetrics(registry: Registry, r: UpstreamAgentReadings): UpstreamAgentEventMetrics {
  liveGauge(registry, {
    name: `${AGENT}open_server_connections`,
    help: 'Current number of open server connections.',
    labelNames: [],
    read: () => [[{}, r.serverConnections()]],
  });
  liveGauge(registry, {
    name: `${AGENT}known_server_count`,
    help: 'Current number of servers agent is trying to connect to.',
    labelNames: [],
    read: () => [[{}, r.knownServers()]],
  });
  liveGauge(registry, {
    name: `${AGENT}open_endpoint_connections`,
    help: 'Current number of open endpoint connections.',
    labelNames: [],
    read: () => [[{}, r.endpointConnections()]],
  });
  return {
    serverFailures: new Counter({
      name: `${AGENT}server_connection_failure_count`,
      help: 'Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server).',
      labelNames: ['direction'],
      registers: [registry],
    }),
    leaseLists: new Counter({
      name: `${AGENT}lease_lists_total`,
      help: 'Count of server lease list calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason',
      labelNames: ['http_response_code', 'reason'],
      registers: [registry],
    }),
    leaseWatches: new Counter({
      name: `${AGENT}lease_watches_total`,
      help: 'Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason',
      labelNames: ['http_response_code', 'reason'],
      registers: [registry],
    }),
    leaseListSeconds: new Histogram({
      name: `${AGENT}lease_list_latency_seconds`,
      help: 'Latency of server lease listing in seconds',
      labelNames: ['http_response_code'],
      buckets: AGENT_BUCKETS,
      registers: [registry],
    }),
  };
}
