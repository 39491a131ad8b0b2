/**
 * Prometheus metrics, one registry per process, served on /metrics of the
 * health port. Gauges are read from live tables at scrape time so they can
 * never drift from the truth; counters are bumped where things happen.
 */
import { Counter, Gauge, Histogram, Registry } from './prom-client.js';
import { collectDefaultMetrics } from './default-metrics.js';
import { SeriesCounter, SeriesHistogram, type CounterSeries, type HistogramSeries } from './series-metrics.js';
import { EVENT_LOOP_LAG_NAMES, registerEventLoopLag } from './event-loop-lag.js';
import { CONNECTION_DURATION_BUCKETS, UpstreamDialMetrics } from './upstream-metrics.js';
import type { DialResult } from './dial-result.js';
import type { RefusalReason } from './refusal-reason.js';
import { RecentEvents } from './recent-events.js';

/** The longest interval a libuv timer takes from JavaScript (setTimeout's limit). */
const PARKED_MS = 2 ** 31 - 1;

export type Direction = 'cp_to_node' | 'node_to_cp';

/** A Counter whose label values are typed: a misspelt value fails to compile. */
export type LabelledCounter<L extends Record<string, string>> = Omit<Counter<Extract<keyof L, string>>, 'inc'> & {
  inc(labels: L, value?: number): void;
};

export class KanalMetrics {
  readonly registry = new Registry();
  readonly dials: LabelledCounter<{ direction: Direction; result: DialResult }>;
  readonly dialSeconds: Histogram<'direction'>;
  readonly bytes: LabelledCounter<{ direction: Direction; flow: 'to_peer' | 'from_peer' }>;
  readonly connectionSeconds: Histogram<'direction'>;
  /**
   * The series dialDone() and connectionClosed() count on, held: they run once
   * per dial and connection, and prom-client's own inc() and observe() build
   * and hash a label object each call (series-metrics.ts).
   */
  private readonly series: {
    dials: SeriesCounter<'direction' | 'result'>;
    dialsOf: Record<Direction, Partial<Record<DialResult, CounterSeries>>>;
    dialSeconds: Record<Direction, HistogramSeries>;
    connectionSeconds: Record<Direction, HistogramSeries>;
    bytes: Record<Direction, { toPeer: CounterSeries; fromPeer: CounterSeries }>;
  };
  readonly refusals: LabelledCounter<{ reason: RefusalReason }>;
  /** Names resolved inside the cluster: asked of an agent (server), answered (agent). */
  readonly resolves: LabelledCounter<{ result: DialResult }>;
  /** slow_reader: a peer without flow control sends faster than its connection's reader takes; peer_not_reading: see limits.ts. */
  readonly readPauses: LabelledCounter<{ reason: 'slow_reader' | 'peer_not_reading' }>;
  readonly streamsClosed: LabelledCounter<{ reason: 'peer_not_reading' }>;
  /** Agent tunnels closed because their peer stopped answering (docs/trust-model.md, "Liveness of agent tunnels"). */
  readonly deadTunnels: LabelledCounter<{ reason: 'keepalive_timeout' | 'replaced' }>;
  /** Major GCs the memory reclaimer ran (memory-reclaimer.ts), and the RSS its checks gave back. */
  readonly memoryCollections: Counter;
  readonly memoryReclaimedBytes: Counter;
  /** Upstream's names for control plane -> node dials (upstream-metrics.ts). */
  readonly upstreamDials: UpstreamDialMetrics;
  /** Refusals and throttles of the last minutes, beside their counters (the admin port's /status). */
  readonly recent = new RecentEvents();

  /**
   * `tenant`: the metrics of one tenant of a shared server (docs/multi-tenant.md), every
   * series labelled with it; the process's own (process_*, nodejs_*, memory)
   * are then left to the server's unlabelled registry.
   */
  constructor(component: 'server' | 'agent', tenant?: string) {
    const processWide = tenant === undefined ? [this.registry] : [];
    if (tenant === undefined) {
      // prom-client's own names (process_*, nodejs_*), as upstream's Go client exports process_*.
      // Its event-loop-lag gauges read the sampling interval on an idle process; event-loop-lag.ts
      // replaces them, and prom-client's own sampler, which cannot be left out, fires once in 24 days.
      collectDefaultMetrics(this.registry, { eventLoopMonitoringPrecision: PARKED_MS });
      for (const name of EVENT_LOOP_LAG_NAMES) this.registry.removeSingleMetric(name);
      registerEventLoopLag(this.registry);
    } else {
      this.registry.setDefaultLabels({ tenant });
    }
    this.upstreamDials = new UpstreamDialMetrics(component, this.registry);
    const dials = new SeriesCounter<'direction' | 'result'>({
      name: 'kanal_dials_total',
      help: 'Dials through the tunnel by direction and result',
      labelNames: ['direction', 'result'],
      registers: [this.registry],
    });
    this.dials = dials;
    const dialSeconds = new SeriesHistogram<'direction'>({
      name: 'kanal_dial_duration_seconds',
      help: 'Time from dial request to established connection',
      labelNames: ['direction'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: [this.registry],
    });
    this.dialSeconds = dialSeconds;
    const connectionSeconds = new SeriesHistogram<'direction'>({
      name: 'kanal_connection_duration_seconds',
      help: 'How long closed tunnelled connections were established, from the dial answer to the close',
      labelNames: ['direction'],
      buckets: CONNECTION_DURATION_BUCKETS,
      registers: [this.registry],
    });
    this.connectionSeconds = connectionSeconds;
    const bytes = new SeriesCounter<'direction' | 'flow'>({
      name: 'kanal_connection_bytes_total',
      help: 'Bytes carried by closed tunnelled connections (flow: to_peer or from_peer)',
      labelNames: ['direction', 'flow'],
      registers: [this.registry],
    });
    this.bytes = bytes;
    const bytesOf = (direction: Direction) => ({
      toPeer: bytes.series({ direction, flow: 'to_peer' }),
      fromPeer: bytes.series({ direction, flow: 'from_peer' }),
    });
    this.series = {
      dials,
      dialsOf: { cp_to_node: {}, node_to_cp: {} },
      dialSeconds: {
        cp_to_node: dialSeconds.series({ direction: 'cp_to_node' }),
        node_to_cp: dialSeconds.series({ direction: 'node_to_cp' }),
      },
      connectionSeconds: {
        cp_to_node: connectionSeconds.series({ direction: 'cp_to_node' }),
        node_to_cp: connectionSeconds.series({ direction: 'node_to_cp' }),
      },
      bytes: { cp_to_node: bytesOf('cp_to_node'), node_to_cp: bytesOf('node_to_cp') },
    };
    this.refusals = new Counter({
      name: 'kanal_refusals_total',
      help: 'Refused connections, streams and dials by reason',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.resolves = new Counter({
      name: 'kanal_name_resolutions_total',
      help:
        component === 'server'
          ? "Names a frontend client's dial had resolved inside the cluster by an agent, by result (the values of kanal_dials_total)"
          : 'Names the server asked this agent to resolve, by result (ok, unresolved, cancelled)',
      labelNames: ['result'],
      registers: [this.registry],
    });
    this.deadTunnels = new Counter({
      name: 'kanal_dead_tunnels_total',
      help: 'Tunnels closed because the peer stopped answering HTTP/2 PINGs (keepalive_timeout) or was replaced while quiet (replaced)',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.readPauses = new Counter({
      name: 'kanal_stream_read_pauses_total',
      help: 'Times a tunnel stopped reading its stream (reason: slow_reader with a peer without flow control, peer_not_reading)',
      labelNames: ['reason'],
      registers: [this.registry],
    });
    this.memoryCollections = new Counter({
      name: 'kanal_memory_collections_total',
      help: 'Major GCs run because resident memory stood 8 MiB above its floor (docs/memory.md)',
      registers: processWide,
    });
    this.memoryReclaimedBytes = new Counter({
      name: 'kanal_memory_reclaimed_bytes_total',
      help: 'Resident memory given back to the kernel by those GCs and by malloc_trim every 10 s',
      registers: processWide,
    });
    this.streamsClosed = new Counter({
      name: 'kanal_streams_closed_total',
      help: 'Tunnel streams this side closed because of a limit (reason: peer_not_reading)',
      labelNames: ['reason'],
      registers: [this.registry],
    });
  }

  /** A gauge whose value is computed at scrape time. */
  gauge(name: string, help: string, read: () => number): void {
    new Gauge({
      name,
      help,
      registers: [this.registry],
      collect() {
        this.set(read());
      },
    });
  }

  /** Records a finished dial; `started` is a performance.now() timestamp. */
  dialDone(direction: Direction, result: DialResult, started: number): void {
    const of = this.series.dialsOf[direction];
    (of[result] ??= this.series.dials.series({ direction, result })).inc();
    const seconds = (performance.now() - started) / 1000;
    if (result === 'ok') this.series.dialSeconds[direction].observe(seconds);
    if (direction === 'cp_to_node') this.upstreamDials.dialDone(result, seconds);
  }

  /** A tunnelled connection closed after `seconds` established. */
  connectionClosed(direction: Direction, toPeer: number, fromPeer: number, seconds: number): void {
    const bytes = this.series.bytes[direction];
    bytes.toPeer.inc(toPeer);
    bytes.fromPeer.inc(fromPeer);
    this.series.connectionSeconds[direction].observe(seconds);
    if (direction === 'cp_to_node') this.upstreamDials.connectionDone(seconds);
  }
}
