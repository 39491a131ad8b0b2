/** Result rows, the text table and the JSON document. */
import type { MachineInfo } from './proc.js';
import type { ProfileSummary } from './profile.js';

/** The sections one can run (--only); 'versus' is derived from the others (side-by-side.ts). */
export type Section = 'throughput' | 'transport' | 'latency' | 'loaded' | 'requests' | 'memory' | 'agents' | 'isolation' | 'start';

export interface Row {
  /** Stable identifier, e.g. "throughput.cp-node.up.1". */
  id: string;
  section: Section | 'versus';
  label: string;
  /** Every figure of the row; see COLUMNS for meaning and units. */
  values: Record<string, number>;
  /** Keys of `values` that may legitimately be zero or negative (memory deltas). */
  signed?: string[];
  /** Label of the row this one is compared with. */
  baseline?: string;
  /** The individual runs behind a median (MB/s or req/s), in run order. */
  runs?: number[];
  /** Side-by-side rows: the figure's unit, digits shown, which way is good, and whether upstream has no such figure. */
  unit?: string;
  digits?: number;
  better?: 'higher' | 'lower';
  kanalOnly?: boolean;
}

export interface Report {
  tool: 'kanal-bench';
  mode: string;
  transport: string;
  startedAt: string;
  durationS: number;
  machine: MachineInfo;
  /** Average cores kept busy by processes other than this bench during the run (noise indicator). */
  backgroundCores: number;
  /** /proc/loadavg's 1-minute figure when the run started and when it ended (includes this bench's own load). */
  loadAvg: { start: number; end: number };
  /** Upstream Konnectivity's binaries that ran next to Kanal, or why none did. */
  upstream: { origin: string } | { absent: string };
  params: Record<string, number>;
  rows: Row[];
  profile?: ProfileSummary[];
  /** The churn soak (--only soak, --full): tables of its own, so the other sections' rows keep their shape. */
  soak?: SoakReport;
  /** Section 7, tenants: tables of their own, as the soak's. */
  tenants?: TenantsReport;
  /** Section 8, reconnects (suite-reconnect.ts): tables of their own. */
  reconnect?: ReconnectReport;
  /** Section 9, the front doors of other control-plane clients (suite-scrape.ts, suite-socks.ts): tables of their own. */
  doors?: DoorsReport;
  /** --kanal-cli: the build every Kanal pair ran, when not this checkout's. */
  kanalCli?: string;
  /** --audit: the Kanal pairs wrote audit logs. */
  audit?: boolean;
  /** --kanal-workers: the Kanal servers ran --workers N. */
  kanalWorkers?: number;
  warnings: string[];
}

/** A line of a soak table: a reading every `every` connections, or a phase's summary for one process. */
export interface SoakRow {
  /** Stable identifier, e.g. "soak.kanal.handshakes.15000" or "soak.kanal.handshakes.server". */
  id: string;
  label: string;
  values: Record<string, number>;
}

export interface SoakReport {
  /** Connections per phase and product, RSS and heap read every `every`. */
  connections: number;
  every: number;
  goalMiB: number;
  /** The last reading of a phase comes this long after its last connection. */
  idleS: number;
  readings: SoakRow[];
  summary: SoakRow[];
  /** How the connections of each phase ended, one line per product and phase. */
  outcomes: string[];
}

/** The tables of section 7 (suite-tenants.ts). */
export type TenantsTable = 'scale' | 'reload' | 'dials' | 'fairness' | 'load' | 'workers' | 'hostile';

export interface TenantsRow {
  /** Stable identifier, e.g. "tenants.scale.1000x3" or "tenants.fairness.b-dial-p50". */
  id: string;
  table: TenantsTable;
  label: string;
  values: Record<string, number>;
  /** Keys of `values` that may legitimately be zero or negative (memory deltas). */
  signed?: string[];
  /** The individual runs behind a median, in run order. */
  runs?: number[];
}

export interface TenantsReport {
  rows: TenantsRow[];
  /** The goal a tenant's memory is held to (KiB beyond its agents and connections). */
  goalKiBPerTenant: number;
  /** How the figures were taken, printed under the tables. */
  notes: string[];
}

/** The tables of section 8 (suite-reconnect.ts). */
export type ReconnectTable = 'ha' | 'cut' | 'cost';

export interface ReconnectRow {
  /** Stable identifier, e.g. "reconnect.ha.kanal.restart" or "reconnect.cut.kanal-resume". */
  id: string;
  table: ReconnectTable;
  label: string;
  values: Record<string, number>;
  /** The individual runs behind a median, in run order. */
  runs?: number[];
}

export interface ReconnectReport {
  rows: ReconnectRow[];
  /** How the figures were taken, and what could not be run (resume absent), printed under the tables. */
  notes: string[];
}

/** The tables of section 9: 9a scrape-like load (suite-scrape.ts), 9b SOCKS5 next to CONNECT (suite-socks.ts). */
export type DoorsTable = 'scrape' | 'socks';

export interface DoorsRow {
  /** Stable identifier, e.g. "doors.scrape.kanal-forward-tcp" or "doors.socks.kanal-socks5.c8". */
  id: string;
  table: DoorsTable;
  label: string;
  values: Record<string, number>;
  /** Why a row has no figures ("not available in this build: …", "405: …"), printed after its cells. */
  note?: string;
}

export interface DoorsReport {
  rows: DoorsRow[];
  /** How the figures were taken, what is modelled and what could not run, printed under the tables. */
  notes: string[];
}

interface Column {
  key: string;
  title: string;
  digits: number;
  suffix?: string;
  /** A value key: when the row's is 1, the figure is a lower bound (a wait that timed out) and prints as ">N s". */
  lowerBound?: string;
}

/** The dial-latency sections share these. */
const PERCENTILE_COLUMNS: Column[] = [
  { key: 'p50Ms', title: 'p50 ms', digits: 2 },
  { key: 'p99Ms', title: 'p99 ms', digits: 2 },
  { key: 'p50Spread', title: 'p50 spread', digits: 0, suffix: '%' },
  { key: 'ratioP50', title: 'p50 ratio', digits: 2 },
  { key: 'ratioP99', title: 'p99 ratio', digits: 2 },
  { key: 'vsUpstreamP50', title: 'p50 /upstream', digits: 2 },
  { key: 'vsUpstreamP99', title: 'p99 /upstream', digits: 2 },
];
const DIALS_COLUMN: Column = { key: 'samples', title: 'dials', digits: 0 };

const COLUMNS: Record<Section, { title: string; columns: Column[] }> = {
  throughput: {
    title: '1. Bulk throughput (one TCP connection per flow; ratio: proxy / direct TLS measured in the same run)',
    columns: [
      { key: 'mbps', title: 'MB/s', digits: 0 },
      { key: 'gbps', title: 'Gbit/s', digits: 2 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'proxyCpuSPerGB', title: 'proxy CPU s/GB', digits: 2 },
      { key: 'endpointCpuSPerGB', title: 'endpoints CPU s/GB', digits: 2 },
      { key: 'vsUpstream', title: 'MB/s /upstream', digits: 2 },
      { key: 'cpuVsUpstream', title: 'CPU /upstream', digits: 2 },
    ],
  },
  transport: {
    title: '1b. gRPC transport alone: one stream of 32 KiB DATA packets over mTLS on loopback, in process (ratio: / raw TLS socket)',
    columns: [
      { key: 'mbps', title: 'MB/s', digits: 0 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'cpuSPerGB', title: 'CPU s/GB (both sides)', digits: 2 },
    ],
  },
  latency: {
    title: '2a. Dial latency: connect (+ CONNECT) -> one byte written and echoed by the backend',
    columns: [
      ...PERCENTILE_COLUMNS,
      { key: 'dialsPerS', title: 'dials/s', digits: 0 },
      { key: 'vsUpstreamRate', title: 'dials/s /upstream', digits: 2 },
      { key: 'cpuUsPerDial', title: 'proxy CPU µs/dial', digits: 0 },
      { key: 'vsUpstreamCpu', title: 'CPU /upstream', digits: 2 },
      DIALS_COLUMN,
    ],
  },
  loaded: {
    title: '2b. Dial latency while one bulk download runs (proxies: CP->node, on the same tunnel; direct TCP: next to a direct TLS one)',
    columns: [...PERCENTILE_COLUMNS, { key: 'bulkMbps', title: 'bulk MB/s', digits: 0 }, DIALS_COLUMN],
  },
  requests: {
    title: '2c. Short requests: new connection per HTTP/1.1 GET, Connection: close',
    columns: [
      { key: 'rps', title: 'req/s', digits: 0 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'vsUpstream', title: '/upstream', digits: 2 },
      { key: 'requests', title: 'requests', digits: 0 },
    ],
  },
  memory: {
    title: '3a. Memory per idle tunnelled connection (CP -> node, RSS growth / connections; a freshly started pair, one run)',
    columns: [
      { key: 'connections', title: 'conns', digits: 0 },
      { key: 'serverKiBPerConn', title: 'server KiB/conn', digits: 1 },
      { key: 'agentKiBPerConn', title: 'agent KiB/conn', digits: 1 },
      { key: 'serverStartRssMiB', title: 'server RSS at start', digits: 0 },
      { key: 'agentStartRssMiB', title: 'agent RSS at start', digits: 0 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 0 },
      { key: 'agentRssMiB', title: 'agent RSS MiB', digits: 0 },
      { key: 'openPerS', title: 'opened/s', digits: 0 },
    ],
  },
  agents: {
    title: '3b. Memory per connected agent (one server; the agents are Kanal agent tunnels from bench helper processes, for both servers)',
    columns: [
      { key: 'agents', title: 'agents', digits: 0 },
      { key: 'serverKiBPerAgent', title: 'server KiB/agent', digits: 1 },
      { key: 'agentSideKiBPerAgent', title: 'agent side KiB/tunnel', digits: 1 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 0 },
      { key: 'connectPerS', title: 'connected/s', digits: 0 },
    ],
  },
  isolation: {
    title: "4. Isolation: one connection's throughput while another on the same tunnel has a stalled reader (goal >= 0.90)",
    columns: [
      { key: 'aloneMbps', title: 'alone MB/s', digits: 0 },
      { key: 'stalledMbps', title: 'w/ stall MB/s', digits: 0 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'blockedRuns', title: 'runs blocked', digits: 0 },
      { key: 'leftOpen', title: 'left open', digits: 0 },
      { key: 'serverGrowthMiB', title: 'server +MiB', digits: 1 },
      { key: 'agentGrowthMiB', title: 'agent +MiB', digits: 1 },
    ],
  },
  start: {
    title:
      '6. Start: exec -> ready (server: /healthz; agent: /readyz, its tunnel up), CPU and RSS (and its anonymous part) then; fresh pairs, medians',
    columns: [
      { key: 'serverReadyMs', title: 'server ms', digits: 0 },
      { key: 'serverReadyMsSpread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'agentReadyMs', title: 'agent ms', digits: 0 },
      { key: 'agentReadyMsSpread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'serverCpuMs', title: 'server CPU ms', digits: 0 },
      { key: 'agentCpuMs', title: 'agent CPU ms', digits: 0 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 1 },
      { key: 'agentRssMiB', title: 'agent RSS MiB', digits: 1 },
      { key: 'serverAnonMiB', title: 'server anon MiB', digits: 1 },
      { key: 'agentAnonMiB', title: 'agent anon MiB', digits: 1 },
      { key: 'runs', title: 'runs', digits: 0 },
    ],
  },
};

export const SECTION_ORDER: Section[] = [
  'throughput',
  'transport',
  'latency',
  'loaded',
  'requests',
  'memory',
  'agents',
  'isolation',
  'start',
];

/** Growth columns are signed: RSS may come back below the first reading. */
const SOAK_READING_COLUMNS: Column[] = [
  { key: 'connections', title: 'conns', digits: 0 },
  { key: 'perS', title: 'conns/s', digits: 0 },
  { key: 'serverRssMiB', title: 'server RSS MiB', digits: 1 },
  { key: 'serverGrowthMiB', title: 'server +MiB', digits: 1 },
  { key: 'serverHeapMiB', title: 'server heap MiB', digits: 1 },
  { key: 'agentRssMiB', title: 'agent RSS MiB', digits: 1 },
  { key: 'agentGrowthMiB', title: 'agent +MiB', digits: 1 },
  { key: 'agentHeapMiB', title: 'agent heap MiB', digits: 1 },
];

const SOAK_SUMMARY_COLUMNS: Column[] = [
  { key: 'connections', title: 'conns', digits: 0 },
  { key: 'firstRssMiB', title: 'RSS at first', digits: 1 },
  { key: 'endRssMiB', title: 'RSS at end', digits: 1 },
  { key: 'growthMiB', title: 'growth MiB', digits: 1 },
  { key: 'peakGrowthMiB', title: 'peak growth', digits: 1 },
  { key: 'idleGrowthMiB', title: 'growth, idle', digits: 1 },
  { key: 'firstHeapMiB', title: 'heap at first', digits: 1 },
  { key: 'endHeapMiB', title: 'heap at end', digits: 1 },
  { key: 'heapGrowthMiB', title: 'heap growth', digits: 1 },
  { key: 'endRssVsUpstream', title: 'RSS at end /upstream', digits: 2 },
  { key: 'growthVsUpstream', title: 'growth /upstream', digits: 2 },
];

const TENANTS_TABLES: Record<TenantsTable, { title: string; columns: Column[] }> = {
  scale: {
    title:
      '7a. Tenants: server RSS with an empty tenants file, with the tenants declared (no agent), with every agent connected\n' +
      '    (lowest VmRSS over the settle time after each step); per tenant: (declared - empty) / tenants; per agent: (connected - declared) / agents',
    columns: [
      { key: 'tenants', title: 'tenants', digits: 0 },
      { key: 'agents', title: 'agents', digits: 0 },
      { key: 'emptyRssMiB', title: 'RSS empty MiB', digits: 1 },
      { key: 'declaredRssMiB', title: 'RSS declared MiB', digits: 1 },
      { key: 'connectedRssMiB', title: 'RSS agents MiB', digits: 1 },
      { key: 'kibPerTenant', title: 'KiB/tenant', digits: 1 },
      { key: 'heapKiBPerTenant', title: 'heap KiB/tenant', digits: 1 },
      { key: 'kibPerAgent', title: 'KiB/agent', digits: 1 },
      { key: 'agentSideKiBPerAgent', title: 'agent side KiB/tunnel', digits: 1 },
      { key: 'declareMs', title: 'declare all ms', digits: 0 },
      { key: 'connectPerS', title: 'connected/s', digits: 0 },
      { key: 'metricsKiBPerTenant', title: '/metrics KiB/tenant', digits: 2 },
      { key: 'metricsScrapeMs', title: 'scrape ms', digits: 0 },
    ],
  },
  reload: {
    title:
      "7b. Tenants: one tenant changed (its allowed-destination) in a file of all of them: write -> the server's 'tenants file applied'\n" +
      "    (includes the watch's 250 ms settle), and write -> that tenant's agents connected again (bench agents retry every 50 ms); medians;\n" +
      "    in place: runs the server applied in place (its log's inPlace), its agents kept: no 'agents back' then",
    columns: [
      { key: 'appliedMs', title: 'applied ms', digits: 0 },
      { key: 'appliedSpread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'agentsBackMs', title: 'agents back ms', digits: 0 },
      { key: 'reloadCpuMs', title: 'server CPU ms', digits: 0 },
      { key: 'inPlaceRuns', title: 'in place', digits: 0 },
      { key: 'changedAgents', title: 'its agents', digits: 0 },
      { key: 'runs', title: 'runs', digits: 0 },
    ],
  },
  dials: {
    title:
      "7c. Tenants: dial latency through a few tenants' own Unix sockets (sequential, CONNECT -> one byte echoed), idle and while\n" +
      "    other tenants' kube-apiservers dial as fast as they can through theirs (ratio: loaded / idle, pooled percentiles)",
    columns: [
      { key: 'idleP50Ms', title: 'idle p50 ms', digits: 2 },
      { key: 'idleP99Ms', title: 'idle p99 ms', digits: 2 },
      { key: 'loadedP50Ms', title: 'loaded p50 ms', digits: 2 },
      { key: 'loadedP99Ms', title: 'loaded p99 ms', digits: 2 },
      { key: 'ratioP50', title: 'p50 ratio', digits: 2 },
      { key: 'ratioP99', title: 'p99 ratio', digits: 2 },
      { key: 'loadDialsPerS', title: 'load dials/s', digits: 0 },
      { key: 'loadRefused', title: 'load refused', digits: 0 },
      { key: 'loadTenants', title: 'load tenants', digits: 0 },
      { key: 'measuredTenants', title: 'measured', digits: 0 },
      { key: 'samples', title: 'dials', digits: 0 },
    ],
  },
  fairness: {
    title:
      "7d. Fairness: tenant B alone, next to tenant A's load on B's server (A: bulk downloads and a dial flood, its own agent), next to\n" +
      "    the same load through a server of A's own on the same machine (the cores' share alone), and next to it with A and B in the two\n" +
      "    workers of one --workers 2 server (B's own agent and socket there); ratios: to B alone (on B's one-process server), and to A's own\n" +
      '    (latency: pooled percentiles; bulk: median of per-run ratios)',
    columns: [
      { key: 'alone', title: 'alone', digits: 2 },
      { key: 'shared', title: "A on B's server", digits: 2 },
      { key: 'own', title: 'A on its own', digits: 2 },
      { key: 'workers', title: 'A in other worker', digits: 2 },
      { key: 'ratioShared', title: 'ratio shared', digits: 2 },
      { key: 'ratioOwn', title: 'ratio own', digits: 2 },
      { key: 'ratioWorkers', title: 'ratio workers', digits: 2 },
      { key: 'sharedVsOwn', title: 'shared / own', digits: 2 },
      { key: 'workersVsOwn', title: 'workers / own', digits: 2 },
      { key: 'aloneSpread', title: 'spread alone', digits: 0, suffix: '%' },
      { key: 'sharedSpread', title: 'spread shared', digits: 0, suffix: '%' },
      { key: 'workersSpread', title: 'spread workers', digits: 0, suffix: '%' },
      { key: 'samples', title: 'samples', digits: 0 },
    ],
  },
  load: {
    title:
      "7e. Tenant A's load while B was measured: its dial flood and its bulk flows (medians per run; refused: the server's\n" +
      '    kanal_refusals_total{tenant="a"} by reason, summed over the runs; refused share: CONNECTs answered 503 / tried)',
    columns: [
      { key: 'attemptsPerS', title: 'dials tried/s', digits: 0 },
      { key: 'okPerS', title: 'dials ok/s', digits: 0 },
      { key: 'rateRefused', title: 'refused: dial-rate', digits: 0 },
      { key: 'otherRefused', title: 'refused: other', digits: 0 },
      { key: 'refusedShare', title: 'refused share', digits: 0, suffix: '%' },
      { key: 'bulkMbps', title: 'A bulk MB/s', digits: 0 },
      { key: 'runs', title: 'runs', digits: 0 },
    ],
  },
  workers: {
    title:
      "7f. Workers: every tenant's load at once (each its own kanal agent and kube-apiserver; dial-rate off): all dialling as fast as\n" +
      '    their lanes go (dials/s over the flood), then all downloading (MB/s after the warm-up); the sum over tenants, on a server of\n' +
      '    --workers 1 (one process) and of --workers 2 (primary + 2 workers), runs interleaved. ratio: to --workers 1, median of per-run\n' +
      "    ratios; slowest share: the slowest tenant's rate / an even share; cores: CPU s per s of the server's processes, of its busiest\n" +
      '    process, of the agents, of the load generators + backend, of the whole machine; RSS: primary + workers (loaded: highest at the\n' +
      '    end of a run; at rest: lowest over the settle time after the runs). The tenants.shared rows: one tenant with all that load,\n' +
      '    on --workers 2 with tenant-workers: 1 and 2; its ratio is to tenant-workers: 1',
    columns: [
      { key: 'rate', title: 'rate', digits: 0 },
      { key: 'rateSpread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'ratio', title: 'ratio 2/1', digits: 2 },
      { key: 'slowestShare', title: 'slowest share', digits: 2 },
      { key: 'serverCores', title: 'server cores', digits: 2 },
      { key: 'busiestCores', title: 'busiest proc', digits: 2 },
      { key: 'agentCores', title: 'agents cores', digits: 2 },
      { key: 'otherCores', title: 'loadgen cores', digits: 2 },
      { key: 'machineCores', title: 'machine cores', digits: 2 },
      { key: 'loadedRssMiB', title: 'RSS loaded MiB', digits: 1 },
      { key: 'idleRssMiB', title: 'RSS at rest MiB', digits: 1 },
      { key: 'processes', title: 'server procs', digits: 0 },
      { key: 'runs', title: 'runs', digits: 0 },
    ],
  },
  hostile: {
    title:
      '7g. A hostile agent in tenant A (its own credential): it dials an allowed bulk source node -> control plane on 32 connections,\n' +
      '    grants the server unbounded credit (2^50 bytes) or 16 MiB per connection, never acknowledges, and says DRAIN; A and B each keep\n' +
      '    their own honest kanal agent and kube-apiserver, measured at once (sequential dials, one bulk download each) after 3 s of attack.\n' +
      '    Server RSS: highest while the phase lasts. Ratios: attack / no attack (latency: pooled percentiles; bulk, RSS: per-run medians)',
    columns: [
      { key: 'quiet', title: 'no attack', digits: 2 },
      { key: 'unbounded', title: 'credit 2^50', digits: 2 },
      { key: 'large', title: 'credit 16 MiB', digits: 2 },
      { key: 'ratioUnbounded', title: 'ratio 2^50', digits: 2 },
      { key: 'ratioLarge', title: 'ratio 16 MiB', digits: 2 },
      { key: 'opened', title: 'opened', digits: 0 },
      { key: 'closed', title: 'closed', digits: 0 },
      { key: 'quietSpread', title: 'spread quiet', digits: 0, suffix: '%' },
      { key: 'attackSpread', title: 'spread 2^50', digits: 0, suffix: '%' },
    ],
  },
};

function fmt(v: number | undefined, c: Column): string {
  if (v === undefined || !Number.isFinite(v)) return '—';
  const x = c.suffix === '%' ? v * 100 : v;
  return `${x.toFixed(c.digits)}${c.suffix ?? ''}`;
}

/** Section 0: one line per figure, Kanal next to upstream (rows from side-by-side.ts). */
function renderVersus(rows: Row[], labelWidth: number): string[] {
  const num = (v: number | undefined, digits: number): string => (v === undefined || !Number.isFinite(v) ? '—' : v.toFixed(digits));
  const pct = (v: number | undefined): string => (v === undefined || !Number.isFinite(v) ? '—' : `${(v * 100).toFixed(0)}%`);
  const table = rows.map((row) => {
    const d = row.digits ?? 2;
    const v = row.values;
    return [
      row.label,
      row.unit ?? '',
      row.kanalOnly ? 'n/a' : num(v.upstream, d),
      num(v.kanal, d),
      row.kanalOnly ? 'Kanal only' : num(v.ratio, 2),
      row.better === 'lower' ? 'lower' : 'higher',
      row.kanalOnly ? '' : pct(v.upstreamSpread),
      pct(v.kanalSpread),
    ];
  });
  const head = ['', 'unit', 'upstream', 'Kanal', 'Kanal/upstream', 'better', 'spread up', 'spread Kanal'];
  const widths = head.map((h, i) => Math.max(h.length, ...table.map((t) => t[i].length)));
  widths[0] = Math.max(widths[0], labelWidth);
  const line = (cells: string[]): string => `  ${cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]) : c.padStart(widths[i]))).join('  ')}`;
  return [
    '',
    '0. Side by side with upstream Konnectivity (same topology, same load generators, runs interleaved; ratio = Kanal / upstream,',
    '   the median of per-run ratios where runs pair up; node->CP lines are Kanal only: upstream has no such direction)',
    line(head),
    ...table.map(line),
  ];
}

/** One table: the columns some row fills, labels padded to `labelWidth`. */
function renderTable(
  title: string,
  columns: Column[],
  rows: { label: string; values: Record<string, number>; baseline?: string; note?: string }[],
  labelWidth: number,
): string[] {
  // Columns no row of this run fills (e.g. the upstream ratios without upstream) are left out.
  const shown = columns.filter((c) => rows.some((row) => row.values[c.key] !== undefined));
  const cell = (row: { values: Record<string, number> }, c: Column): string =>
    c.lowerBound !== undefined && row.values[c.lowerBound] === 1
      ? `>${(row.values[c.key] / 1000).toFixed(0)} s`
      : fmt(row.values[c.key], c);
  const widths = shown.map((c) => Math.max(c.title.length, ...rows.map((row) => cell(row, c).length)));
  const out = ['', title];
  out.push(
    `  ${''.padEnd(labelWidth)}  ${shown.map((c, i) => c.title.padStart(widths[i])).join('  ')}${rows.some((x) => x.baseline) ? '  baseline' : ''}`,
  );
  for (const row of rows) {
    const cells = shown.map((c, i) => cell(row, c).padStart(widths[i])).join('  ');
    out.push(`  ${row.label.padEnd(labelWidth)}  ${cells}${row.baseline ? `  ${row.baseline}` : ''}${row.note ? `  ${row.note}` : ''}`);
  }
  return out;
}

function renderSoak(s: SoakReport): string[] {
  const width = Math.max(...[...s.readings, ...s.summary].map((row) => row.label.length));
  const every = s.every.toLocaleString('en-US');
  return [
    ...renderTable(
      `5a. Connection churn soak: RSS (VmRSS) and heap every ${every} connections, a freshly started pair per product and phase\n` +
        `    (heap: Kanal's JS heap used, upstream's Go heap in use; +MiB: since the reading at ${every}; a last reading ${s.idleS} s after the last connection)`,
      SOAK_READING_COLUMNS,
      s.readings,
      width,
    ),
    ...renderTable(
      `5b. Soak summary: RSS growth after the first ${every} connections, to the last batch (goal: at most ${s.goalMiB} MiB per process),\n` +
        `    its peak, and ${s.idleS} s after the last batch; ratios: Kanal / upstream`,
      SOAK_SUMMARY_COLUMNS,
      s.summary,
      width,
    ),
    '',
    'Soak outcomes (handshakes: 70% mTLS + half an HTTP/2 preface held 200 ms, 10% TCP connect/close, 10% TLS without a client',
    "certificate, 10% an untrusted CA's certificate; tunnelled: 80% GET answered, 10% closed right after the 200, 10% CONNECT to a closed port):",
    ...s.outcomes.map((line) => `  ${line}`),
  ];
}

const RECONNECT_COLUMNS: Record<ReconnectTable, Column[]> = {
  ha: [
    { key: 'agents', title: 'agents', digits: 0 },
    { key: 'servers', title: 'servers', digits: 0 },
    { key: 'events', title: 'events', digits: 0 },
    { key: 'p50Ms', title: 'p50 ms', digits: 0, lowerBound: 'p50Bound' },
    { key: 'maxMs', title: 'max ms', digits: 0, lowerBound: 'maxBound' },
    { key: 'firstP50Ms', title: 'first tunnel p50', digits: 0 },
    { key: 'afterFirstP50Ms', title: 'first -> all p50', digits: 0 },
    { key: 'afterFirstMaxMs', title: 'first -> all max', digits: 0 },
    { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
    { key: 'serversMs', title: 'servers see all ms', digits: 0, lowerBound: 'serversBound' },
    { key: 'timeouts', title: 'timeouts', digits: 0 },
    { key: 'attempts', title: 'attempts/event', digits: 0 },
    { key: 'vsUpstreamP50', title: 'p50 /upstream', digits: 2 },
    { key: 'vsUpstreamMax', title: 'max /upstream', digits: 2 },
  ],
  cut: [
    { key: 'conns', title: 'conns', digits: 0 },
    { key: 'lost', title: 'lost', digits: 0 },
    { key: 'stalled', title: 'stalled', digits: 0 },
    { key: 'survived', title: 'survived', digits: 0 },
    { key: 'lostBytes', title: 'bytes lost', digits: 0 },
    { key: 'dupBytes', title: 'bytes dup', digits: 0 },
    { key: 'corruptBytes', title: 'bytes bad', digits: 0 },
    { key: 'lostAtP50Ms', title: 'lost at p50 ms', digits: 0 },
    { key: 'tunnelBackMs', title: 'tunnel back ms', digits: 0, lowerBound: 'tunnelBackBound' },
    { key: 'movedP50Ms', title: 'moved p50 ms', digits: 0 },
    { key: 'movedMaxMs', title: 'moved max ms', digits: 0 },
    { key: 'serverRssBeforeMiB', title: 'server RSS MiB', digits: 1 },
    { key: 'serverRssCutMiB', title: 'detached', digits: 1 },
    { key: 'agentRssBeforeMiB', title: 'agent RSS MiB', digits: 1 },
    { key: 'agentRssCutMiB', title: 'detached', digits: 1 },
    { key: 'runs', title: 'runs', digits: 0 },
  ],
  cost: [
    { key: 'mbps', title: 'bulk MB/s', digits: 0 },
    { key: 'mbpsSpread', title: 'spread', digits: 0, suffix: '%' },
    { key: 'ratioMbps', title: 'MB/s ratio', digits: 2 },
    { key: 'p50Ms', title: 'dial p50 ms', digits: 2 },
    { key: 'p99Ms', title: 'dial p99 ms', digits: 2 },
    { key: 'ratioP50', title: 'p50 ratio', digits: 2 },
    { key: 'ratioP99', title: 'p99 ratio', digits: 2 },
    { key: 'dials', title: 'dials', digits: 0 },
    { key: 'runs', title: 'runs', digits: 0 },
  ],
};

function renderReconnect(rc: ReconnectReport, p: Record<string, number>): string[] {
  const width = Math.max(...rc.rows.map((row) => row.label.length), 30);
  const timeoutS = (p.reconnectTimeoutMs / 1000).toFixed(0);
  const titles: Record<ReconnectTable, string> = {
    ha:
      `8a. HA behind one address: ${p.reconnectAgents} agents, ${p.reconnectServers} servers behind a round-robin TCP balancer (no health checks). Cold start: agent exec ->\n` +
      `    it holds a tunnel to every server (its open_server_connections); restart: a server SIGKILLed and started again on its ports, its\n` +
      `    /healthz answering -> every agent back (its ready_backend_connections: the k-th agent back is the k-th increment). Polled every 50 ms,\n` +
      `    waits bounded at ${timeoutS} s (">"); p50/max over agents, all events pooled; spread: of the per-event last-agent times;\n` +
      '    cold start: exec -> first tunnel (the process start is in it: section 6) and first -> all tunnels, per agent; servers see all:\n' +
      '    -> every server counts every agent (median over runs); attempts: connections the balancer accepted per event (all agents)',
    cut:
      `8b. Tunnel cut: ${p.reconnectConnections} tunnelled connections per run (CONNECT over the server's Unix socket -> echo backend), each writing a numbered\n` +
      `    line every 100 ms and checking the echo; the agent's tunnel runs through a relay that resets every connection and refuses new ones\n` +
      `    for ${(p.reconnectCutMs / 1000).toFixed(0)} s. lost: ended before the end of the run; stalled: open but no echo after the restore; bytes (over survivors):\n` +
      '    echo lines missing / duplicated / unreadable; lost at: cut -> its end; tunnel back: restore -> the server counts the agent;\n' +
      '    moved: restore -> first echo; RSS before the cut and the highest while detached (medians over runs); counts summed over runs',
    cost: '8c. Steady-state cost of resume: one CP->node bulk download (MB/s) and sequential dials (CONNECT -> one byte echoed), fresh pairs, runs interleaved; ratio: to resume off (--resume-timeout=0s, or the least the build takes: see the notes)',
  };
  const out: string[] = [];
  for (const table of ['ha', 'cut', 'cost'] as const) {
    const rows = rc.rows.filter((row) => row.table === table);
    if (rows.length > 0) out.push(...renderTable(titles[table], RECONNECT_COLUMNS[table], rows, width));
  }
  return [...out, '', ...rc.notes.map((n) => `  ${n}`)];
}

const DOORS_TABLES: Record<DoorsTable, (p: Record<string, number>) => { title: string; columns: Column[] }> = {
  scrape: (p) => ({
    title:
      `9a. Scrape-like load: ${p.scrapeTargets} targets behind the agent, each scraped once every ${(p.scrapeIntervalMs / 1000).toFixed(1)} s (GET /metrics, a ${(p.scrapeBodyBytes / 1024).toFixed(0)} KiB page,\n` +
      `    keep-alive), ${p.scrapeRounds} intervals timed after a warm-up round; latency: request written -> last body byte; CPU: server + agent\n` +
      '    per scrape; RSS at the end of the window (the rows of one product share one pair: later rows carry what earlier ones left);\n' +
      '    ratios: Kanal forward / Kanal CONNECT on the same listener, and Kanal / upstream CONNECT (pooled percentiles; CPU: pooled)',
    columns: [
      { key: 'p50Ms', title: 'p50 ms', digits: 2 },
      { key: 'p99Ms', title: 'p99 ms', digits: 2 },
      { key: 'p50Spread', title: 'p50 spread', digits: 0, suffix: '%' },
      { key: 'cpuUsPerScrape', title: 'CPU µs/scrape', digits: 0 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 1 },
      { key: 'agentRssMiB', title: 'agent RSS MiB', digits: 1 },
      { key: 'scrapesPerS', title: 'scrapes/s', digits: 0 },
      { key: 'vsConnectP50', title: 'p50 /CONNECT', digits: 2 },
      { key: 'vsConnectCpu', title: 'CPU /CONNECT', digits: 2 },
      { key: 'vsUpstreamP50', title: 'p50 /upstream', digits: 2 },
      { key: 'vsUpstreamP99', title: 'p99 /upstream', digits: 2 },
      { key: 'vsUpstreamCpu', title: 'CPU /upstream', digits: 2 },
      { key: 'proxyConns', title: 'conns to proxy', digits: 0 },
      { key: 'poolConns', title: 'pool conns', digits: 0 },
      { key: 'errors', title: 'errors', digits: 0 },
      { key: 'skipped', title: 'skipped', digits: 0 },
      { key: 'scrapes', title: 'scrapes', digits: 0 },
    ],
  }),
  socks: () => ({
    title:
      '9b. SOCKS5 next to CONNECT: dial -> one byte written and echoed by the backend (sequential and 8 at a time), and one bulk flow;\n' +
      "    Kanal's SOCKS5 door and CONNECT door on one server and agent, runs interleaved, upstream's CONNECT as a reference;\n" +
      '    ratios: to Kanal CONNECT in the same run (goal: within 5%; latency: pooled percentiles, MB/s: median of per-run ratios)',
    columns: [
      { key: 'p50Ms', title: 'p50 ms', digits: 2 },
      { key: 'p99Ms', title: 'p99 ms', digits: 2 },
      { key: 'p50Spread', title: 'p50 spread', digits: 0, suffix: '%' },
      { key: 'dialsPerS', title: 'dials/s', digits: 0 },
      { key: 'cpuUsPerDial', title: 'proxy CPU µs/dial', digits: 0 },
      { key: 'mbps', title: 'MB/s', digits: 0 },
      { key: 'mbpsSpread', title: 'MB/s spread', digits: 0, suffix: '%' },
      { key: 'proxyCpuSPerGB', title: 'proxy CPU s/GB', digits: 2 },
      { key: 'vsConnectP50', title: 'p50 /CONNECT', digits: 2 },
      { key: 'vsConnectP99', title: 'p99 /CONNECT', digits: 2 },
      { key: 'vsConnectRate', title: 'dials/s /CONNECT', digits: 2 },
      { key: 'vsConnectMbps', title: 'MB/s /CONNECT', digits: 2 },
      { key: 'samples', title: 'dials', digits: 0 },
    ],
  }),
};

function renderDoors(d: DoorsReport, p: Record<string, number>): string[] {
  const width = Math.max(...d.rows.map((row) => row.label.length), 30);
  const out: string[] = [];
  for (const table of ['scrape', 'socks'] as const) {
    const rows = d.rows.filter((row) => row.table === table);
    if (rows.length === 0) continue;
    const spec = DOORS_TABLES[table](p);
    out.push(...renderTable(spec.title, spec.columns, rows, width));
  }
  return [...out, '', ...d.notes.map((n) => `  ${n}`)];
}

function renderTenants(t: TenantsReport): string[] {
  const width = Math.max(...t.rows.map((row) => row.label.length), 30);
  const out: string[] = [];
  for (const [table, spec] of Object.entries(TENANTS_TABLES) as [TenantsTable, (typeof TENANTS_TABLES)[TenantsTable]][]) {
    const rows = t.rows.filter((row) => row.table === table);
    if (rows.length > 0) out.push(...renderTable(spec.title, spec.columns, rows, width));
  }
  out.push('', `Tenants goal: at most ${t.goalKiBPerTenant} KiB of server memory per tenant beyond its agents and connections.`);
  return [...out, ...t.notes.map((n) => `  ${n}`)];
}

export function renderText(r: Report): string {
  const m = r.machine;
  const out: string[] = [];
  out.push(
    `kanal bench (${r.mode}) — ${m.nproc} × ${m.cpuModel}, Node ${m.node}, Linux ${m.kernel}, ${m.memTotalGiB} GiB — transport ${r.transport} — ${r.startedAt}`,
  );
  out.push(
    'origin' in r.upstream
      ? `Upstream Konnectivity: ${r.upstream.origin}, proxy-server --mode http-connect on a Unix socket, --v=1.`
      : `Upstream Konnectivity: ${r.upstream.absent}; Kanal is compared with direct connections only.`,
    `Loopback only. Figures are medians of ${r.params.reps} interleaved runs; a ratio is the median of per-run ratios to the baseline measured next to it (latency: ratio of pooled percentiles).`,
    ...(r.kanalCli ? [`Kanal: every pair ran ${r.kanalCli} (--kanal-cli).`] : []),
    ...(r.audit ? ['Kanal: server and agent wrote audit logs to files (--audit).'] : []),
    ...(r.kanalWorkers !== undefined
      ? [`Kanal: the servers ran --workers ${r.kanalWorkers} (--kanal-workers); server CPU and RSS are the primary's and its workers'.`]
      : []),
    `Other processes kept ${r.backgroundCores.toFixed(2)} of ${m.nproc} cores busy on average during the run; load average ${r.loadAvg.start.toFixed(2)} at the start, ${r.loadAvg.end.toFixed(2)} at the end (noise; spread = (max - min) / median of the runs).`,
  );
  const labelWidth = Math.max(...r.rows.map((row) => row.label.length), 30);
  const versus = r.rows.filter((row) => row.section === 'versus');
  if (versus.length > 0) out.push(...renderVersus(versus, labelWidth));
  for (const section of SECTION_ORDER) {
    const rows = r.rows.filter((row) => row.section === section);
    if (rows.length === 0) continue;
    out.push(...renderTable(COLUMNS[section].title, COLUMNS[section].columns, rows, labelWidth));
  }
  if (r.tenants) out.push(...renderTenants(r.tenants));
  if (r.reconnect) out.push(...renderReconnect(r.reconnect, r.params));
  if (r.doors) out.push(...renderDoors(r.doors, r.params));
  if (r.soak) out.push(...renderSoak(r.soak));
  if (r.profile && r.profile.length > 0) {
    for (const p of r.profile) {
      out.push(
        '',
        `CPU profile of the ${p.process} (${p.scenario}; ${p.totalMs.toFixed(0)} ms sampled, ${(p.idleShare * 100).toFixed(0)}% idle); share of busy time:`,
      );
      out.push(`  by area: ${p.areas.map((a) => `${a.name} ${(a.share * 100).toFixed(1)}%`).join(', ')}`);
      for (const f of p.top) out.push(`  ${(f.share * 100).toFixed(1).padStart(5)}%  ${f.name}`);
    }
  }
  if (r.warnings.length > 0) out.push('', 'Warnings:', ...r.warnings.map((w) => `  - ${w}`));
  out.push(
    '',
    "Upload = client -> backend, download = backend -> client. CP->node: client -> CONNECT over the server's Unix socket -> server ->",
    "TLS tunnel -> agent -> backend (Kanal's and upstream's alike); node->CP (Kanal only): client -> agent listener on 127.0.0.2 ->",
    'tunnel -> server -> allow-listed backend. Proxy CPU = server + agent; endpoints CPU = client + backend workers (the direct',
    "baseline pays TLS there, the proxies' endpoints speak plain TCP). All processes share the same cores, so the load",
    'generators compete with the proxies for CPU. Goals: bulk >= 2x upstream at <= 0.5x its CPU per GB; dial p50 and',
    "p99 <= upstream's, dials/s >= upstream's; memory per idle connection and per agent <= upstream's; isolation ratio >= 0.9.",
    ...(r.soak
      ? [
          `Soak goal: RSS growth of each process after the first ${r.soak.every.toLocaleString('en-US')} connections <= ${r.soak.goalMiB} MiB.`,
        ]
      : []),
    'Results and their history: bench/RESULTS.md.',
    `Total bench time ${r.durationS.toFixed(0)} s.`,
  );
  return out.join('\n');
}
