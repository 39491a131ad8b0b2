/** Summarises a V8 .cpuprofile (node --cpu-prof): self time by function and by area. */
import fs from 'node:fs';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
}

interface ProfileNode {
  id: number;
  callFrame: CallFrame;
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

export interface ProfileSummary {
  process: string;
  scenario: string;
  totalMs: number;
  idleShare: number;
  /** Shares are of busy (non-idle) time. */
  areas: { name: string; share: number }[];
  top: { name: string; share: number; selfMs: number }[];
}

function shortUrl(url: string): string {
  if (!url) return '';
  const nm = url.lastIndexOf('node_modules/');
  if (nm >= 0) return url.slice(nm + 'node_modules/'.length);
  const d = url.indexOf('/dist/');
  if (d >= 0) return url.slice(d + '/dist/'.length);
  return url.replace(/^file:\/\//, '');
}

/** Coarse attribution of a frame, to see where the bytes' CPU goes. */
function areaOf(f: CallFrame): string {
  const { url, functionName } = f;
  if (functionName === '(garbage collector)') return 'GC';
  if (functionName === '(program)') return 'native/(program)';
  if (!url) return functionName.startsWith('(') ? functionName : 'native builtins';
  if (url.includes('node_modules/@grpc/grpc-js')) return 'grpc-js';
  if (url.includes('node_modules/protobufjs')) return 'protobufjs';
  if (url.includes('node_modules/')) return `dep:${url.slice(url.lastIndexOf('node_modules/') + 13).split('/')[0]}`;
  const src = /\/dist\/src\/([^/]+)\//.exec(url);
  if (src) return `kanal ${src[1]}`;
  if (url.startsWith('node:')) {
    const mod = url.slice(5);
    if (mod.includes('streams')) return 'node streams';
    if (mod.includes('http2')) return 'node http2';
    if (mod.includes('tls') || mod.includes('crypto')) return 'node tls';
    if (mod.includes('net') || mod.includes('stream_base')) return 'node net';
    if (mod.includes('timers') || mod.includes('process/task_queues')) return 'node event loop';
    return 'node other';
  }
  return 'other';
}

/**
 * `windowUs` ([from, to] on CLOCK_MONOTONIC in microseconds, the clock of
 * V8's sample timestamps and of process.hrtime) keeps only the samples
 * taken while the measured traffic flowed, leaving out start-up.
 */
export function summariseProfile(
  file: string,
  processName: string,
  scenario: string,
  windowUs?: [number, number],
  topN = 12,
): ProfileSummary {
  const prof = JSON.parse(fs.readFileSync(file, 'utf8')) as CpuProfile;
  const byId = new Map<number, ProfileNode>();
  for (const n of prof.nodes) byId.set(n.id, n);
  const collect = (window: [number, number] | undefined): Map<number, number> => {
    const self = new Map<number, number>();
    let t = prof.startTime;
    // timeDeltas[i] is the time before sample i; the time after a sample belongs to it.
    for (let i = 0; i < prof.samples.length; i++) {
      t += prof.timeDeltas[i] ?? 0;
      if (window && (t < window[0] || t > window[1])) continue;
      const dt = prof.timeDeltas[i + 1] ?? 0;
      const id = prof.samples[i];
      self.set(id, (self.get(id) ?? 0) + Math.max(0, dt));
    }
    return self;
  };
  let selfUs = collect(windowUs);
  let note = windowUs ? '' : ', whole process life';
  if (selfUs.size === 0) {
    selfUs = collect(undefined);
    note = ', whole process life: no sample fell in the measurement window';
  }
  let total = 0;
  let idle = 0;
  const fns = new Map<string, number>();
  const areas = new Map<string, number>();
  for (const [id, us] of selfUs) {
    const f = byId.get(id)!.callFrame;
    total += us;
    if (f.functionName === '(idle)') {
      idle += us;
      continue;
    }
    const where = shortUrl(f.url);
    const name = `${f.functionName || '(anonymous)'}${where ? `  ${where}:${f.lineNumber + 1}` : ''}`;
    fns.set(name, (fns.get(name) ?? 0) + us);
    const area = areaOf(f);
    areas.set(area, (areas.get(area) ?? 0) + us);
  }
  const busy = Math.max(1, total - idle);
  return {
    process: processName,
    scenario: `${scenario}${note}`,
    totalMs: total / 1000,
    idleShare: total > 0 ? idle / total : 0,
    areas: [...areas].sort((a, b) => b[1] - a[1]).map(([name, us]) => ({ name, share: us / busy })),
    top: [...fns]
      .sort((a, b) => b[1] - a[1])
      .slice(0, topN)
      .map(([name, us]) => ({ name, share: us / busy, selfMs: us / 1000 })),
  };
}
