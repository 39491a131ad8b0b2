/**
 * Section 0: Kanal next to upstream Konnectivity, one line per figure, taken
 * from the rows of the other sections (both measured in the same run,
 * interleaved). The ratio is always Kanal / upstream; `better` says which
 * way is good. Node -> control plane lines are Kanal's only: upstream has no
 * such direction.
 */
import type { Row } from './report.js';

interface Source {
  row: string;
  key: string;
  /** Key of the same row holding the spread of the runs behind `key`. */
  spread?: string;
}

interface Line {
  id: string;
  label: string;
  unit: string;
  digits: number;
  better: 'higher' | 'lower';
  kanal: Source;
  /** Absent for the node -> control plane lines (Kanal only). */
  upstream?: Source;
  /** Key of Kanal's row holding the median of per-run Kanal / upstream ratios; else the quotient of the two figures. */
  ratio?: string;
  /** Memory growth may be zero or negative (RSS is paged in and out in steps). */
  signed?: boolean;
}

function bulkLines(): Line[] {
  const lines: Line[] = [];
  for (const mode of ['up', 'down'] as const) {
    for (const flows of [1, 8]) {
      const what = `bulk ${mode === 'up' ? 'upload' : 'download'}, ${flows} flow${flows > 1 ? 's' : ''}`;
      const kanal = `throughput.cp-node.${mode}.${flows}`;
      const upstream = `throughput.upstream-cp-node.${mode}.${flows}`;
      lines.push(
        {
          id: `bulk.${mode}.${flows}`,
          label: what,
          unit: 'MB/s',
          digits: 0,
          better: 'higher',
          kanal: { row: kanal, key: 'mbps', spread: 'spread' },
          upstream: { row: upstream, key: 'mbps', spread: 'spread' },
          ratio: 'vsUpstream',
        },
        {
          id: `cpu.${mode}.${flows}`,
          label: `  CPU, server + agent`,
          unit: 's/GB',
          digits: 2,
          better: 'lower',
          kanal: { row: kanal, key: 'proxyCpuSPerGB', spread: 'proxyCpuSpread' },
          upstream: { row: upstream, key: 'proxyCpuSPerGB', spread: 'proxyCpuSpread' },
          ratio: 'cpuVsUpstream',
        },
      );
    }
  }
  return lines;
}

function dialLines(kanal: string, upstream: string, what: string): Line[] {
  return (['50', '99'] as const).map((p) => ({
    id: `${kanal}.p${p}`,
    label: `${what} p${p}`,
    unit: 'ms',
    digits: 2,
    better: 'lower' as const,
    kanal: { row: kanal, key: `p${p}Ms`, spread: `p${p}Spread` },
    upstream: { row: upstream, key: `p${p}Ms`, spread: `p${p}Spread` },
    ratio: `vsUpstreamP${p}`,
  }));
}

function rateLine(kanal: string, upstream: string, label: string): Line {
  return {
    id: `${kanal}.rate`,
    label,
    unit: 'dials/s',
    digits: 0,
    better: 'higher',
    kanal: { row: kanal, key: 'dialsPerS', spread: 'rateSpread' },
    upstream: { row: upstream, key: 'dialsPerS', spread: 'rateSpread' },
    ratio: 'vsUpstreamRate',
  };
}

function cpuPerDialLine(kanal: string, upstream: string, label: string): Line {
  return {
    id: `${kanal}.cpu`,
    label,
    unit: 'µs',
    digits: 0,
    better: 'lower',
    kanal: { row: kanal, key: 'cpuUsPerDial' },
    upstream: { row: upstream, key: 'cpuUsPerDial' },
    ratio: 'vsUpstreamCpu',
  };
}

function requestLine(kanalKey: string, upstreamKey: string, c: string, label: string): Line {
  const kanal = `requests.${kanalKey}.${c}`;
  return {
    id: kanal,
    label,
    unit: 'req/s',
    digits: 0,
    better: 'higher',
    kanal: { row: kanal, key: 'rps', spread: 'spread' },
    upstream: { row: `requests.${upstreamKey}.${c}`, key: 'rps', spread: 'spread' },
    ratio: 'vsUpstream',
  };
}

function memoryLine(id: string, label: string, unit: string, row: string, key: string, ratio?: string): Line {
  return {
    id,
    label,
    unit,
    digits: 1,
    better: 'lower',
    kanal: { row, key },
    upstream: { row: `${row}.upstream`, key },
    ratio,
    signed: true,
  };
}

const LINES: Line[] = [
  ...bulkLines(),
  ...dialLines('latency.cp-node', 'latency.upstream-cp-node', 'dial -> byte echoed, sequential,'),
  ...dialLines('latency.cp-node.c8', 'latency.upstream-cp-node.c8', 'dial -> byte echoed, 8 at a time,'),
  rateLine('latency.cp-node', 'latency.upstream-cp-node', 'dials per second, sequential'),
  rateLine('latency.cp-node.c8', 'latency.upstream-cp-node.c8', 'dials per second, 8 at a time'),
  cpuPerDialLine('latency.cp-node', 'latency.upstream-cp-node', 'CPU per dial, server + agent, sequential'),
  cpuPerDialLine('latency.cp-node.c8', 'latency.upstream-cp-node.c8', 'CPU per dial, server + agent, 8 at a time'),
  ...dialLines('latency.cp-node.cold', 'latency.upstream-cp-node.cold', 'first dials after start,'),
  cpuPerDialLine('latency.cp-node.cold', 'latency.upstream-cp-node.cold', 'CPU per dial, first dials after start'),
  ...dialLines('latency.cp-node-tls', 'latency.upstream-cp-node-tls', 'dial + TLS inside, sequential,'),
  ...dialLines('loaded.cp-node', 'loaded.upstream-cp-node', 'dial next to a bulk download,'),
  requestLine('cp-node', 'upstream-cp-node', 'c1', 'short requests, sequential'),
  requestLine('cp-node', 'upstream-cp-node', 'c16', 'short requests, 16 at a time'),
  requestLine('cp-node-tls', 'upstream-cp-node-tls', 'c1', 'short requests, TLS inside, sequential'),
  requestLine('cp-node-tls', 'upstream-cp-node-tls', 'c16', 'short requests, TLS inside, 16 at a time'),
  memoryLine(
    'memory.server',
    'server memory per idle connection',
    'KiB',
    'memory.idle-connections',
    'serverKiBPerConn',
    'serverKiBPerConnVsUpstream',
  ),
  memoryLine(
    'memory.agent',
    'agent memory per idle connection',
    'KiB',
    'memory.idle-connections',
    'agentKiBPerConn',
    'agentKiBPerConnVsUpstream',
  ),
  memoryLine('memory.server-start', 'server RSS at start', 'MiB', 'memory.idle-connections', 'serverStartRssMiB'),
  memoryLine('memory.agent-start', 'agent RSS at start', 'MiB', 'memory.idle-connections', 'agentStartRssMiB'),
  ...(
    [
      ['serverReadyMs', 'server start, exec -> ready', 'ms', 0],
      ['agentReadyMs', 'agent start, exec -> tunnel up', 'ms', 0],
      ['serverCpuMs', 'server CPU to ready', 'ms', 0],
      ['agentCpuMs', 'agent CPU to tunnel up', 'ms', 0],
      ['serverAnonMiB', 'server anonymous RSS when ready', 'MiB', 1],
      ['agentAnonMiB', 'agent anonymous RSS when ready', 'MiB', 1],
    ] as const
  ).map(([key, label, unit, digits]): Line => ({
    // CPU to ready comes in /proc's 10 ms ticks: `.cpu` marks a line whose upstream figure may be 0.
    id: key.endsWith('CpuMs') ? `start.${key.slice(0, -'CpuMs'.length)}.cpu` : `start.${key}`,
    label,
    unit,
    digits,
    better: 'lower',
    kanal: { row: 'start.pair', key, spread: `${key}Spread` },
    upstream: { row: 'start.pair.upstream', key, spread: `${key}Spread` },
    ratio: `${key}VsUpstream`,
  })),
  memoryLine(
    'agents.server',
    'server memory per connected agent',
    'KiB',
    'agents.per-agent',
    'serverKiBPerAgent',
    'serverKiBPerAgentVsUpstream',
  ),
  ...(['stalled-client', 'stalled-backend'] as const).map((key): Line => ({
    id: `isolation.${key}`,
    label: `throughput next to a ${key === 'stalled-client' ? 'stalled client' : 'stalled backend'} / alone`,
    unit: 'ratio',
    digits: 2,
    better: 'higher',
    kanal: { row: `isolation.${key}`, key: 'ratio' },
    upstream: { row: `isolation.${key}.upstream`, key: 'ratio' },
    // Zero when the other connection could not move a byte (upstream blocks the whole tunnel).
    signed: true,
  })),
  // Kanal only: upstream has no node -> control plane direction.
  ...(['up', 'down'] as const).flatMap((mode) =>
    [1, 8].map((flows): Line => ({
      id: `node-cp.bulk.${mode}.${flows}`,
      label: `node->CP bulk ${mode === 'up' ? 'upload' : 'download'}, ${flows} flow${flows > 1 ? 's' : ''}`,
      unit: 'MB/s',
      digits: 0,
      better: 'higher',
      kanal: { row: `throughput.node-cp.${mode}.${flows}`, key: 'mbps', spread: 'spread' },
    })),
  ),
  ...(['50', '99'] as const).map((p): Line => ({
    id: `node-cp.dial.p${p}`,
    label: `node->CP dial -> byte echoed p${p}`,
    unit: 'ms',
    digits: 2,
    better: 'lower',
    kanal: { row: 'latency.node-cp', key: `p${p}Ms`, spread: `p${p}Spread` },
  })),
  {
    id: 'node-cp.requests.c1',
    label: 'node->CP short requests, sequential',
    unit: 'req/s',
    digits: 0,
    better: 'higher',
    kanal: { row: 'requests.node-cp.c1', key: 'rps', spread: 'spread' },
  },
];

/**
 * The side-by-side rows for the figures present in `rows` (e.g. only some
 * sections ran); none when upstream did not run.
 */
export function sideBySide(rows: Row[], upstreamRan: boolean): Row[] {
  if (!upstreamRan) return [];
  const byId = new Map(rows.map((r) => [r.id, r]));
  const out: Row[] = [];
  for (const line of LINES) {
    const k = byId.get(line.kanal.row);
    const u = line.upstream && byId.get(line.upstream.row);
    if (!k || (line.upstream && !u)) continue;
    const values: Record<string, number> = { kanal: k.values[line.kanal.key] };
    if (line.kanal.spread) values.kanalSpread = k.values[line.kanal.spread]!;
    if (u && line.upstream) {
      values.upstream = u.values[line.upstream.key]!;
      if (line.upstream.spread) values.upstreamSpread = u.values[line.upstream.spread]!;
      values.ratio = line.ratio ? k.values[line.ratio] : values.kanal / values.upstream;
    }
    out.push({
      id: `versus.${line.id}`,
      section: 'versus',
      label: line.label,
      values,
      signed: line.signed ? Object.keys(values) : ['kanalSpread', 'upstreamSpread'],
      unit: line.unit,
      digits: line.digits,
      better: line.better,
      kanalOnly: !line.upstream,
    });
  }
  return out;
}
