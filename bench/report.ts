/** Result rows, the text table and the JSON document. */
import type { MachineInfo } from './proc.js';
import type { ProfileSummary } from './profile.js';

export type Section = 'throughput' | 'latency' | 'loaded' | 'requests' | 'memory' | 'agents' | 'isolation';

export interface Row {
  /** Stable identifier, e.g. "throughput.cp-node.up.1.kanal". */
  id: string;
  section: Section;
  label: string;
  /** Every figure of the row; see COLUMNS for meaning and units. */
  values: Record<string, number>;
  /** Keys of `values` that may legitimately be zero or negative (memory deltas). */
  signed?: string[];
  /** Label of the row this one is compared with. */
  baseline?: string;
  /** The individual runs behind a median (MB/s or req/s), in run order. */
  runs?: number[];
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
  params: Record<string, number>;
  rows: Row[];
  profile?: ProfileSummary[];
  warnings: string[];
}

interface Column {
  key: string;
  title: string;
  digits: number;
  suffix?: string;
}

/** The dial-latency sections share these. */
const PERCENTILE_COLUMNS: Column[] = [
  { key: 'p50Ms', title: 'p50 ms', digits: 2 },
  { key: 'p99Ms', title: 'p99 ms', digits: 2 },
  { key: 'ratioP50', title: 'p50 ratio', digits: 2 },
  { key: 'ratioP99', title: 'p99 ratio', digits: 2 },
];
const DIALS_COLUMN: Column = { key: 'samples', title: 'dials', digits: 0 };

const COLUMNS: Record<Section, { title: string; columns: Column[] }> = {
  throughput: {
    title: '1. Bulk throughput (one TCP connection per flow; ratio: Kanal / direct TLS measured in the same run)',
    columns: [
      { key: 'mbps', title: 'MB/s', digits: 0 },
      { key: 'gbps', title: 'Gbit/s', digits: 2 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'proxyCpuSPerGB', title: 'Kanal CPU s/GB', digits: 2 },
      { key: 'endpointCpuSPerGB', title: 'endpoints CPU s/GB', digits: 2 },
    ],
  },
  latency: {
    title: '2a. Dial latency: connect (+ CONNECT) -> first byte from the backend',
    columns: [...PERCENTILE_COLUMNS, DIALS_COLUMN],
  },
  loaded: {
    title: '2b. Dial latency while one bulk download runs (Kanal: CP->node, on the same tunnel; direct TCP: next to a direct TLS one)',
    columns: [...PERCENTILE_COLUMNS, { key: 'bulkMbps', title: 'bulk MB/s', digits: 0 }, DIALS_COLUMN],
  },
  requests: {
    title: '2c. Short requests: new connection per HTTP/1.1 GET, Connection: close',
    columns: [
      { key: 'rps', title: 'req/s', digits: 0 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'spread', title: 'spread', digits: 0, suffix: '%' },
      { key: 'requests', title: 'requests', digits: 0 },
    ],
  },
  memory: {
    title: '3a. Memory per idle tunnelled connection (CP -> node, RSS growth / connections)',
    columns: [
      { key: 'connections', title: 'conns', digits: 0 },
      { key: 'serverKiBPerConn', title: 'server KiB/conn', digits: 1 },
      { key: 'agentKiBPerConn', title: 'agent KiB/conn', digits: 1 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 0 },
      { key: 'agentRssMiB', title: 'agent RSS MiB', digits: 0 },
      { key: 'openPerS', title: 'opened/s', digits: 0 },
    ],
  },
  agents: {
    title: '3b. Memory per connected agent (one server, agents from bench helper processes)',
    columns: [
      { key: 'agents', title: 'agents', digits: 0 },
      { key: 'serverKiBPerAgent', title: 'server KiB/agent', digits: 1 },
      { key: 'agentSideKiBPerAgent', title: 'agent side KiB/tunnel', digits: 1 },
      { key: 'serverRssMiB', title: 'server RSS MiB', digits: 0 },
      { key: 'connectPerS', title: 'connected/s', digits: 0 },
    ],
  },
  isolation: {
    title: '4. Isolation: one connection\'s throughput while another on the same tunnel has a stalled reader (goal >= 0.90)',
    columns: [
      { key: 'aloneMbps', title: 'alone MB/s', digits: 0 },
      { key: 'stalledMbps', title: 'w/ stall MB/s', digits: 0 },
      { key: 'ratio', title: 'ratio', digits: 2 },
      { key: 'serverGrowthMiB', title: 'server +MiB', digits: 1 },
      { key: 'agentGrowthMiB', title: 'agent +MiB', digits: 1 },
    ],
  },
};

export const SECTION_ORDER: Section[] = ['throughput', 'latency', 'loaded', 'requests', 'memory', 'agents', 'isolation'];

function fmt(v: number | undefined, c: Column): string {
  if (v === undefined || !Number.isFinite(v)) return '—';
  const x = c.suffix === '%' ? v * 100 : v;
  return `${x.toFixed(c.digits)}${c.suffix ?? ''}`;
}

export function renderText(r: Report): string {
  const m = r.machine;
  const out: string[] = [];
  out.push(
    `kanal bench (${r.mode}) — ${m.nproc} × ${m.cpuModel}, Node ${m.node}, Linux ${m.kernel}, ${m.memTotalGiB} GiB — transport ${r.transport} — ${r.startedAt}`,
  );
  out.push(
    `Loopback only. Figures are medians of ${r.params.reps} interleaved runs; a ratio is the median of per-run ratios to the baseline measured next to it (latency: ratio of pooled percentiles).`,
    `Other processes kept ${r.backgroundCores.toFixed(2)} of ${m.nproc} cores busy on average during the run (noise; spread = (max - min) / median of the runs).`,
  );
  const labelWidth = Math.max(...r.rows.map((row) => row.label.length), 30);
  for (const section of SECTION_ORDER) {
    const rows = r.rows.filter((row) => row.section === section);
    if (rows.length === 0) continue;
    const spec = COLUMNS[section];
    const widths = spec.columns.map((c) => Math.max(c.title.length, ...rows.map((row) => fmt(row.values[c.key], c).length)));
    out.push('', spec.title);
    out.push(`  ${''.padEnd(labelWidth)}  ${spec.columns.map((c, i) => c.title.padStart(widths[i]!)).join('  ')}${rows.some((x) => x.baseline) ? '  baseline' : ''}`);
    for (const row of rows) {
      const cells = spec.columns.map((c, i) => fmt(row.values[c.key], c).padStart(widths[i]!)).join('  ');
      out.push(`  ${row.label.padEnd(labelWidth)}  ${cells}${row.baseline ? `  ${row.baseline}` : ''}`);
    }
  }
  if (r.profile && r.profile.length > 0) {
    for (const p of r.profile) {
      out.push('', `CPU profile of the ${p.process} (${p.scenario}; ${p.totalMs.toFixed(0)} ms sampled, ${(p.idleShare * 100).toFixed(0)}% idle); share of busy time:`);
      out.push(`  by area: ${p.areas.map((a) => `${a.name} ${(a.share * 100).toFixed(1)}%`).join(', ')}`);
      for (const f of p.top) out.push(`  ${(f.share * 100).toFixed(1).padStart(5)}%  ${f.name}`);
    }
  }
  if (r.warnings.length > 0) out.push('', 'Warnings:', ...r.warnings.map((w) => `  - ${w}`));
  out.push(
    '',
    'Reference (issue 5, same class of machine, 2 cores, loopback): upstream Konnectivity v0.31 (Go), HTTP CONNECT over UDS,',
    'TLS tunnel, iperf3: ≈ 2.2 Gbit/s client->backend and ≈ 2.7 Gbit/s backend->client (≈ 275-340 MB/s), ≈ 0.65 core per Gbit/s',
    '(≈ 5.2 CPU s/GB). Goal: ≥ 2× upstream, i.e. ≥ 4.5 Gbit/s ≈ 560 MB/s end to end in both directions; isolation ratio ≥ 0.9;',
    'p99 dial latency no worse than upstream. One gRPC hop in Node over TLS: grpc-js ≈ 455 MB/s, node:http2 + hand codec ≈ 1.3 GB/s.',
    'Upload = client -> backend, download = backend -> client. CP->node: client -> CONNECT over the server\'s Unix socket -> server ->',
    'TLS tunnel -> agent -> backend; node->CP: client -> agent listener on 127.0.0.2 -> tunnel -> server -> allow-listed backend.',
    'Kanal CPU = server + agent; endpoints CPU = client + backend workers (the direct baseline pays TLS there, Kanal\'s endpoints',
    'speak plain TCP). All processes share the same cores, so the load generators compete with Kanal for CPU.',
    `Total bench time ${r.durationS.toFixed(0)} s.`,
  );
  return out.join('\n');
}
